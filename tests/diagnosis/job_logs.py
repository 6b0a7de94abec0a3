"""Small shared pieces of the real-job and hand-built replay tests.

``slept_ranks``: the ranks a kept job's own step log (``rank-<R>.steps.jsonl``, written by
``benchmarks/diag_scenarios``) says slept in some step: the injection, read independently of
the product. ``one_step_info``: the ``JobInfo`` of a hand-built two-lane, one-step replay job
(two collectives, then each lane's step end).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from kinetoscope.diagnosis.whatif.build import JobInfo


def slept_ranks(folder: Path) -> list[int]:
    """Ranks whose step log has ``straggle_ms`` > 0 in some step, ascending."""
    out = []
    for f in sorted(folder.glob("rank-*.steps.jsonl")):
        rows = [json.loads(line) for line in f.read_text().splitlines()]
        if any(r["straggle_ms"] > 0 for r in rows):
            out.append(int(f.name.split("-")[1].split(".")[0]))
    return sorted(out)


def one_step_info(step_time: float) -> JobInfo:
    """Two lanes ``a`` and ``b``, syncs 0 and 1 shared, 2 and 3 their step ends."""
    return JobInfo(
        2,
        1,
        False,
        ("compute", "step-end"),
        np.array([0, 0, 1, 1]),
        np.array([False, False, True, True]),
        ("a", "b"),
        np.zeros(2, dtype=np.int64),
        np.array([step_time]),
    )
