"""Per rank and per step: where the time of each training step went.

Steps come from ``kinetoscope.analysis.steps.detect_steps`` (``ProfilerStep#N``, else the
ends of ``Optimizer.step#...`` annotations, which is all on-demand traces have). ProfilerStep
numbers are global; optimizer steps are numbered per trace, so they are relabelled to the
reference rank's numbering: after clock alignment, each rank's steps are shifted by the one
integer that best overlaps them with the reference rank's steps.

Columns of the per-rank, per-step table (times in µs; ``start`` is on the aligned clock, from the
first step start of the job):

``step_time``
    window length (``end - start``).
``compute``
    GPU traces: union of COMPUTATION kernels (``kernel_types``) launched in the step.
    CPU traces: union of host ``cpu_op`` intervals, excluding communication ops (``c10d::*``,
    ``record_param_comms``, ``gloo:*``/``nccl:*``) and the backend's worker threads.
``comm``
    union of this rank's collective instances (``collectives``) in the step.
``exposed_comm``
    ``comm`` not overlapped by ``compute``.
``sync_wait``
    time spent inside collectives waiting for the last rank: union over the step's collectives
    of ``[own arrival, min(last rank's arrival, own end)]`` (aligned clocks). ``transfer`` =
    ``comm - sync_wait``: the collective's own work once everyone has arrived (DeepSpeed's
    split of collective time).
``self_time``
    ``step_time - sync_wait``: the step with waiting for peers removed; DDP's all-reduce makes
    every rank's *wall* step time equal, this is what differs between a straggler and the rest.
``lateness``
    how much later than the typical rank this rank arrived: union over the step's collectives
    of ``[typical arrival, own arrival]`` when it arrived after the typical one. The typical
    arrival is the lower median of the ranks' arrivals (for 2 ranks: the earlier one).
``launch_gap``
    GPU only: time the GPU (all streams together) sat idle because the next kernel/memcpy had
    not been launched yet (its runtime call started after the GPU went idle): the
    CPU-launch-bound part of GPU idle.
``dataloader``
    union of ``enumerate(DataLoader)#...__next__`` (and ``DataLoader`` ``__next__``)
    annotations in the step.
``idle``
    step time when neither compute nor communication ran on the device (GPU) / on the host
    (CPU).
``n_kernels``, ``n_collectives``
    counts in the step.
"""

from __future__ import annotations

import numpy as np
import polars as pl

from kinetoscope.analysis.intervals import busy_span
from kinetoscope.diagnosis.assembly import Job
from kinetoscope.diagnosis.clock import ClockAlignment
from kinetoscope.trace.model import Trace

DATALOADER_PATTERN = r"(?i)enumerate\(DataLoader\)|DataLoader.*__next__|_DataLoaderIter.*__next__"

STEPS_SCHEMA: dict[str, pl.DataType] = {
    "rank": pl.Int64(),
    "step": pl.Int64(),
    "local_step": pl.Int64(),
    "source": pl.String(),
    "start": pl.Int64(),  # aligned ns
    "end": pl.Int64(),  # aligned ns
}

INSTANCE_SCHEMA: dict[str, pl.DataType] = {
    "rank": pl.Int64(),
    "instance": pl.String(),
    "coll": pl.String(),
    "step": pl.Int64(),
    "arrival": pl.Int64(),  # aligned ns
    "end": pl.Int64(),  # aligned ns
    "typical": pl.Int64(),  # lower median arrival of the instance
    "last": pl.Int64(),  # last arrival of the instance
    "n_ranks": pl.Int64(),
    "group": pl.String(),  # its process group (``groups.assign_groups``: "0,4,8" or "*" job-wide)
    "group_size": pl.Int64(),  # members of that group among the job's ranks (complete: n_ranks == group_size)
    "waited": pl.Boolean(),  # the rank's issuing thread waited for it (``collectives.COLLECTIVES_SCHEMA``)
}

BREAKDOWN_COLUMNS = [
    "step_time",
    "compute",
    "comm",
    "exposed_comm",
    "sync_wait",
    "transfer",
    "self_time",
    "lateness",
    "launch_gap",
    "dataloader",
    "idle",
]
BREAKDOWN_SCHEMA: dict[str, pl.DataType] = {
    "rank": pl.Int64(),
    "step": pl.Int64(),
    "start(us)": pl.Float64(),
    **{f"{c}(us)": pl.Float64() for c in BREAKDOWN_COLUMNS},
    "n_kernels": pl.Int64(),
    "n_collectives": pl.Int64(),
}


# ---- steps ---------------------------------------------------------------------------------------


