"""Uneven inputs: ranks that run different numbers of steps or collectives (seed 004, DDP Join).

When one rank's data runs out first, a DDP job either hangs or, under
``torch.distributed.algorithms.Join``, keeps going with that rank *shadowing* the others'
collectives. Both leave marks in the traces (aligned clock, per rank):

``join`` (the short ranks shadow)
    a rank's last step ends at least one median step before another rank's, its trace goes on,
    and it still enters collectives after another rank has run a whole step past its last one:
    it ran out of data and only echoes the others' all-reduces (Join's shadow all-reduces).
    ``idle_ms``: its time from its last step's end to the last step end of the job.
``unmatched`` (the job hangs)
    some ranks hold more instances of a collective type *of one process group* than the group's
    other members (``group``), and their extra instance
    is their last one and lasts at least ``HANG_FACTOR`` times that type's median (and 100 ms):
    they wait in a collective the short ranks never enter, until the process group times out.
    (Point-to-point ``sendrecv`` is left out: its counts differ between ranks by design.)

A trace window that merely starts or ends earlier on one rank shows neither: cut inside its
next step, its rank holds that step's collectives at most, entered before the others end that
step; the others' edge collectives are not blocked.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import polars as pl

from kinetoscope.diagnosis.assembly import Job
from kinetoscope.diagnosis.extract import figures_of

HANG_FACTOR = 10.0
HANG_MIN_NS = 100_000_000


@dataclass
class UnevenReport:
    """The ``uneven_inputs`` key (``to_dict``); ``None`` stands for "every rank ran alike"."""

    mode: str
    short_ranks: list[int]
    waiting_ranks: list[int]
    steps_per_rank: dict[int, int]
    collectives_per_rank: dict[int, int]
    shadow_collectives: dict[int, int]
    idle_ms: dict[int, float]
    lost_fraction: float
    unmatched: dict[str, Any] | None

    def to_dict(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "short_ranks": self.short_ranks,
            "waiting_ranks": self.waiting_ranks,
            "steps_per_rank": {str(r): n for r, n in sorted(self.steps_per_rank.items())},
            "collectives_per_rank": {str(r): n for r, n in sorted(self.collectives_per_rank.items())},
            "shadow_collectives": {str(r): n for r, n in sorted(self.shadow_collectives.items())},
            "idle_ms": {str(r): round(v, 3) for r, v in sorted(self.idle_ms.items())},
            "lost_fraction": round(self.lost_fraction, 4),
            "unmatched_collective": self.unmatched,
        }


def _aligned(colls: dict[int, pl.DataFrame], offsets: dict[int, int]) -> dict[int, pl.DataFrame]:
    return {
        r: c.with_columns(pl.col("arrival") + int(offsets.get(r, 0)), pl.col("end") + int(offsets.get(r, 0)))
        for r, c in colls.items()
    }


def _join_mode(
    steps: pl.DataFrame, colls: dict[int, pl.DataFrame], spans: dict[int, int]
) -> UnevenReport | None:
    per = steps.group_by("rank").agg(
        pl.len().alias("n"),
        pl.col("end").max().alias("last_end"),
        (pl.col("end") - pl.col("start")).median().alias("d"),
    )
    counts = dict(zip(per["rank"].to_list(), per["n"].to_list(), strict=True))
    last = dict(zip(per["rank"].to_list(), per["last_end"].to_list(), strict=True))
    period = float(per["d"].median() or 0.0)  # type: ignore[arg-type]
    job_last = max(last.values())
    short: dict[int, int] = {}
    for r, end in last.items():
        if job_last - end < period or spans.get(r, end) <= end:
            continue
        # r went on echoing collectives after another rank had run a whole step past r's last
        # one: a window cut inside r's next step holds that step's collectives only, which
        # r enters before the others end that step
        later = steps.filter((pl.col("rank") != r) & (pl.col("start") >= end))
        c = colls.get(r)
        if later.is_empty() or c is None or c.is_empty():
            continue
        after = c.filter(pl.col("arrival") > end)
        if after.filter(pl.col("arrival") > later["end"].min()).height:
            short[r] = after.height
    if not short:
        return None
    idle = {r: (job_last - last[r]) / 1e6 for r in short}
    total = sum((job_last - float(steps.filter(pl.col("rank") == r)["start"].min())) for r in counts)  # type: ignore[arg-type]
    return UnevenReport(
        mode="join",
        short_ranks=sorted(short),
        waiting_ranks=[],
        steps_per_rank=counts,
        collectives_per_rank={r: c.height for r, c in colls.items()},
        shadow_collectives=short,
        idle_ms=idle,
        lost_fraction=sum(v * 1e6 for v in idle.values()) / total if total > 0 else 0.0,
        unmatched=None,
    )


def _unmatched_mode(steps: pl.DataFrame, colls: dict[int, pl.DataFrame]) -> UnevenReport | None:
    frames = [c for c in colls.values() if c.height]
    if len(frames) < 2:
        return None
    # point-to-point counts differ between ranks by design (pipeline stages): collectives only;
    # counted per process group, among its members (a stage without the embedding group's
    # all-reduce is no short rank)
    keyed = {
        r: (c if "group" in c.columns else c.with_columns(pl.lit("*").alias("group"))).filter(
            pl.col("coll") != "sendrecv"
        )
        for r, c in colls.items()
    }
    pieces = [c.select("group", "coll") for c in keyed.values() if c.height]
    if not pieces:
        return None
    kinds = sorted(
        set(pl.concat(pieces).unique().iter_rows()),
        key=lambda k: (str(k[1]), str(k[0])),
    )
    for group, coll in kinds:
        if group is None:
            continue
        members = [r for r in colls if group == "*" or r in _members(group)]
        n = {
            r: keyed[r].filter((pl.col("group") == group) & (pl.col("coll") == coll)).height for r in members
        }
        if len(n) < 2:
            continue
        found = _unmatched_type(steps, colls, frames, keyed, group, coll, n)
        if found is not None:
            return found
    return None


def _members(group: str) -> set[int]:
    return {int(x) for x in group.split(",") if x}


def _unmatched_type(
    steps: pl.DataFrame,
    colls: dict[int, pl.DataFrame],
    frames: list[pl.DataFrame],
    keyed: dict[int, pl.DataFrame],
    group: str,
    coll: str,
    n: dict[int, int],
) -> UnevenReport | None:
    """The unmatched finding for one (group, collective type) whose members hold ``n`` instances."""
    lo = min(n.values())
    if max(n.values()) == lo:
        return None
    durs = pl.concat(
        [
            keyed[r]
            .filter((pl.col("group") == group) & (pl.col("coll") == coll))
            .select((pl.col("end") - pl.col("arrival")).alias("d"))
            for r in n
        ]
    )
    typical = float(durs["d"].median() or 0.0)  # type: ignore[arg-type]
    waiting: dict[int, int] = {}
    for r, k in n.items():
        if k == lo:
            continue
        tail = colls[r].sort("arrival").tail(1)
        d = int(tail["end"][0] - tail["arrival"][0])
        if tail["coll"][0] == coll and d >= max(HANG_FACTOR * typical, HANG_MIN_NS):
            waiting[r] = d
    if not waiting:
        return None
    short = sorted(r for r, k in n.items() if k == lo)
    counts = steps.group_by("rank").agg(pl.len().alias("n"))
    total_wait = sum(waiting.values())
    span = sum(int(c.select(pl.col("end").max() - pl.col("arrival").min()).item()) for c in frames)
    return UnevenReport(
        mode="unmatched",
        short_ranks=short,
        waiting_ranks=sorted(waiting),
        steps_per_rank=dict(zip(counts["rank"].to_list(), counts["n"].to_list(), strict=True)),
        collectives_per_rank={r: c.height for r, c in colls.items()},
        shadow_collectives={},
        idle_ms={},
        lost_fraction=total_wait / span if span > 0 else 0.0,
        unmatched={
            "coll": coll,
            "group": None if group == "*" else [int(x) for x in group.split(",")],
            "instances_per_rank": {str(r): k for r, k in sorted(n.items())},
            "waited_ms": {str(r): round(d / 1e6, 3) for r, d in sorted(waiting.items())},
            "typical_ms": round(typical / 1e6, 3),
        },
    )


def analyze_uneven(
    job: Job, steps: pl.DataFrame, colls: dict[int, pl.DataFrame], offsets: dict[int, int]
) -> UnevenReport | None:
    """The uneven-inputs finding of ``job`` (``steps``: ``breakdown.step_table``; ``colls``: the
    per-rank collectives of ``extract_collectives``), or None when every rank ran alike."""
    if len(job.traces) < 2:
        return None
    ac = _aligned(colls, offsets)
    spans = {r: sp[1] + int(offsets.get(r, 0)) for r, t in job.traces.items() if (sp := figures_of(t).span)}
    found = _unmatched_mode(steps, ac)
    if found is None and steps.height and steps["rank"].n_unique() == len(job.traces):
        found = _join_mode(steps, ac, spans)
    return found
