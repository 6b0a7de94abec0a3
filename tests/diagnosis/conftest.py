"""Real 4-rank DDP runs (gloo, CPU) traced through the kscope daemon, once per test session.

``collect_traces`` (``daemon_runs.py``) is what production does: a private ``kscope daemon``,
``kinetoscope.demo.train_ddp`` under torchrun with ``KINETO_USE_DAEMON=1`` (no profiler code in
the script), an iteration-based trace of the job by job id through the daemon's RPC, and the
ground truth of the traced iterations from the job's own progress files.

Set ``KSCOPE_DDP_RUNS_DIR=/some/dir`` to keep the runs (traces, manifests, logs, ``truth.json``)
for inspection.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from daemon_runs import SCENARIOS, TracedRun, collect_traces


@pytest.fixture(scope="session")
def ddp_runs(tmp_path_factory):
    """``ddp_runs(name) -> TracedRun``: ``name`` in ``SCENARIOS``; each scenario runs once per session."""
    pytest.importorskip("torch")
    cache: dict[str, TracedRun] = {}
    keep = os.environ.get("KSCOPE_DDP_RUNS_DIR")
    base = Path(keep) if keep else tmp_path_factory.mktemp("ddp_runs")

    def get(name: str) -> TracedRun:
        if name not in cache:
            d = base / name
            if d.exists():
                shutil.rmtree(d)
            cache[name] = collect_traces(d, SCENARIOS[name])
        return cache[name]

    return get
