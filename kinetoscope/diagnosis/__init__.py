"""Job-level diagnosis: rank assembly, clock alignment, per-rank/per-step attribution,
stragglers, MFU and recommendations tied to causes. See docs/diagnosis.md.

    from kinetoscope.diagnosis import diagnose
    d = diagnose(["run/rank-0.json", "run/rank-1.json"], model_flops=6 * tokens * params)
    print(d.render_text())          # verdict first, then tables
    d.steps                         # Polars: per rank, per step
    d.stragglers.per_rank           # Polars: per-rank straggler scores
    d.to_dict()                     # JSON contract (kscope analyze --json keys)
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import polars as pl

from kinetoscope.diagnosis.assembly import Job, assemble_jobs
from kinetoscope.diagnosis.bandwidth import collective_bandwidth
from kinetoscope.diagnosis.breakdown import (
    compute_span_table,
    instance_table,
    rank_breakdown,
    step_table,
    with_cohorts,
)
from kinetoscope.diagnosis.clock import ClockAlignment, align_clocks
from kinetoscope.diagnosis.clock_links import transfer_offsets
from kinetoscope.diagnosis.evidence import (
    admissible,
    exclude_anomalous,
    gather_evidence,
    guard_uneven,
    lowered,
    note_partial_first_step,
    withhold,
)
from kinetoscope.diagnosis.extract import figures_of
from kinetoscope.diagnosis.groups import assign_groups
from kinetoscope.diagnosis.mfu import PEAK_FLOPS, MFUResult, compute_mfu
from kinetoscope.diagnosis.pipeline import PipelineReport, analyze_pipeline
from kinetoscope.diagnosis.recommendations import recommend
from kinetoscope.diagnosis.recompile import compile_events, recompilation_summary
from kinetoscope.diagnosis.result import Diagnosis
from kinetoscope.diagnosis.stragglers.verdict import StragglerReport, StragglerThresholds, analyze_stragglers
from kinetoscope.diagnosis.uneven import analyze_uneven
from kinetoscope.diagnosis.whatif.p2p import p2p_links
from kinetoscope.protocol.document_keys import DIAGNOSIS_KEYS, EXTRA_DIAGNOSIS_KEYS
from kinetoscope.trace.model import Trace

EXTRA_KEYS = (
    EXTRA_DIAGNOSIS_KEYS  # the document keys added after the first contract (null when not applicable)
)

__all__ = [
    "DIAGNOSIS_KEYS",
    "EXTRA_KEYS",
    "PEAK_FLOPS",
    "ClockAlignment",
    "Diagnosis",
    "Job",
    "MFUResult",
    "StragglerReport",
    "StragglerThresholds",
    "assemble_jobs",
    "diagnose",
]


def _expand(item: Trace | str | os.PathLike[str], notes: list[str]) -> list[Trace]:
    from kinetoscope.trace import TraceError, load_trace
    from kinetoscope.trace.discover import trace_files_in

    if isinstance(item, Trace):
        return [item]
    p = Path(item)
    if p.is_dir():
        out = []
        for f in trace_files_in(p):
            try:
                out.append(load_trace(f))
            except TraceError as exc:  # a folder may hold other JSON files: skip, say so
                notes.append(f"skipped {f}: {exc}")
        return out
    return [load_trace(p)]


def _as_traces(
    traces: Trace | str | os.PathLike[str] | Iterable[Trace | str | os.PathLike[str]], notes: list[str]
) -> list[Trace]:
    if isinstance(traces, (Trace, str, os.PathLike)):
        return _expand(traces, notes)
    out: list[Trace] = []
    for t in traces:
        out += _expand(t, notes)
    return out


def diagnose(
    traces: Trace | str | os.PathLike[str] | Iterable[Trace | str | os.PathLike[str]],
    results: Mapping[str, Any] | None = None,
    *,
    model_flops: float | None = None,
    peak_flops: float | None = None,
    precision: str | None = None,
    thresholds: StragglerThresholds | None = None,
) -> Diagnosis:
    """Diagnose one job from its rank traces (``Trace`` objects, trace files or folders).

    ``results`` (the analysis runner's results, unused for now) is accepted so that this is the
    runner's diagnosis hook as is. ``model_flops``: FLOPs of one global training step (e.g.
    ``6 * tokens_per_batch * num_params``); ``peak_flops``: peak FLOP/s of one device (overrides
    the table); ``precision``: ``bf16``/``fp16``/``tf32``/``fp32`` for the table lookup (default:
    detected from kernel names, else bf16). When the traces hold several jobs, the one with the
    most ranks is diagnosed and the others are listed in ``job.other_jobs``.
    """
    del results
    notes: list[str] = []
    tl = _as_traces(traces, notes)
    jobs = assemble_jobs(tl)
    if not jobs:
        jobs = [Job(key="empty")]
    job = jobs[0]
    job.figures = {r: figures_of(t) for r, t in job.traces.items()}  # the only reads of the events
    colls, groups = assign_groups({r: f.collectives_of(r) for r, f in job.figures.items()}, job.hosts())
    notes += groups.notes
    clock = align_clocks(colls, job.hosts())
    peers = {r: f.p2p for r, f in job.figures.items()}
    links = p2p_links(peers, clock.offsets)
    if placed := transfer_offsets(links, clock, job.hosts()):  # hosts only transfers join
        clock = align_clocks(colls, job.hosts(), host_offsets=placed)
        links = p2p_links(peers, clock.offsets)
    steps = step_table(job, clock)
    instances = instance_table(colls, clock, steps)
    bd = rank_breakdown(job, steps, instances, clock)
    source = steps["source"].mode().first() if steps.height else None
    # cross-rank analysis only on the steps every rank holds (trace windows need not be aligned)
    s_inst, s_bd, dropped = common_steps(instances, bd)
    partial_first: int | None = None
    if source == "optimizer" and s_bd.height and s_bd["step"].n_unique() > 2:
        # The first optimizer-delimited step starts where the trace starts. On-demand iteration
        # traces start right after an optimizer step, so it is a whole step and kept; a trace
        # that started inside a step (duration traces, a late rank) lacks some of that step's
        # collectives on some rank, and the step is left out of the straggler analysis.
        first = int(s_bd["step"].min())  # type: ignore[arg-type]
        if not first_step_complete(s_inst, s_bd, first):
            s_inst = s_inst.filter(pl.col("step") != first)
            s_bd = s_bd.filter(pl.col("step") != first)
            partial_first = first
    if dropped:
        notes.append(
            f"cross-rank analysis restricted to the steps every rank holds: {dropped} step(s) left out"
        )
    n_inst = int(s_inst["instance"].n_unique()) if s_inst.height and "instance" in s_inst.columns else 0
    evidence = gather_evidence(job, steps, clock, n_inst)
    if partial_first is not None:
        note_partial_first_step(evidence, partial_first)
    if len(job.traces) > 1 and (bad := exclude_anomalous(evidence, steps, s_bd)):
        s_inst = s_inst.filter(~pl.col("step").is_in(bad))
        s_bd = s_bd.filter(~pl.col("step").is_in(bad))
    pipe = analyze_pipeline(job, steps, clock.offsets, colls, links)
    if pipe is not None:  # a rank's peers are its stage's replicas (``stragglers.causes``)
        s_bd = with_cohorts(s_bd, pipe.stage_of())
    # what marks the collectives (collectives.py); host issue times lose a step's largest wait
    signals = {sig for c in colls.values() if c.height for sig in c["signal"].unique().to_list()}
    strag = analyze_stragglers(
        s_inst,
        s_bd,
        job.hosts(),
        thresholds,
        dropped_steps=dropped,
        host_issued=bool(signals) and "kernel" not in signals,
        step_spans=steps,
        links=links,
        compute_spans=compute_span_table(job, clock),
    )
    if strag.replay_error:
        notes.append(f"stragglers: no replay ({strag.replay_error}); the verdict is the arrival rules' alone")
    if evidence.anomalous:
        strag.confidence = lowered(strag.confidence)
        evidence.confidence_lowered = True
    withhold(strag, evidence, multi_rank=len(job.traces) > 1)
    mfu = compute_mfu(
        job, steps, bd, clock.offsets, model_flops=model_flops, peak_flops=peak_flops, precision=precision
    )
    attention = {r: f.attention for r, f in job.figures.items()}
    comp = {r: f.compilation for r, f in job.figures.items()}
    extra = seed_analyses(job, steps, colls, clock, pipe)
    extra["uneven_inputs"] = guard_uneven(evidence, extra.get("uneven_inputs"))
    recs = recommend(job, bd, strag, mfu, attention, comp, _comm_by_type(colls), **extra)
    recs = admissible(evidence, recs)
    coll_summary = (
        _collective_summary(instances).with_columns(pl.lit(",".join(sorted(signals))).alias("signal"))
        if instances.height
        else pl.DataFrame(schema={"signal": pl.String})
    )
    if not steps.height:
        notes.append("no steps: neither ProfilerStep#N nor Optimizer.step#... annotations in the traces")
    if not any(c.height for c in colls.values()):
        notes.append("no collectives found (no NCCL kernels, no gloo:* annotations, no c10d:: ops)")
    return Diagnosis(
        job=job,
        clock=clock,
        steps=bd,
        collectives=coll_summary,
        stragglers=strag,
        mfu=mfu,
        recommendations=recs,
        step_source=None if source is None else str(source),
        other_jobs=[{"key": j.key, "ranks": j.ranks, "world_size": j.world_size} for j in jobs[1:]],
        notes=notes,
        evidence=evidence,
        pipeline=extra["pipeline"],
        uneven_inputs=extra["uneven_inputs"],
        recompilation=extra["recompilation"],
        collective_bandwidth=extra["collective_bandwidth"],
    )


def seed_analyses(
    job: Job,
    steps: pl.DataFrame,
    colls: dict[int, pl.DataFrame],
    clock: ClockAlignment,
    pipe: PipelineReport | None = None,
) -> dict[str, Any]:
    """The analyses added for the seeds' problems (docs/diagnosis.md section 11): the JSON values
    of ``EXTRA_KEYS`` plus ``collective_bandwidth`` (evidence of ``exposed-comm``); ``pipe``: the
    pipeline analysis (``pipeline.analyze_pipeline``), made earlier because it also tells the
    straggler analysis each rank's peers."""
    uneven = analyze_uneven(job, steps, colls, clock.offsets)
    compiles = [
        e for r, t in job.traces.items() for e in compile_events(t, r, steps, int(clock.offsets.get(r, 0)))
    ]
    return {
        "pipeline": pipe.to_dict() if pipe else None,
        "uneven_inputs": uneven.to_dict() if uneven else None,
        "recompilation": recompilation_summary(compiles),
        "collective_bandwidth": collective_bandwidth(job.traces, colls, clock.offsets),
    }


