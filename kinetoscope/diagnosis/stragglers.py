"""Straggler detection, per-rank scores, classification and what-if.

Inputs: the matched collective instances (``breakdown.instance_table``: each rank's aligned
arrival, the instance's *typical* arrival = lower median over ranks, and its *last* arrival) and
the per-rank, per-step table (``breakdown.rank_breakdown``, whose ``lateness`` is the union over
the step's collectives of ``[typical arrival, own arrival]``).

Why arrivals and not step times: DDP's gradient all-reduce makes every rank's wall step time
equal (the fast ranks wait inside the collective), so a compute straggler is invisible in
per-rank phase or step times (traceml#252). The rank that arrives last at the collectives is
the straggler, and how much later it arrives than the typical rank is the time everybody lost.

Definitions (per step ``s``, ``T_s`` = median over ranks of the step time):

noise scale ``sigma``
    arrival jitter of a healthy job: ``1.4826 x`` the median over every (rank, collective) of
    ``|skew - the rank's median skew|``, where ``skew = arrival - the instance's median
    arrival``. Centering each rank on its own median removes a persistent straggler's steady
    offset; pooling the ranks and using the median (not the lower median) keeps it defined with
    two ranks (the earlier of two always has a lower-median skew of 0). Once a pattern of
    intermittent events is found (>= ``min_events`` events, in at most half of the steps),
    ``sigma`` is measured again on the steps without an event and the thresholds recomputed
    (once): frequent stragglers otherwise inflate it (2 ranks, 4 of 10 steps straggled:
    14 ms instead of 5 ms, and a 120 ms stall was nearly missed).
clean step ``T'``
    ``T'_s = T_s - lost_s`` (below): the step without any waiting for late ranks; the job's
    ``T'`` is the median over the analysed steps (a step's own ``T'_s`` shrinks with whatever
    lateness it carries, so it is not used for that step's threshold).
late in a step, two thresholds (``floor = max(k * sigma, abs_floor)``, ``k = 8``,
``abs_floor = 100 µs``)
    * *persistent* threshold ``max(floor, 0.05 * T')``: a rank whose lateness reaches it in
      at least half the analysed steps is a **persistent** straggler (steady lateness stands
      out of the noise at a small size: 5 % of a step);
    * *intermittent* threshold ``max(floor, 0.25 * T')``: any other rank is flagged in a step
      when it is late by a quarter of a clean step and by 8 sigma. On the 2-core test box the
      largest late arrival of 21 clean or non-straggling runs was 6.8 sigma (4 and 2 ranks,
      sigma 2-3.5 ms, bursts of 10-26 ms on 12-56 ms steps, up to 1.1 clean steps with two
      ranks); quiet jobs (GPU, sigma of µs) are bounded by the quarter step.
    * the *first* step of an optimizer-delimited trace, when analysed (it is a whole step),
      has both thresholds doubled (``first_step_factor = 2``): it carries the profiler's own
      start-up (measured: up to 40 ms = 12 sigma of extra lateness in a clean run).
    In a step, a rank is flagged only if its lateness is also at least half of the step's
    largest: a rank late by 30 ms while another is late by 150 ms did not make anyone wait.
``lost_s``
    ``|union over the step's collectives of [typical, last]|``: how long a typical rank waited
    for the last one (all skew, jitter included).
what-if
    the same with the flagged ranks arriving like the typical rank: ``lost_s'`` uses the last
    arrival among unflagged ranks; ``excess_s = lost_s - lost_s'`` is the time the stragglers
    cost; ``est_step_time_s = T_s - excess_s``. ``lost_fraction = sum excess / sum T``
    (the brief's "fraction of time lost"); ``skew_fraction = sum lost / sum T`` is what perfect
    arrival synchrony would save (jitter included).
per-rank score
    ``score = sum_s lateness[r, s] / sum_s T_s``: the fraction of the job's time the others
    spent waiting for this rank. Also ``late_steps``/``late_share`` (steps with an event) and
    ``mean_lateness``.
classification
    * ``persistent``: some rank(s) exceed the persistent threshold in at least half of the
      analysed steps -> suspect that host / GPU / link;
    * ``intermittent``: otherwise, at least 2 (rank, step) events over the intermittent
      threshold: different ranks at different times (or one rank now and then; listed as
      ``recurrent_ranks`` when one rank has >= 60 % of the events and at least 3);
    * ``none``: neither, or stragglers cost less than 5 % of the step time (``lost_fraction``):
      below that, removing them would gain less than the run-to-run noise of step times; a
      single event is reported in ``reason`` ("one isolated late arrival") but is no pattern.
    With fewer than 4 analysed steps the pattern cannot be told apart reliably:
    ``confidence = "low"``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import polars as pl

from kinetoscope.analysis.intervals import busy_span


@dataclass(frozen=True)
class StragglerThresholds:
    k_sigma: float = 8.0
    rel_step: float = 0.05
    rel_step_intermittent: float = 0.25
    first_step_factor: float = 2.0
    persistent_noise_cap: float = 1.0
    rel_to_worst: float = 0.5
    abs_floor_us: float = 100.0
    min_lost_fraction: float = 0.05
    min_events: int = 2
    persistent_share: float = 0.5
    recurrent_concentration: float = 0.6
    min_steps_confident: int = 4


PER_RANK_SCHEMA: dict[str, pl.DataType] = {
    "rank": pl.Int64(),
    "host": pl.String(),
    "steps": pl.Int64(),
    "late_steps": pl.Int64(),
    "late_share": pl.Float64(),
    "mean_lateness(us)": pl.Float64(),
    "mean_lateness_frac": pl.Float64(),
    "score": pl.Float64(),
    "mean_self_time(us)": pl.Float64(),
    "mean_compute(us)": pl.Float64(),
    "compute_vs_median": pl.Float64(),
    "mean_sync_wait(us)": pl.Float64(),
    "mean_dataloader(us)": pl.Float64(),
}

PER_STEP_SCHEMA: dict[str, pl.DataType] = {
    "step": pl.Int64(),
    "step_time(us)": pl.Float64(),
    "lost(us)": pl.Float64(),
    "excess(us)": pl.Float64(),
    "est_step_time(us)": pl.Float64(),
    "threshold(us)": pl.Float64(),
    "persistent_threshold(us)": pl.Float64(),
    "last_rank": pl.Int64(),
    "max_lateness(us)": pl.Float64(),
    "late_ranks": pl.List(pl.Int64()),
}


@dataclass
class StragglerReport:
    kind: str = "none"  # persistent | intermittent | none
    ranks: list[int] = field(default_factory=list)
    hosts: dict[int, str | None] = field(default_factory=dict)
    recurrent_ranks: list[int] = field(default_factory=list)
    lost_fraction: float | None = None
    skew_fraction: float | None = None
    mean_step_time_us: float | None = None
    est_step_time_us: float | None = None
    sigma_us: float | None = None
    steps_analysed: int = 0
    straggled_steps: int = 0
    confidence: str = "n/a"
    reason: str = ""
    cause: str | None = None
    per_rank: pl.DataFrame = field(default_factory=lambda: pl.DataFrame(schema=PER_RANK_SCHEMA))
    per_step: pl.DataFrame = field(default_factory=lambda: pl.DataFrame(schema=PER_STEP_SCHEMA))
    thresholds: StragglerThresholds = field(default_factory=StragglerThresholds)

    def to_dict(self) -> dict[str, Any]:
        from kinetoscope.diagnosis.report import frame_rows  # local: report imports this module

        speedup = None
        if self.mean_step_time_us and self.est_step_time_us:
            speedup = self.mean_step_time_us / self.est_step_time_us
        return {
            "kind": self.kind,
            "ranks": list(self.ranks),
            "hosts": {str(r): h for r, h in self.hosts.items()},
            "recurrent_ranks": list(self.recurrent_ranks),
            "confidence": self.confidence,
            "reason": self.reason,
            "cause": self.cause,
            "lost_fraction": self.lost_fraction,
            "skew_fraction": self.skew_fraction,
            "what_if": {
                "mean_step_time_us": self.mean_step_time_us,
                "est_step_time_without_stragglers_us": self.est_step_time_us,
                "speedup": speedup,
            },
            "steps_analysed": self.steps_analysed,
            "straggled_steps": self.straggled_steps,
            "noise_sigma_us": self.sigma_us,
            "thresholds": {
                "k_sigma": self.thresholds.k_sigma,
                "rel_step": self.thresholds.rel_step,
                "rel_step_intermittent": self.thresholds.rel_step_intermittent,
                "first_step_factor": self.thresholds.first_step_factor,
                "persistent_noise_cap": self.thresholds.persistent_noise_cap,
                "abs_floor_us": self.thresholds.abs_floor_us,
                "min_lost_fraction": self.thresholds.min_lost_fraction,
                "persistent_share": self.thresholds.persistent_share,
            },
            "per_rank": frame_rows(self.per_rank),
            "per_step": frame_rows(self.per_step),
        }


def noise_sigma(instances: pl.DataFrame) -> float:
    """Arrival jitter (ns): ``1.4826 x`` the median, over all (rank, instance), of the absolute
    deviation of the rank's skew from its own median skew, where a skew is the arrival minus the
    instance's *median* arrival. Centering on each rank's median removes a persistent straggler's
    steady offset; pooling the ranks and using the median arrival keeps the estimate defined
    with two ranks (the lower-median skew of the earlier of two ranks is always 0, which made a
    per-rank MAD vanish) and robust while one rank in a step straggles."""
    inst = instances.filter(pl.col("n_ranks") > 1)
    if inst.is_empty():
        return 0.0
    dev = (
        inst.with_columns(s=(pl.col("arrival") - pl.col("arrival").median().over("instance")).cast(pl.Float64))
        .with_columns(c=(pl.col("s") - pl.col("s").median().over("rank")).abs())
    )["c"]
    return float(1.4826 * float(dev.median())) if dev.len() else 0.0  # type: ignore[arg-type]


def _union_len(starts: np.ndarray, ends: np.ndarray) -> int:
    ok = ends > starts
    if not ok.any():
        return 0
    df = pl.DataFrame({"ts": starts[ok], "end": ends[ok]})
    return int(busy_span(df)["busy"][0])


def analyze_stragglers(
    instances: pl.DataFrame,
    breakdown: pl.DataFrame,
    hosts: dict[int, str | None] | None = None,
    thresholds: StragglerThresholds | None = None,
    first_step: int | None = None,
) -> StragglerReport:
    """``first_step``: the label of a trace-start-delimited first step included in the analysis
    (its thresholds are ``first_step_factor`` times the others: it carries the profiler's
    start-up)."""
    th = thresholds or StragglerThresholds()
    hosts = hosts or {}
    rep = StragglerReport(thresholds=th)
    inst = instances.filter(pl.col("step").is_not_null() & (pl.col("n_ranks") > 1))
    nranks = breakdown["rank"].n_unique() if breakdown.height else 0
    if nranks < 2 or inst.is_empty():
        if nranks == 0:
            rep.reason = "no steps found: nothing to compare"
        elif nranks < 2:
            rep.reason = "single rank: stragglers need at least two ranks"
        else:
            rep.reason = "no collective matched across ranks: no arrival skew to measure"
        rep.per_rank = _per_rank(breakdown, None, hosts)
        return rep
    sigma = noise_sigma(inst)
    rep.sigma_us = sigma / 1000.0
    steps_with_inst = sorted(set(inst["step"].to_list()))
    bd = breakdown.filter(pl.col("step").is_in(steps_with_inst))
    t_step = bd.group_by("step").agg(pl.col("step_time(us)").median().alias("T")).sort("step")
    # pass 1: per step, the skew lost and both thresholds
    lost_of: dict[int, int] = {}
    thr_p: dict[int, float] = {}
    thr_i: dict[int, float] = {}
    clean_of: dict[int, float] = {}
    for s, T_us in zip(t_step["step"].to_list(), t_step["T"].to_list(), strict=True):
        one = inst.filter(pl.col("step") == s)
        by_inst = one.group_by("instance").agg(pl.col("typical").first(), pl.col("last").first())
        lost_of[s] = _union_len(by_inst["typical"].to_numpy(), by_inst["last"].to_numpy())
        clean_of[s] = max(T_us * 1000.0 - lost_of[s], 0.0)
    # the job's clean step: median over the steps (a step's own clean time shrinks with the
    # noise it carries: it is not used for that step's threshold)
    clean_ref = float(np.median(list(clean_of.values()))) if clean_of else 0.0
    lat0 = bd.select("rank", "step", (pl.col("lateness(us)") * 1000.0).alias("lat"))

    def classify(sig: float) -> tuple[dict[int, float], dict[int, float], list[int], set[tuple[int, int]], pl.DataFrame]:
        thr_p: dict[int, float] = {}
        thr_i: dict[int, float] = {}
        floor = max(th.k_sigma * sig, th.abs_floor_us * 1000.0)
        # the persistent threshold's noise term is capped at one clean step: lateness beyond a
        # whole step in most steps is a straggler whatever sigma says (two ranks, one late in
        # most steps by varying amounts: both ranks' skews vary, and sigma with them)
        floor_p = max(min(th.k_sigma * sig, th.persistent_noise_cap * clean_ref), th.abs_floor_us * 1000.0)
        for s in clean_of:
            factor = th.first_step_factor if s == first_step else 1.0
            thr_p[s] = factor * max(floor_p, th.rel_step * clean_ref)
            thr_i[s] = factor * max(floor, th.rel_step_intermittent * clean_ref)
        thr_df = pl.DataFrame(
            {"step": list(thr_p), "_tp": list(thr_p.values()), "_ti": list(thr_i.values())},
            schema={"step": pl.Int64, "_tp": pl.Float64, "_ti": pl.Float64},
        )
        lat = lat0.join(thr_df, on="step", how="left")
        share_p = lat.group_by("rank").agg((pl.col("lat") >= pl.col("_tp")).mean().alias("share"))
        persistent = sorted(share_p.filter(pl.col("share") >= th.persistent_share)["rank"].to_list())
        over = pl.when(pl.col("rank").is_in(persistent)).then(pl.col("lat") >= pl.col("_tp")).otherwise(
            pl.col("lat") >= pl.col("_ti")
        )
        # the straggler(s) of a step are the ranks the others waited for: a rank whose lateness
        # is hidden behind a much later one (less than half of the step's worst) cost nothing there
        worst = pl.col("lat").max().over("step")
        flagged_df = lat.filter(over & (pl.col("lat") >= th.rel_to_worst * worst))
        return thr_p, thr_i, persistent, set(flagged_df.select("rank", "step").iter_rows()), lat

    thr_p, thr_i, persistent_ranks, events, lat = classify(sigma)
    # Intermittent stragglers inflate the noise estimate when they are frequent (with two ranks
    # every straggled collective moves both ranks' skews): once a pattern is found (at least
    # min_events events of non-persistent ranks, in at most half of the steps), the noise is
    # measured again on the steps without an event and the thresholds recomputed, once.
    ev_steps = {st for r, st in events if r not in persistent_ranks}
    n_ev = sum(1 for r, _st in events if r not in persistent_ranks)
    if n_ev >= th.min_events and len(ev_steps) <= len(clean_of) / 2:
        sigma2 = noise_sigma(inst.filter(~pl.col("step").is_in(sorted(ev_steps))))
        if 0 < sigma2 < sigma:
            sigma = sigma2
            rep.sigma_us = sigma / 1000.0
            thr_p, thr_i, persistent_ranks, events, lat = classify(sigma)
    # pass 2: what-if per step with the flagged ranks arriving like the typical rank
    per_step = []
    for s, T_us in zip(t_step["step"].to_list(), t_step["T"].to_list(), strict=True):
        one = inst.filter(pl.col("step") == s)
        lost = lost_of[s]
        flagged = sorted(r for r, st in events if st == s)
        unflagged = one.filter(~pl.col("rank").is_in(flagged))
        if flagged and unflagged.height:
            last_u = unflagged.group_by("instance").agg(pl.col("typical").first(), pl.col("arrival").max().alias("last_u"))
            lost_u = _union_len(last_u["typical"].to_numpy(), last_u["last_u"].to_numpy())
        else:
            lost_u = lost
        excess = max(lost - lost_u, 0)
        late = lat.filter(pl.col("step") == s).sort("lat", descending=True)
        top = (late["rank"][0], float(late["lat"][0])) if late.height else (None, 0.0)
        per_step.append(
            {
                "step": s,
                "step_time(us)": T_us,
                "lost(us)": lost / 1000.0,
                "excess(us)": excess / 1000.0,
                "est_step_time(us)": T_us - excess / 1000.0,
                "threshold(us)": thr_i[s] / 1000.0,
                "persistent_threshold(us)": thr_p[s] / 1000.0,
                "last_rank": top[0],
                "max_lateness(us)": top[1] / 1000.0,
                "late_ranks": flagged,
            }
        )
    rep.per_step = pl.DataFrame(per_step, schema=PER_STEP_SCHEMA, orient="row")
    ps = rep.per_step
    total_T = float(ps["step_time(us)"].sum())
    rep.steps_analysed = ps.height
    rep.straggled_steps = int((ps["late_ranks"].list.len() > 0).sum())
    rep.mean_step_time_us = float(ps["step_time(us)"].mean())  # type: ignore[arg-type]
    rep.est_step_time_us = float(ps["est_step_time(us)"].mean())  # type: ignore[arg-type]
    rep.lost_fraction = float(ps["excess(us)"].sum()) / total_T if total_T > 0 else None
    rep.skew_fraction = float(ps["lost(us)"].sum()) / total_T if total_T > 0 else None
    rep.per_rank = _per_rank(bd, events, hosts, ps)
    rep.confidence = "high" if rep.steps_analysed >= th.min_steps_confident else "low"

    pr = rep.per_rank
    n_events = len(events)
    if not persistent_ranks and (n_events < th.min_events or (rep.lost_fraction or 0.0) < th.min_lost_fraction):
        rep.kind = "none"
        if n_events == 0:
            rep.reason = "no rank arrived late beyond the noise threshold in any step"
        elif n_events < th.min_events:
            (r, s), = events
            rep.reason = f"one isolated late arrival (rank {r}, step {s}) is not a pattern"
        else:
            rep.reason = (
                f"late arrivals cost only {100 * (rep.lost_fraction or 0):.1f}% of step time "
                f"(< {100 * th.min_lost_fraction:.0f}%)"
            )
        return rep
    if persistent_ranks and (rep.lost_fraction or 0.0) < th.min_lost_fraction:
        rep.kind = "none"
        rep.reason = (
            f"rank(s) {persistent_ranks} arrive consistently late, but that costs only "
            f"{100 * (rep.lost_fraction or 0):.1f}% of step time (< {100 * th.min_lost_fraction:.0f}%)"
        )
        return rep
    persistent = pr.filter(pl.col("rank").is_in(persistent_ranks)).sort("score", descending=True)
    counts: dict[int, int] = {}
    for r, _s in events:
        counts[r] = counts.get(r, 0) + 1
    rep.recurrent_ranks = sorted(
        r for r, c in counts.items() if c >= 3 and c / max(rep.straggled_steps, 1) >= th.recurrent_concentration
    )
    if persistent.height:
        rep.kind = "persistent"
        rep.ranks = persistent["rank"].to_list()
        shares = ", ".join(
            f"rank {r} late in {int(n)}/{rep.steps_analysed} steps"
            for r, n in zip(persistent["rank"].to_list(), persistent["late_steps"].to_list(), strict=True)
        )
        rep.reason = f"the same rank(s) arrive last in most steps: {shares}"
        rep.cause = _cause(pr, rep.ranks)
    else:
        rep.kind = "intermittent"
        rep.ranks = sorted(counts, key=lambda r: (-counts[r], r))
        rep.reason = (
            f"{rep.straggled_steps}/{rep.steps_analysed} steps had a late rank, "
            f"{len(counts)} different rank(s), none late in half the steps"
        )
    rep.hosts = {r: hosts.get(r) for r in rep.ranks}
    return rep


def _cause(pr: pl.DataFrame, ranks: list[int]) -> str:
    parts = []
    for r in ranks:
        row = pr.filter(pl.col("rank") == r).row(0, named=True)
        ratio = row.get("compute_vs_median")
        dl = row.get("mean_dataloader(us)") or 0.0
        late = row.get("mean_lateness(us)") or 0.0
        if ratio is not None and ratio >= 1.15:
            parts.append(
                f"rank {r}: its compute takes {ratio:.2f}x the median rank's: suspect that rank's device "
                "(throttling, bad GPU/CPU, different clocks) or a heavier shard of work"
            )
        elif dl >= 0.5 * late and dl > 0:
            parts.append(f"rank {r}: data loading ({dl / 1000:.1f} ms per step) explains most of its lateness")
        else:
            parts.append(
                f"rank {r}: its compute is normal ({'' if ratio is None else f'{ratio:.2f}x median; '}"
                "the delay is outside profiled ops): suspect its host (CPU contention, I/O, GC, "
                "input pipeline) or its link"
            )
    return "; ".join(parts)


def _per_rank(
    bd: pl.DataFrame,
    events: set[tuple[int, int]] | None,
    hosts: dict[int, str | None],
    per_step: pl.DataFrame | None = None,
) -> pl.DataFrame:
    if bd.is_empty():
        return pl.DataFrame(schema=PER_RANK_SCHEMA)
    ev = events or set()
    late_steps = pl.DataFrame(
        {"rank": [r for r, _ in ev], "step": [s for _, s in ev]}, schema={"rank": pl.Int64, "step": pl.Int64}
    ).group_by("rank").agg(pl.len().cast(pl.Int64).alias("late_steps"))
    T = (
        per_step.select("step", pl.col("step_time(us)").alias("_T"))
        if per_step is not None and per_step.height
        else bd.group_by("step").agg(pl.col("step_time(us)").median().alias("_T"))
    )
    total_T = float(T["_T"].sum()) or 1.0
    x = bd.join(T, on="step", how="left")
    agg = x.group_by("rank").agg(
        pl.len().cast(pl.Int64).alias("steps"),
        pl.col("lateness(us)").mean().alias("mean_lateness(us)"),
        (pl.col("lateness(us)") / pl.col("_T")).mean().alias("mean_lateness_frac"),
        (pl.col("lateness(us)").sum() / total_T).alias("score"),
        pl.col("self_time(us)").mean().alias("mean_self_time(us)"),
        pl.col("compute(us)").mean().alias("mean_compute(us)"),
        pl.col("sync_wait(us)").mean().alias("mean_sync_wait(us)"),
        pl.col("dataloader(us)").mean().alias("mean_dataloader(us)"),
    )
    med = agg["mean_compute(us)"].median()
    agg = (
        agg.join(late_steps, on="rank", how="left")
        .with_columns(
            pl.col("late_steps").fill_null(0),
            (pl.col("mean_compute(us)") / med).alias("compute_vs_median") if med else pl.lit(None, dtype=pl.Float64).alias("compute_vs_median"),
            pl.col("rank").map_elements(lambda r: hosts.get(r), return_dtype=pl.String).alias("host"),
        )
        .with_columns((pl.col("late_steps") / pl.col("steps")).alias("late_share"))
    )
    return agg.select(list(PER_RANK_SCHEMA)).cast(PER_RANK_SCHEMA).sort("rank")  # type: ignore[arg-type]
