"""The map/reduce path of the diagnosis in one process: a job's traces reduced to pickled
``DigestTrace``s (metadata + ``RankFigures``, no events: what ``kscope analyze``'s map tasks
send to the driver) must be diagnosed exactly as the full traces."""

from __future__ import annotations

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


def assert_digests_diagnose_alike(d: Diagnosis, *keys: str) -> dict[str, Any]:
    """``diagnose`` of ``d``'s digests gives ``d``'s document; each of ``keys`` is not null."""
    full = d.to_dict()
    for key in keys:
        assert full[key], f"{key} is empty on the full traces: the check would prove nothing"
    again = diagnose(digests_of(d))
    got = again.to_dict()
    assert list(got) == list(full)
    for key, value in full.items():
        assert got[key] == value, f"diagnosis key {key!r} differs on digests"
    assert again.extra == d.extra
    return full
