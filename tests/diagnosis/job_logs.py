"""Small shared pieces of the real-job and hand-built replay tests.

``injected_stalls`` / ``stall_steps`` / ``slept_ranks``: in how many steps a rank slept (in
which of some steps), and which ranks slept at all, by a kept job's own step log (``rank-<R>.steps.jsonl``, written by
``benchmarks/diag_scenarios``): the injection, read independently of the product. ``one_step_info``: the ``JobInfo`` of a hand-built two-lane, one-step replay job
(two collectives, then each lane's step end).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from kinetoscope.diagnosis.whatif.build import JobInfo


def injected_stalls(folder: Path, rank: int) -> int:
    """Steps in which rank ``rank``'s step log says it slept (``straggle_ms`` > 0)."""
    lines = (folder / f"rank-{rank}.steps.jsonl").read_text().splitlines()
    return sum(1 for line in lines if json.loads(line)["straggle_ms"] > 0)


def stall_steps(folder: Path, rank: int, steps: Iterable[int]) -> list[int]:
    """The job steps among ``steps`` in which rank ``rank``'s step log says it slept."""
    wanted = set(steps)
    lines = (folder / f"rank-{rank}.steps.jsonl").read_text().splitlines()
    return [r["step"] for r in map(json.loads, lines) if r["straggle_ms"] > 0 and r["step"] in wanted]


def slept_ranks(folder: Path) -> list[int]:
    """Ranks whose step log has ``straggle_ms`` > 0 in some step, ascending."""
    ranks = sorted(int(f.name.split("-")[1].split(".")[0]) for f in folder.glob("rank-*.steps.jsonl"))
    return [r for r in ranks if injected_stalls(folder, r) > 0]


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
