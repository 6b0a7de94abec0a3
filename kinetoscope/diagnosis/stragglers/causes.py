"""Why a named rank is late, compared with its peers (issue 9 item 3): compute, data loading,
host gaps and its collectives' own transfer time, each against the median of its peers.

A rank's peers are the ranks that do the same work: on a pipeline job its stage's other replicas
(the breakdown's ``cohort``, ``breakdown.with_cohorts``), else every other rank. Against every
rank, a heavy stage's rank would read as computing dozens of times the median, which says
nothing about why it was late."""

from __future__ import annotations

from typing import Any

import polars as pl

_CAUSE_COLUMNS = {
    "compute": ("compute(us)", "its compute"),
    "dataloader": ("dataloader(us)", "its data loading"),
    "host_gap": ("idle(us)", "host gaps (idle, no profiled op running)"),
    "transfer": ("transfer(us)", "its collectives' own transfer time"),
}


def rank_cause(bd: pl.DataFrame, r: int, steps: list[int] | None = None) -> dict[str, Any]:
    """Why rank ``r`` is late, compared with its peers: per-step means of compute, data loading,
    host gaps (CPU: idle host time; GPU: launch gaps) and own transfer time, each against the
    median of the other ranks, over ``steps`` (the steps it was late in; all when empty); the
    component whose excess explains at least half of the rank's mean lateness there is the
    cause (else: outside profiled work)."""
    gpu = bd["launch_gap(us)"].null_count() < bd.height
    if steps:
        bd = bd.filter(pl.col("step").is_in(steps))
    cols = dict(_CAUSE_COLUMNS)
    if gpu:
        cols["host_gap"] = ("launch_gap(us)", "GPU idle waiting for the host to launch work")
    means = bd.group_by("rank").agg(
        [pl.col(c).fill_null(0).mean().alias(k) for k, (c, _) in cols.items()]
        + [pl.col("lateness(us)").mean().alias("_late")]
    )
    mine = means.filter(pl.col("rank") == r)
    cohort = _cohort(bd, r)
    peers = means.filter(pl.col("rank").is_in(_peers(bd, r, cohort)))
    out: dict[str, Any] = {
        "lateness_ms_per_step": None,
        "components": {},
        "explained_by": None,
        "text": "",
        "cohort": cohort,
        "compared_with": sorted(int(x) for x in peers["rank"]),
    }
    if mine.is_empty() or peers.is_empty():
        out["text"] = "no peers to compare with"
        return out
    median_of = "its stage peers' median" if cohort is not None else "peers' median"
    late = float(mine["_late"][0] or 0.0)
    out["lateness_ms_per_step"] = round(late / 1000.0, 3)
    best, best_x = None, 0.0
    for k in cols:
        own, med = float(mine[k][0] or 0.0), float(peers[k].median() or 0.0)  # type: ignore[arg-type]
        out["components"][k] = {
            "rank_ms": round(own / 1000.0, 3),
            "peers_median_ms": round(med / 1000.0, 3),
            "excess_ms": round((own - med) / 1000.0, 3),
            "ratio": round(own / med, 3) if med > 0 else None,
        }
        if own - med > best_x:
            best, best_x = k, own - med
    comp = out["components"]["compute"]
    if best is not None and late > 0 and best_x >= 0.5 * late:
        out["explained_by"] = best
        c = out["components"][best]
        ratio = f" ({c['ratio']:.2f}x)" if c["ratio"] else ""
        out["text"] = (
            f"{cols[best][1]}: {c['rank_ms']:.1f} ms per step vs {median_of} {c['peers_median_ms']:.1f} ms"
            f"{ratio}, +{c['excess_ms']:.1f} ms of its {late / 1000:.1f} ms lateness"
        )
    else:
        ratio = f"{comp['ratio']:.2f}x" if comp["ratio"] else "n/a"
        out["text"] = (
            f"not explained by profiled work (compute {ratio} {median_of}, data loading "
            f"{out['components']['dataloader']['excess_ms']:+.1f} ms vs peers): suspect its host "
            "(CPU contention, I/O, GC) or its link"
        )
    return out


def _cohort(bd: pl.DataFrame, r: int) -> int | None:
    """Rank ``r``'s cohort (``breakdown.with_cohorts``) when it shares it with another rank."""
    if "cohort" not in bd.columns:
        return None
    own = bd.filter(pl.col("rank") == r)["cohort"].drop_nulls()
    if own.is_empty():
        return None
    c = int(own[0])
    mates = bd.filter((pl.col("cohort") == c) & (pl.col("rank") != r))
    return c if mates.height else None


def _peers(bd: pl.DataFrame, r: int, cohort: int | None) -> list[int]:
    """The ranks rank ``r`` is compared with: its cohort's others, else every other rank."""
    others = bd.filter(pl.col("rank") != r)
    if cohort is not None:
        others = others.filter(pl.col("cohort") == cohort)
    return sorted({int(x) for x in others["rank"]})
