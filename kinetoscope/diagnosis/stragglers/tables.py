"""The straggler report's tables: per step, per rank, each named rank's share of the lost time
and the ranks that would hold the job back next (``docs/diagnosis.md`` §5)."""

from __future__ import annotations

from itertools import combinations
from math import factorial
from typing import Any

import numpy as np
import polars as pl

from kinetoscope.diagnosis.attribution import (
    Matrix,
    Round,
    binom_sf,
    last_fixed,
    saving_between,
    saving_fixed,
)
from kinetoscope.diagnosis.stragglers.model import PER_RANK_SCHEMA, PER_STEP_SCHEMA
from kinetoscope.diagnosis.stragglers.naming import Named


def per_step_table(
    mx: Matrix,
    r0: Round,
    T_ns: np.ndarray,
    excess: np.ndarray,
    thr_i: np.ndarray,
    thr_p: np.ndarray,
    bd: pl.DataFrame,
    late: dict[int, np.ndarray],
) -> pl.DataFrame:
    counts = np.bincount(mx.step_idx, minlength=len(mx.steps))
    lat = bd.group_by("step").agg(pl.col("lateness(us)").max().alias("_ml"))
    maxlat = {s: v for s, v in lat.iter_rows()}
    rows = []
    for k, s in enumerate(mx.steps):
        top = int(np.argmax(r0.step_imposed[k])) if counts[k] else None
        rows.append(
            {
                "step": s,
                "step_time(us)": T_ns[k] / 1000.0,
                "lost(us)": r0.waiting[k] / 1000.0,
                "excess(us)": excess[k] / 1000.0,
                "est_step_time(us)": (T_ns[k] - excess[k]) / 1000.0,
                "threshold(us)": thr_i[k] / 1000.0,
                "persistent_threshold(us)": thr_p[k] / 1000.0,
                "last_rank": mx.ranks[top] if top is not None and r0.step_imposed[k, top] > 0 else None,
                "max_lateness(us)": maxlat.get(s),
                "late_ranks": sorted(r for r, v in late.items() if v[k]),
                "n_instances": int(counts[k]),
                "max_imposed(us)": float(r0.step_imposed[k].max()) / 1000.0 if mx.ranks else 0.0,
            }
        )
    return pl.DataFrame(rows, schema=PER_STEP_SCHEMA, orient="row")


def lost_shares(mx: Matrix, named: list[int], *, from_median: bool = False) -> dict[int, float]:
    """Each named rank's share of the time the named ranks cost: its Shapley value in the
    what-if game whose worth of a set of ranks is the step time saved with that set arriving
    like the typical rank (``saving_fixed``), over the worth of them all. Ranks that are late
    on their own get their own saving either way; two that alternate as the last one (each
    saves little alone while the other stays late) share their joint saving, which an order
    of naming would hand nearly all to whichever was named second. ``from_median``: the savings
    measured from the typical arrival (``saving_fixed``; the naming filters)."""
    k = len(named)
    if k == 0:
        return {}
    last = last_fixed(mx, set())
    worth = {
        frozenset(c): float(saving_between(mx, last, last_fixed(mx, set(c)), from_median=from_median).sum())
        for size in range(k + 1)
        for c in combinations(named, size)
    }
    phi = dict.fromkeys(named, 0.0)
    for coalition, value in worth.items():
        if len(coalition) == k:
            continue
        w = factorial(len(coalition)) * factorial(k - len(coalition) - 1) / factorial(k)
        for r in named:
            if r not in coalition:
                phi[r] += w * (worth[coalition | {r}] - value)
    total = worth[frozenset(named)]
    return {r: v / total if total > 0 else 0.0 for r, v in phi.items()}


def next_ranks(mx: Matrix, final: Round, fixed: set[int], T_ns: np.ndarray) -> list[dict[str, Any]]:
    """Once the named ranks are fixed, who would hold the job back next (top two, with the wait
    they would impose per step)."""
    tot = final.step_imposed.sum(axis=0)
    out = []
    for j in np.argsort(-tot, kind="stable"):
        r = mx.ranks[int(j)]
        if r in fixed or tot[j] <= 0:
            continue
        out.append(
            {
                "rank": r,
                "imposed_per_step_us": float(tot[j]) / len(mx.steps) / 1000.0,
                "share_of_step": float(tot[j]) / float(T_ns.sum()) if T_ns.sum() > 0 else None,
                "last_count": int(final.last[:, j].sum()),
            }
        )
        if len(out) == 2:
            break
    return out


def _cohort_of(x: pl.DataFrame) -> pl.Expr:
    """A rank's cohort (``breakdown.with_cohorts``), null when the table has none."""
    return pl.col("cohort").first() if "cohort" in x.columns else pl.lit(None, dtype=pl.Int64)


