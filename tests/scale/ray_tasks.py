"""Task functions for the Ray cluster tests, importable by the cluster's workers (the nodes run
with this checkout on ``PYTHONPATH``): each leaves one file per call in a folder, named
``<call>-<node id>``, so a test sees how often and where a task ran, across nodes and crashes."""

from __future__ import annotations

import os
from pathlib import Path


def _record(folder: str) -> int:
    """Count this call (the number of calls before it) and leave its file."""
    import ray

    calls = len(os.listdir(folder))
    (Path(folder) / f"{calls}-{ray.get_runtime_context().get_node_id()}").touch()
    return calls


def crash_first(arg: tuple[str, int]) -> str:
    """Kill its own worker process (as an OOM kill or a lost node would) on the first ``n``
    calls, then return the node it ran on. One task per folder: calls are counted by files."""
    folder, n = arg
    if _record(folder) < n:
        os._exit(3)
    import ray

    return str(ray.get_runtime_context().get_node_id())


def fail(folder: str) -> str:
    """An error of the function itself: Ray and kinetoscope must not rerun it."""
    _record(folder)
    raise ValueError(f"a bad input ({folder})")


def node_of(_: object = None) -> str:
    """The node this task ran on (the fixture's probe that the scheduler sees a node)."""
    import ray

    return str(ray.get_runtime_context().get_node_id())
