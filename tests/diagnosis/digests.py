"""The map/reduce path of the diagnosis in one process: a job's traces reduced to pickled
``DigestTrace``s (metadata + ``RankFigures``, no events: what ``kscope analyze``'s map tasks
send to the driver) must be diagnosed exactly as the full traces."""

from __future__ import annotations

import math
import pickle
from typing import Any

from kinetoscope.diagnosis import Diagnosis, diagnose
from kinetoscope.diagnosis.extract import DigestTrace, digest_trace
from kinetoscope.trace import load_traces


def digests_of(d: Diagnosis) -> list[DigestTrace]:
    """The digests of the files ``d`` diagnosed, through pickle (as a map task returns them).
    Loaded again: ``diagnose`` gives unranked traces their ranks in place, and a map task
    digests a trace before any assembly."""
    fresh = load_traces([t.meta.path for t in d.job.traces.values()])
    out = [pickle.loads(pickle.dumps(digest_trace(t))) for t in fresh]
    assert all(x.events.is_empty() for x in out)
    return out


def close(a: Any, b: Any, rel: float = 1e-9) -> bool:
    """``a == b``, floats within ``rel``: Polars sums a group's floats in a thread-dependent
    order, so a straggler score may differ in its last bit between two runs on the same traces."""
    if isinstance(a, float) and isinstance(b, float):
        return math.isclose(a, b, rel_tol=rel, abs_tol=1e-12)
    if isinstance(a, dict) and isinstance(b, dict):
        return list(a) == list(b) and all(close(a[k], b[k], rel) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(close(x, y, rel) for x, y in zip(a, b, strict=True))
    return bool(a == b)


def assert_digests_diagnose_alike(d: Diagnosis, *keys: str) -> dict[str, Any]:
    """``diagnose`` of ``d``'s digests gives ``d``'s document (``close``); each of ``keys``
    (computed in Python from the ranks' figures) is not null and exactly the same."""
    full = d.to_dict()
    for key in keys:
        assert full[key], f"{key} is empty on the full traces: the check would prove nothing"
    again = diagnose(digests_of(d))
    got = again.to_dict()
    assert list(got) == list(full)
    for key in keys:
        assert got[key] == full[key], f"diagnosis key {key!r} differs on digests"
    for key, value in full.items():
        assert close(got[key], value), f"diagnosis key {key!r} differs on digests"
    for name in ("pipeline", "uneven_inputs", "recompilation", "collective_bandwidth"):
        assert close(getattr(again, name), getattr(d, name)), f"{name} differs on digests"
    return full