def _compute_median() -> pl.Expr:
    """The compute each rank's is compared with (``compute_vs_median``): the median rank's of its
    cohort, a pipeline stage's replicas (``breakdown.with_cohorts``), when it has a peer there;
    else the median rank's of the job."""
    compute = pl.col("mean_compute(us)")
    in_cohort = pl.col("_cohort").is_not_null() & (pl.len().over("_cohort") > 1)
    return (
        pl.when(in_cohort).then(compute.median().over("_cohort")).otherwise(compute.median()).alias("_median")
    )


def per_rank_table(
    bd: pl.DataFrame,
    hosts: dict[int, str | None],
    mx: Matrix | None,
    named: dict[int, Named] | None,
    roles: dict[int, str],
    final: Round | None = None,
    T_ns: np.ndarray | None = None,
    lost_share: dict[int, float] | None = None,
) -> pl.DataFrame:
    if bd.is_empty():
        return pl.DataFrame(schema=PER_RANK_SCHEMA)
    # sorted: a float sum over groups in hash order differs in its last bit from run to run
    Tdf = bd.group_by("step").agg(pl.col("step_time(us)").median().alias("_T")).sort("step")
    total_T = float(Tdf["_T"].sum()) or 1.0
    x = bd.join(Tdf, on="step", how="left")
    agg = x.group_by("rank").agg(
        pl.len().cast(pl.Int64).alias("steps"),
        pl.col("lateness(us)").mean().alias("mean_lateness(us)"),
        (pl.col("lateness(us)") / pl.col("_T")).mean().alias("mean_lateness_frac"),
        (pl.col("lateness(us)").sum() / total_T).alias("score"),
        pl.col("self_time(us)").mean().alias("mean_self_time(us)"),
        pl.col("compute(us)").mean().alias("mean_compute(us)"),
        pl.col("sync_wait(us)").mean().alias("mean_sync_wait(us)"),
        pl.col("dataloader(us)").mean().alias("mean_dataloader(us)"),
        _cohort_of(x).alias("_cohort"),
    )
    agg = agg.with_columns(_compute_median())
    extra: dict[str, list[Any]] = {
        k: []
        for k in (
            "rank",
            "instances",
            "last_count",
            "p_value",
            "imposed_wait(us)",
            "imposed_share",
            "whatif_saving(us)",
            "role",
            "late_steps",
        )
    }
    if mx is not None and final is not None and T_ns is not None:
        named = named or {}
        n_inst = mx.A.shape[0]
        for j, r in enumerate(mx.ranks):
            rnd = named[r].rnd if r in named else final
            late = named[r].late_steps if r in named else np.zeros(len(mx.steps), bool)
            k = int(rnd.last[:, j].sum())
            tot = float(rnd.imposed.sum())
            extra["rank"].append(r)
            extra["instances"].append(n_inst)
            extra["last_count"].append(k)
            extra["p_value"].append(binom_sf(k, n_inst, rnd.p0))
            extra["imposed_wait(us)"].append(float(rnd.step_imposed[:, j].sum()) / 1000.0)
            extra["imposed_share"].append(float(rnd.imposed[:, j].sum()) / tot if tot > 0 else 0.0)
            extra["whatif_saving(us)"].append(
                float(saving_fixed(mx, set(), {r}).sum()) / len(mx.steps) / 1000.0
            )
            extra["role"].append(roles.get(r))
            extra["late_steps"].append(int(late.sum()))
    ex = pl.DataFrame(
        extra,
        schema={
            "rank": pl.Int64,
            "instances": pl.Int64,
            "last_count": pl.Int64,
            "p_value": pl.Float64,
            "imposed_wait(us)": pl.Float64,
            "imposed_share": pl.Float64,
            "whatif_saving(us)": pl.Float64,
            "role": pl.String,
            "late_steps": pl.Int64,
        },
    )
    agg = (
        agg.join(ex, on="rank", how="left")
        .with_columns(
            pl.col("late_steps").fill_null(0),
            pl.when(pl.col("_median") > 0)
            .then(pl.col("mean_compute(us)") / pl.col("_median"))
            .otherwise(None)
            .alias("compute_vs_median"),
            pl.col("rank").map_elements(lambda r: hosts.get(r), return_dtype=pl.String).alias("host"),
            pl.col("rank")
            .replace_strict(lost_share or {}, default=None, return_dtype=pl.Float64)
            .alias("lost_share"),
        )
        .with_columns((pl.col("late_steps") / pl.col("steps")).alias("late_share"))
    )
    return agg.select(list(PER_RANK_SCHEMA)).cast(PER_RANK_SCHEMA).sort("rank")  # type: ignore[arg-type]