def compute_span_table(job: Job, clock: ClockAlignment) -> pl.DataFrame | None:
    """The pipeline ranks' compute intervals (``extract.RankFigures.compute``) on the aligned
    clock: rank, start, end (ns); ``None`` when no rank has them (no pipeline)."""
    frames = [
        f.compute.with_columns(
            pl.lit(r, dtype=pl.Int64).alias("rank"),
            pl.col("start") + clock.offsets.get(r, 0),
            pl.col("end") + clock.offsets.get(r, 0),
        )
        for r, f in job.figures.items()
        if f.compute is not None and f.compute.height
    ]
    return pl.concat(frames).select("rank", "start", "end") if frames else None


def step_table(job: Job, clock: ClockAlignment) -> pl.DataFrame:
    """Steps of every rank on the aligned clock, with a job-wide ``step`` label."""
    # The job's rank, not the trace's: a single-process trace has no rank of its own (``None``),
    # and detect_steps may have been memoised before the job gave it one.
    frames = [f.steps.with_columns(pl.lit(r, dtype=pl.Int64).alias("rank")) for r, f in job.figures.items()]
    raw = pl.concat(frames) if frames else pl.DataFrame(schema=STEPS_SCHEMA)
    if raw.is_empty():
        return pl.DataFrame(schema=STEPS_SCHEMA)
    offs = pl.DataFrame(
        {"rank": list(clock.offsets), "_off": list(clock.offsets.values())},
        schema={"rank": pl.Int64, "_off": pl.Int64},
    )
    st = (
        raw.join(offs, on="rank", how="left")
        .with_columns(pl.col("_off").fill_null(0))
        .with_columns(
            local_step=pl.col("step"),
            start=pl.col("start") + pl.col("_off"),
            end=pl.col("end") + pl.col("_off"),
        )
        .drop("_off")
    )
    if (st["source"] == "ProfilerStep").all():
        return st.select(list(STEPS_SCHEMA)).sort("rank", "step")
    ranks = st["rank"].unique().sort().to_list()
    ref = clock.reference if clock.reference in ranks else ranks[0]
    ref_st = st.filter(pl.col("rank") == ref)
    rs, re_, rl = ref_st["start"].to_numpy(), ref_st["end"].to_numpy(), ref_st["local_step"].to_numpy()
    out = []
    for r in ranks:
        mine = st.filter(pl.col("rank") == r)
        if r == ref:
            out.append(mine)
            continue
        s, e, loc = mine["start"].to_numpy(), mine["end"].to_numpy(), mine["local_step"].to_numpy()
        shifts = []
        for k in range(s.size):
            ov = np.minimum(e[k], re_) - np.maximum(s[k], rs)
            if ov.size and ov.max() > 0:
                shifts.append(int(rl[int(np.argmax(ov))] - loc[k]))
        if shifts:
            vals, counts = np.unique(shifts, return_counts=True)
            shift = int(vals[np.argmax(counts)])
        else:
            mids = (s + e) / 2
            ref_mid = (rs + re_) / 2
            period = float(np.median(re_ - rs)) if rs.size else 1.0
            shift = int(round((mids[0] - ref_mid[0]) / max(period, 1.0))) if rs.size and s.size else 0
        out.append(mine.with_columns(step=pl.col("local_step") + shift))
    return pl.concat(out).select(list(STEPS_SCHEMA)).sort("rank", "step")


def _assign(df: pl.DataFrame, steps: pl.DataFrame, key: str = "ts") -> pl.DataFrame:
    """Add ``step`` (job label) to rows by the step window (aligned ns) containing ``key``."""
    if df.is_empty() or steps.is_empty():
        return df.with_columns(pl.lit(None, dtype=pl.Int64).alias("step"))
    win = steps.select(
        pl.col("start").alias("_k"), pl.col("end").alias("_e"), pl.col("step").alias("_s")
    ).sort("_k")
    out = (
        df.with_row_index("_row")
        .with_columns(pl.col(key).alias("_k"))
        .sort("_k")
        .join_asof(win, on="_k", strategy="backward")
        .with_columns(step=pl.when(pl.col("_k") < pl.col("_e")).then(pl.col("_s")).otherwise(None))
        .sort("_row")
        .drop("_row", "_k", "_e", "_s")
    )
    return out


# ---- collective instances across ranks ------------------------------------------------------------