def common_steps(instances: pl.DataFrame, bd: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame, int]:
    """Restrict the cross-rank analysis to the steps every rank holds (trace windows of the
    ranks need not be aligned); returns the filtered tables and how many steps were left out."""
    if bd.is_empty():
        return instances, bd, 0
    n = bd["rank"].n_unique()
    per = bd.group_by("step").agg(pl.col("rank").n_unique().alias("_n"))
    keep = per.filter(pl.col("_n") == n)["step"]
    dropped = per.height - keep.len()
    if not dropped:
        return instances, bd, 0
    return (
        instances.filter(pl.col("step").is_in(keep.implode())),
        bd.filter(pl.col("step").is_in(keep.implode())),
        dropped,
    )


def first_step_complete(instances: pl.DataFrame, bd: pl.DataFrame, first: int) -> bool:
    """Whether the first (trace-start-delimited) step holds the whole step on every rank: every
    rank has it, each of its collective instances was matched on every rank, and every rank has
    as many collective instances in it as in its typical (median) later step."""
    ranks = set(bd["rank"].to_list())
    if set(bd.filter(pl.col("step") == first)["rank"].to_list()) != ranks:
        return False
    inst = instances.filter(pl.col("step").is_not_null())
    head = inst.filter(pl.col("step") == first)
    if "group_size" in head.columns:  # complete: every member of the instance's group
        head = head.with_columns(
            _need=pl.when(pl.col("group").fill_null("*") == "*")
            .then(len(ranks))
            .otherwise(pl.col("group_size"))
        )
    else:
        head = head.with_columns(_need=pl.lit(len(ranks)))
    if head.is_empty() or bool((head["n_ranks"] < head["_need"]).any()):
        return False
    per = inst.group_by("rank", "step").agg(pl.len().alias("n"))
    for r in ranks:
        mine = per.filter(pl.col("rank") == r)
        later = mine.filter(pl.col("step") != first)["n"]
        now = mine.filter(pl.col("step") == first)["n"]
        if later.is_empty() or now.is_empty() or int(now[0]) < round(float(later.median())):  # type: ignore[arg-type]
            return False
    return True


