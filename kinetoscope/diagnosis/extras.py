"""The verdict lines of the seed problems that lead the straggler verdict (docs/diagnosis.md
section 11): a pipeline's bubble and imbalance (``pipeline_line``) and ranks that ran out of
data first (``uneven_lines``), each read from its part's JSON form."""

from __future__ import annotations

from typing import Any


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.0f}%"


def _ranks(ranks: list[int]) -> str:
    return f"rank{'s' if len(ranks) != 1 else ''} {', '.join(map(str, ranks))}"


def pipeline_line(pipe: dict[str, Any]) -> str:
    """One line: schedule and shape, the bubble (measured vs the schedule's), the slowest stage
    and the balanced what-if (docs/diagnosis.md section 11.1)."""
    shape = f"{pipe.get('num_stages')} stages"
    if (pipe.get("replicas") or 1) > 1:
        shape += f" x {pipe['replicas']} replicas"
    if pipe.get("microbatches"):
        shape += f", {pipe['microbatches']} micro-batches"
    expected = pipe.get("expected_bubble_fraction")
    bubble = f"bubble {_pct(pipe.get('bubble_fraction'))} of the step" + (
        f" (the schedule's own: {_pct(expected)})" if expected is not None else ""
    )
    imb = pipe.get("imbalance") or {}
    slow = ""
    rep = pipe.get("replica_issue")
    if rep and rep.get("ranks"):
        worst = max(rep.get("per_rank") or [{}], key=lambda x: x.get("excess_fraction", 0.0))
        stages = sorted({x["stage"] for x in rep.get("per_rank") or []})
        slow = (
            f"; {_ranks(rep['ranks'])} (stage{'s' if len(stages) != 1 else ''} {', '.join(map(str, stages))}) "
            f"compute up to {_pct(worst.get('excess_fraction'))} more than the other replicas of their stage: "
            "a slow worker, not stage imbalance (stages by their median replica: slowest "
            f"{imb.get('slowest_stage')}, {_pct(imb.get('excess_fraction'))} above the mean)"
        )
    elif imb.get("slowest_stage") is not None:
        slow = (
            f"; slowest stage {imb['slowest_stage']} ({_ranks(imb.get('slowest_ranks') or [])}) computes "
            f"{_pct(imb.get('excess_fraction'))} above the mean stage; balanced: {pipe.get('step_time_ms', 0):.1f} -> "
            f"{imb.get('est_step_time_balanced_ms', 0):.1f} ms per step"
        )
    return (
        f"PIPELINE-PARALLEL ({pipe.get('schedule') or 'schedule not recognised'}, {shape}): {bubble}{slow}."
    )


def uneven_lines(uneven: dict[str, Any]) -> list[str]:
    """Two lines: which ranks ran out of data and what the others did meanwhile, then the fix
    (docs/diagnosis.md section 11.2)."""
    steps = uneven.get("steps_per_rank") or {}
    short = uneven.get("short_ranks") or []
    ran = ", ".join(f"rank {r}: {n}" for r, n in steps.items())
    waiting = uneven.get("waiting_ranks") or []
    wait = f"; {_ranks(waiting)} waited for them" if waiting else ""
    first = (
        f"UNEVEN INPUTS ({uneven.get('mode')}): {_ranks(short)} ran out of data first (steps per rank: {ran})"
        f"{wait}; {_pct(uneven.get('lost_fraction'))} of the time lost."
    )
    return [
        first,
        "Give every rank the same number of batches (DistributedSampler(drop_last=True)) or wrap the "
        "loop in torch.distributed.algorithms.Join.",
    ]