def instance_table(
    colls: dict[int, pl.DataFrame], clock: ClockAlignment, steps: pl.DataFrame
) -> pl.DataFrame:
    """One row per (rank, matched collective instance), aligned times, plus the instance's
    typical (lower median) and last arrival over the ranks that have it."""
    if clock.pairs.is_empty():
        return pl.DataFrame(schema=INSTANCE_SCHEMA)
    frames = []
    for r, c in colls.items():
        if c.is_empty():
            continue
        off = clock.offsets.get(r, 0)
        p = clock.pairs.filter(pl.col("rank") == r)
        if "group" not in c.columns:
            c = c.with_columns(pl.lit("*").alias("group"))
        if "waited" not in c.columns:
            c = c.with_columns(pl.lit(False).alias("waited"))
        j = c.join(p.drop("rank"), on=["group", "coll", "ordinal"], how="inner").with_columns(
            pl.col("arrival") + off, pl.col("end") + off
        )
        if j.height:
            frames.append(j.select("rank", "group", "coll", "ref_ordinal", "arrival", "end", "waited"))
    if not frames:
        return pl.DataFrame(schema=INSTANCE_SCHEMA)
    inst = pl.concat(frames).with_columns(
        instance=pl.when(pl.col("group") == "*")
        .then(pl.format("{}#{}", pl.col("coll"), pl.col("ref_ordinal")))
        .otherwise(pl.format("{}@{}#{}", pl.col("coll"), pl.col("group"), pl.col("ref_ordinal")))
    )
    n_job = len([r for r, c in colls.items() if not c.is_empty()])
    present = set(inst["rank"].unique().to_list())
    sizes = {
        g: (n_job if g == "*" else len({int(x) for x in g.split(",")} & present))
        for g in inst["group"].unique().to_list()
    }
    inst = inst.with_columns(group_size=pl.col("group").replace_strict(sizes, return_dtype=pl.Int64))
    ref = clock.reference
    # step of an instance = the step (of the reference rank, else any rank) containing its arrival
    inst_steps = []
    for r in inst["rank"].unique().to_list():
        inst_steps.append(
            _assign(inst.filter(pl.col("rank") == r), steps.filter(pl.col("rank") == r), "arrival")
        )
    inst = pl.concat(inst_steps)
    step_of = (
        inst.filter(pl.col("step").is_not_null())
        .with_columns(_is_ref=(pl.col("rank") == ref))
        .sort("_is_ref", descending=True)
        .group_by("instance", maintain_order=True)
        .agg(pl.col("step").first().alias("_step"))
    )
    inst = inst.join(step_of, on="instance", how="left").with_columns(step=pl.col("_step")).drop("_step")
    stats = inst.group_by("instance").agg(
        pl.col("arrival").sort().gather((pl.len() - 1) // 2).first().alias("typical"),
        pl.col("arrival").max().alias("last"),
        pl.len().cast(pl.Int64).alias("n_ranks"),
    )
    return (
        inst.join(stats, on="instance")
        .select(list(INSTANCE_SCHEMA))
        .cast(INSTANCE_SCHEMA)  # type: ignore[arg-type]  # polars' stub: Mapping keys invariant
        .sort("rank", "arrival")
    )


# ---- per rank, per step ------------------------------------------------------------------------------


def _union_by(df: pl.DataFrame, keys: list[str], name: str) -> pl.DataFrame:
    if df.is_empty():
        return pl.DataFrame(schema={**{k: pl.Int64() for k in keys}, name: pl.Int64()})
    return busy_span(df.filter(pl.col("end") > pl.col("ts")), keys).select(*keys, pl.col("busy").alias(name))


def _launch_gaps(trace: Trace, dev: pl.DataFrame) -> pl.DataFrame:
    """Per step: GPU idle time (all streams) before a device event launched after the GPU went
    idle (host-bound gap), by the step of the event after the gap."""
    if dev.is_empty():
        return pl.DataFrame(schema={"step": pl.Int64, "launch_gap": pl.Int64})
    launches = (
        trace.runtime()
        .filter(pl.col("correlation").is_not_null())
        .group_by("correlation")
        .agg(pl.col("ts").min().alias("_lts"))
    )
    d = (
        dev.select("step", "ts", "end", "correlation")
        .sort("ts")
        .with_columns(_front=pl.col("end").cum_max().shift(1))
        .join(launches, on="correlation", how="left")
        .with_columns(_gap=(pl.col("ts") - pl.col("_front")).clip(lower_bound=0))
    )
    # The GPU had nothing queued from the frontier until the launch call: the gap is host-bound.
    host = d.filter((pl.col("_gap") > 0) & pl.col("_lts").is_not_null() & (pl.col("_lts") > pl.col("_front")))
    return host.group_by("step").agg(pl.col("_gap").sum().alias("launch_gap"))


def rank_breakdown(
    job: Job, steps: pl.DataFrame, instances: pl.DataFrame, clock: ClockAlignment
) -> pl.DataFrame:
    """The per-rank, per-step table (module docstring), µs: each rank's own figures
    (``extract.step_figures``, per local step) relabelled to the job's steps, plus what depends
    on the other ranks (waiting, lateness, matched collectives)."""
    frames = []
    t0 = int(steps["start"].min()) if steps.height else 0  # type: ignore[arg-type]
    for r, fig in job.figures.items():
        steps_r = steps.filter(pl.col("rank") == r)
        if steps_r.is_empty():
            continue
        base = steps_r.select(
            "step", pl.col("start").alias("_start"), (pl.col("end") - pl.col("start")).alias("step_time")
        )
        label = steps_r.select(pl.col("local_step").alias("_local"), "step")
        own = fig.step_figures.rename({"step": "_local"}).join(label, on="_local").drop("_local")
        out = base.join(own, on="step", how="left")
        for extra in _cross_rank(instances.filter(pl.col("rank") == r), fig.has_device):
            out = out.join(extra, on="step", how="left")
        frames.append(_finish_rank(out, r, t0, fig.has_device))
    if not frames:
        return pl.DataFrame(schema=BREAKDOWN_SCHEMA)
    return pl.concat(frames).sort("rank", "step")


def _cross_rank(inst_r: pl.DataFrame, has_dev: bool) -> list[pl.DataFrame]:
    """Per step of one rank, from its matched collective instances (aligned clocks): time
    waiting for the last rank, lateness against the typical rank, and (GPU) the count."""
    wait = _union_by(
        inst_r.filter(pl.col("step").is_not_null()).select(
            "step", pl.col("arrival").alias("ts"), pl.min_horizontal("last", "end").alias("end")
        ),
        ["step"],
        "sync_wait",
    )
    late = _union_by(
        inst_r.filter(pl.col("step").is_not_null() & (pl.col("n_ranks") > 1)).select(
            "step", pl.col("typical").alias("ts"), pl.col("arrival").alias("end")
        ),
        ["step"],
        "lateness",
    )
    if not has_dev:  # CPU: the backend's own annotations were counted per rank
        return [wait, late]
    return [wait, late, inst_r.group_by("step").agg(pl.len().cast(pl.Int64).alias("n_collectives"))]


def _finish_rank(out: pl.DataFrame, r: int, t0: int, has_dev: bool) -> pl.DataFrame:
    """Fill, derive (transfer, self time, idle) and convert one rank's rows to µs."""
    if not has_dev:
        out = out.rename({"n_host_collectives": "n_collectives"})
    z = ["compute", "comm", "exposed_comm", "busy", "sync_wait", "lateness", "dataloader", "n_collectives"]
    out = out.with_columns([pl.col(c).fill_null(0) for c in z])
    out = out.with_columns(
        pl.min_horizontal("sync_wait", "comm").alias("sync_wait"),
    ).with_columns(
        transfer=(pl.col("comm") - pl.col("sync_wait")).clip(lower_bound=0),
        self_time=pl.col("step_time") - pl.col("sync_wait"),
        idle=(pl.col("step_time") - pl.col("busy")).clip(lower_bound=0),
        launch_gap=pl.col("launch_gap").fill_null(0) if has_dev else pl.lit(None, dtype=pl.Int64),
        n_kernels=pl.col("n_kernels").fill_null(0) if has_dev else pl.lit(None, dtype=pl.Int64),
    )
    out = out.select(
        pl.lit(r, dtype=pl.Int64).alias("rank"),
        "step",
        ((pl.col("_start") - t0) / 1000.0).alias("start(us)"),
        *[(pl.col(c).cast(pl.Float64) / 1000.0).alias(f"{c}(us)") for c in BREAKDOWN_COLUMNS],
        "n_kernels",
        "n_collectives",
    )
    return out.cast(BREAKDOWN_SCHEMA)  # type: ignore[arg-type]


def with_cohorts(bd: pl.DataFrame, cohort_of: dict[int, int]) -> pl.DataFrame:
    """``bd`` with a ``cohort`` column: the ranks of one cohort do the same work (a pipeline
    stage's replicas), so a rank's compute is compared with its cohort's, not with ranks that run
    other layers (``stragglers.causes.rank_cause``, the per-rank ``compute_vs_median``). Ranks
    missing from ``cohort_of`` get null: compared with every rank."""
    cohort = pl.col("rank").replace_strict(cohort_of, default=None, return_dtype=pl.Int64)
    return bd.with_columns(cohort.alias("cohort"))