def _comm_by_type(colls: dict[int, pl.DataFrame]) -> dict[str, float]:
    """Share of summed collective time per collective type (all ranks)."""
    frames = [
        c.select("coll", (pl.col("end") - pl.col("arrival")).alias("d")) for c in colls.values() if c.height
    ]
    if not frames:
        return {}
    t = pl.concat(frames).group_by("coll").agg(pl.col("d").sum())
    total = float(t["d"].sum()) or 1.0
    return {c: float(d) / total for c, d in t.iter_rows()}


def _collective_summary(instances: pl.DataFrame) -> pl.DataFrame:
    """Per matched collective instance: step, ranks present, typical/last arrival skew."""
    t0 = instances["arrival"].min()
    return (
        instances.group_by("instance", "coll", "step")
        .agg(
            pl.len().cast(pl.Int64).alias("n_ranks"),
            ((pl.col("typical").first() - t0) / 1000.0).alias("typical_arrival(us)"),
            ((pl.col("last").first() - pl.col("typical").first()) / 1000.0).alias("skew(us)"),
            pl.col("rank").sort_by("arrival").last().alias("last_rank"),
            ((pl.col("end") - pl.col("last").first()).median() / 1000.0).alias("transfer(us)"),
        )
        .sort("typical_arrival(us)")
    )
