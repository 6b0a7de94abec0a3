"""What the job diagnosis reads of one rank, extracted from that rank's trace alone.

The diagnosis is cross-rank (clock alignment, collective matching, stragglers, MFU), but almost
everything it reads of a rank depends on that rank only. ``rank_figures(trace)`` computes it
once, as a few small tables (``RankFigures``): O(steps + collective instances) rows, whatever
the number of events. The decision code (``diagnose``: ``align_clocks``, ``step_table``,
``instance_table``, ``rank_breakdown``, ``compute_mfu``, ``recommend``) then reads only these, so

* in one process, ``diagnose`` extracts the figures of each full trace (memoised on it);
* in a map/reduce (``kinetoscope.scale``) each map task extracts its rank's figures and sends
  a ``DigestTrace`` (the metadata + the figures, no events) to the driver, whose memory is then
  O(ranks x instances) and independent of event counts. The document is the same: the same
  functions run on the same rows (``tests/scale`` compares them exactly).

Every per-rank figure is on the rank's **own clock** and keyed by its **local step** (the
``step`` numbers of ``detect_steps``); ``rank_breakdown`` relabels them to the job's steps and
the clock offsets only shift times, which leaves every duration unchanged.

A diagnosis that reads ``trace.events`` directly sees an empty table on a ``DigestTrace``: new
per-rank inputs belong in ``RankFigures`` (and ``rank_figures``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import polars as pl

from kinetoscope.analysis._common import CORE_READS
from kinetoscope.trace.model import Trace, TraceMeta
from kinetoscope.trace.schema import DEVICE_KINDS

if TYPE_CHECKING:
    from kinetoscope.diagnosis.detectors import (
        AttentionFinding,
        CompileFinding,
        CompileRegion,
        LaunchGapCounts,
    )
    from kinetoscope.diagnosis.pipeline_cuts import StepCut
    from kinetoscope.diagnosis.timestamps import TimestampAnomalies

# Per local step (own clock), ns; nulls where the rank had nothing of that kind in the step
STEP_FIGURES_SCHEMA: dict[str, pl.DataType] = {
    "step": pl.Int64(),
    "compute": pl.Int64(),
    "comm": pl.Int64(),
    "exposed_comm": pl.Int64(),
    "busy": pl.Int64(),
    "dataloader": pl.Int64(),
    "launch_gap": pl.Int64(),  # GPU ranks only
    "n_kernels": pl.Int64(),  # GPU ranks only
    "n_host_collectives": pl.Int64(),  # CPU ranks only: backend annotations in the step
}


@dataclass
class RankFigures:
    """One rank's inputs to the job diagnosis (module docstring). Small and picklable."""

    collectives: pl.DataFrame  # ``collectives.extract_collectives`` (own clock)
    steps: pl.DataFrame  # ``analysis.steps.detect_steps``: step, start, end, source (own clock)
    step_figures: pl.DataFrame  # ``STEP_FIGURES_SCHEMA``
    has_device: bool  # the rank has device events (the GPU breakdown applies)
    step_flops: pl.DataFrame  # ``mfu.trace_step_flops`` per local step: step, flops, source
    attention: AttentionFinding
    compilation: CompileFinding
    device: tuple[str | None, int | None]  # ``mfu._device_of``: device name, SM/CU count
    precision_time: dict[str, int]  # ``mfu.precision_time``: GEMM kernel ns per precision
    span: tuple[int, int] | None  # ``Trace.span_ns``
    event_count: int  # rows of the events table (``assembly`` keeps the largest duplicate)
    launch_summary: pl.DataFrame  # ``analysis.launch_stats.kernel_launch_summary`` (defaults)
    # Inputs of the seeds' analyses (``diagnosis.seed_analyses``), own clock, offset-free:
    pipe: dict[int, StepCut] | None  # ``pipeline_cuts.rank_cuts``: local step -> cut; None: no send/recv
    compile_regions: list[CompileRegion]  # ``detectors.compile_regions``: one per compilation
    host_nelems: dict[int, int]  # ``collectives.host_op_nelems``: c10d op start -> elements
    launch_gaps: LaunchGapCounts  # ``detectors.launch_gap_counts``: host-bound gaps, counted
    # ``timestamps.timestamp_anomalies`` (local steps); None for figures made before it existed
    timestamps: TimestampAnomalies | None = None
    # ``whatif.p2p.rank_peers``: transfers with direction and peer; None for older figures
    p2p: pl.DataFrame | None = None
    # GPU pipeline ranks (with transfers): the union of their compute kernels as disjoint
    # ``start``, ``end`` rows (own clock; ``compute_spans``), which splits a pipeline replay's
    # local work into compute and host gap; None for other ranks and older figures
    compute: pl.DataFrame | None = None

    def collectives_of(self, rank: int) -> pl.DataFrame:
        """The collectives labelled with the job's ``rank`` (an unranked trace gets its rank
        when the job is assembled, after the map extracted its figures)."""
        return self.collectives.with_columns(pl.lit(rank, dtype=pl.Int64).alias("rank"))


# What ``rank_figures`` reads of a trace (``kinetoscope.trace.compact.Columns``): the events
# columns of the core analyses' helpers plus the collectives' args, the step FLOPs' inputs and
# the device; no other table. ``tests/scale/test_projection.py`` checks the figures are the same
# on a trace loaded with only these.
READS: dict[str, tuple[str, ...]] = {
    "events": (
        *CORE_READS["events"],
        "device",
        "input_dims",
        "concrete_inputs",
        "flops",
        "seq",
        "collective_name",
        "in_msg_nelems",
        "pg_name",
        "pg_ranks",
        "tid",
    )
}

_TABLES = ("events", "flows", "counters", "instants", "processes", "threads")
_EMPTY: dict[str, pl.DataFrame] = {}


def _empty_tables() -> dict[str, pl.DataFrame]:
    """One set of empty tables shared by every digest in this process: a driver holding
    thousands of digests must not hold thousands of empty 46-column tables."""
    if not _EMPTY:
        from kinetoscope.trace.schema import empty_table

        _EMPTY.update({name: empty_table(name) for name in _TABLES})
    return _EMPTY


@dataclass
class DigestTrace(Trace):
    """A rank's metadata and ``RankFigures`` instead of its events (events tables empty,
    shared; only ``meta`` and ``figures`` are pickled)."""

    figures: RankFigures | None = None

    @classmethod
    def of(cls, meta: TraceMeta, figures: RankFigures) -> DigestTrace:
        return cls(meta=meta, figures=figures, **_empty_tables())

    def __getstate__(self) -> dict[str, Any]:
        return {"meta": self.meta, "figures": self.figures}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(_empty_tables(), **state)

    @property
    def event_count(self) -> int:
        return self.figures.event_count if self.figures is not None else self.events.height

    @property
    def launch_summary(self) -> pl.DataFrame | None:
        return self.figures.launch_summary if self.figures is not None else None

    def span_ns(self) -> tuple[int, int] | None:
        return self.figures.span if self.figures is not None else super().span_ns()


def figures_of(trace: Trace) -> RankFigures:
    """The diagnosis inputs of ``trace``: carried by a ``DigestTrace``, else extracted (memoised)."""
    from kinetoscope.analysis._common import memo

    if isinstance(trace, DigestTrace) and trace.figures is not None:
        return trace.figures
    figures: RankFigures = memo(trace, "diagnosis_figures", lambda: rank_figures(trace))
    return figures


def digest_trace(trace: Trace) -> DigestTrace:
    """``trace`` reduced to its metadata and diagnosis figures (what a map task sends back)."""
    return DigestTrace.of(trace.meta, figures_of(trace))


def rank_figures(trace: Trace) -> RankFigures:
    """Extract everything the diagnosis reads of one rank (see ``RankFigures``)."""
    from kinetoscope.analysis.launch_stats import kernel_launch_summary
    from kinetoscope.analysis.steps import detect_steps
    from kinetoscope.diagnosis.collectives import extract_collectives, host_op_nelems
    from kinetoscope.diagnosis.detectors import (
        compile_regions,
        detect_attention,
        detect_compilation,
        launch_gap_counts,
    )
    from kinetoscope.diagnosis.mfu import _device_of, precision_time, trace_step_flops
    from kinetoscope.diagnosis.pipeline_cuts import rank_cuts
    from kinetoscope.diagnosis.timestamps import timestamp_anomalies

    steps = detect_steps(trace).select("step", "start", "end", "source")
    has_device = trace.events.filter(pl.col("kind").is_in(list(DEVICE_KINDS))).height > 0
    from kinetoscope.diagnosis.whatif.p2p import rank_peers

    colls = extract_collectives(trace)
    parts = _parts(trace, steps, has_device)
    p2p = rank_peers(trace, colls)
    return RankFigures(
        collectives=colls,
        steps=steps,
        step_figures=step_figures(trace, steps, parts),
        has_device=has_device,
        step_flops=trace_step_flops(trace, steps, 0),
        attention=detect_attention(trace),
        compilation=detect_compilation(trace),
        device=_device_of(trace),
        precision_time=precision_time(trace),
        span=Trace.span_ns(trace),
        event_count=trace.events.height,
        launch_summary=kernel_launch_summary([trace]),
        pipe=rank_cuts(trace, steps),
        compile_regions=compile_regions(trace),
        host_nelems=host_op_nelems(trace),
        launch_gaps=launch_gap_counts(trace),
        timestamps=timestamp_anomalies(trace, steps),
        p2p=p2p,
        compute=compute_spans(parts) if has_device and p2p is not None and p2p.height else None,
    )


def _parts(trace: Trace, steps: pl.DataFrame, has_device: bool) -> dict[str, Any]:
    """The rank's compute / comm / other intervals by step and its per-step extras."""
    if steps.is_empty():
        return {"intervals": (), "extra": ()}
    return _device_parts(trace, steps) if has_device else _host_parts(trace, steps)


def compute_spans(parts: dict[str, Any]) -> pl.DataFrame:
    """The union of the rank's compute intervals (``_parts``) as disjoint ``start``, ``end`` rows
    (ns, own clock, sorted): what ``whatif.kineto`` reads to tell compute from host gaps."""
    from kinetoscope.analysis.intervals import merge_intervals_by

    if not parts["intervals"]:
        return pl.DataFrame(schema={"start": pl.Int64, "end": pl.Int64})
    comp = parts["intervals"][0].filter(pl.col("end") > pl.col("ts"))
    return merge_intervals_by(comp.select("ts", "end")).collect().cast(pl.Int64).sort("start")


def step_figures(trace: Trace, steps: pl.DataFrame, parts: dict[str, Any]) -> pl.DataFrame:
    """Per local step: compute / comm / exposed comm / busy (a sweep over the step's intervals,
    ``_parts``), data loading, and on GPU ranks launch gaps and kernel counts (``breakdown``
    docstring)."""
    from kinetoscope.diagnosis.breakdown import DATALOADER_PATTERN, _assign, _union_by

    if steps.is_empty():
        return pl.DataFrame(schema=STEP_FIGURES_SCHEMA)
    ev = trace.events
    dl = _assign(ev.filter(pl.col("name").str.contains(DATALOADER_PATTERN)), steps)
    dl = _union_by(
        dl.filter(pl.col("step").is_not_null()).select(
            "step", "ts", (pl.col("ts") + pl.col("dur")).alias("end")
        ),
        ["step"],
        "dataloader",
    )
    out = steps.select("step")
    for extra in (_sweep(*parts["intervals"]), dl, *parts["extra"]):
        out = out.join(extra, on="step", how="left")
    for c in STEP_FIGURES_SCHEMA:
        if c not in out.columns:
            out = out.with_columns(pl.lit(None, dtype=pl.Int64).alias(c))
    return out.select(list(STEP_FIGURES_SCHEMA)).cast(STEP_FIGURES_SCHEMA)  # type: ignore[arg-type]


def _device_parts(trace: Trace, steps: pl.DataFrame) -> dict[str, Any]:
    """GPU rank: compute / comm / other kernel intervals by launch step, gaps, kernel counts."""
    from kinetoscope.analysis.kernel_types import COMMUNICATION, COMPUTATION, kernel_type_expr
    from kinetoscope.analysis.steps import assign_steps
    from kinetoscope.diagnosis.breakdown import _launch_gaps

    ev = trace.events
    dev = ev.filter(pl.col("kind").is_in(list(DEVICE_KINDS)) & pl.col("stream").is_not_null())
    dev = assign_steps(trace, dev, steps.select("step", "start", "end")).filter(pl.col("step").is_not_null())
    dev = dev.with_columns(ktype=kernel_type_expr("name"), end=pl.col("ts") + pl.col("dur"))
    comp = dev.filter(pl.col("ktype") == COMPUTATION).select("step", "ts", "end")
    comm = dev.filter(pl.col("ktype") == COMMUNICATION).select("step", "ts", "end")  # matched or not
    other = dev.filter(~pl.col("ktype").is_in([COMPUTATION, COMMUNICATION])).select("step", "ts", "end")
    n_k = (
        dev.filter(pl.col("kind") == "kernel")
        .group_by("step")
        .agg(pl.len().cast(pl.Int64).alias("n_kernels"))
    )
    return {"intervals": (comp, comm, other), "extra": (_launch_gaps(trace, dev), n_k)}


def _host_parts(trace: Trace, steps: pl.DataFrame) -> dict[str, Any]:
    """CPU rank: host ops (not communication, not the backend's threads) vs backend annotations."""
    from kinetoscope.diagnosis.breakdown import _assign
    from kinetoscope.diagnosis.collectives import BACKEND_ANNOTATION_PATTERN, collective_host_ops_mask

    ev = trace.events
    ann = ev.filter(
        (pl.col("kind") == "user_annotation") & pl.col("name").str.contains(BACKEND_ANNOTATION_PATTERN)
    )
    host = ev.filter((pl.col("kind") == "cpu_op") & ~collective_host_ops_mask())
    host = _assign(_outside(host, ann), steps)
    comp = host.filter(pl.col("step").is_not_null()).select(
        "step", "ts", (pl.col("ts") + pl.col("dur")).alias("end")
    )
    own = _assign(ann, steps)
    comm = own.filter(pl.col("step").is_not_null()).select(
        "step", "ts", (pl.col("ts") + pl.col("dur")).alias("end")
    )
    n_c = comm.group_by("step").agg(pl.len().cast(pl.Int64).alias("n_host_collectives"))
    return {"intervals": (comp, comm, comp.clear()), "extra": (n_c,)}


def _outside(ops: pl.DataFrame, ann: pl.DataFrame) -> pl.DataFrame:
    """The host ops that start outside every backend annotation of their thread: the time
    inside one is communication, whichever thread runs it (gloo's workers for buckets, the main
    thread for a pipeline's send and receive)."""
    from kinetoscope.analysis.intervals import merge_intervals_by

    if not ann.height or not ops.height:
        return ops
    spans = (
        merge_intervals_by(ann.select("tid", "ts", (pl.col("ts") + pl.col("dur")).alias("end")), ["tid"])
        .collect()
        .select(pl.col("tid").cast(ops.schema["tid"]), pl.col("start").alias("_a"), pl.col("end").alias("_b"))
        .sort("_a")
    )
    hit = ops.sort("ts").join_asof(
        spans, left_on="ts", right_on="_a", by="tid", strategy="backward", check_sortedness=False
    )
    return hit.filter(pl.col("_b").is_null() | (pl.col("ts") >= pl.col("_b"))).drop("_a", "_b")


def _sweep(comp: pl.DataFrame, comm: pl.DataFrame, other: pl.DataFrame) -> pl.DataFrame:
    """Per step: time with compute, with comm, with comm but no compute, with anything (ns)."""
    from kinetoscope.analysis.intervals import merge_intervals_by, sweep_states

    bits = pl.concat(
        [
            comp.with_columns(bit=pl.lit(1, pl.Int64)),
            comm.with_columns(bit=pl.lit(2, pl.Int64)),
            other.with_columns(bit=pl.lit(4, pl.Int64)),
        ]
    ).filter(pl.col("step").is_not_null() & (pl.col("end") > pl.col("ts")))
    if not bits.height:
        return pl.DataFrame(
            schema={
                "step": pl.Int64,
                "compute": pl.Int64,
                "comm": pl.Int64,
                "exposed_comm": pl.Int64,
                "busy": pl.Int64,
            }
        )
    merged = merge_intervals_by(bits, ["step", "bit"])
    seg = sweep_states(merged, ["step"]).with_columns(_len=pl.col("next_t") - pl.col("t")).collect()
    return seg.group_by("step").agg(
        pl.col("_len").filter((pl.col("state") & 1) > 0).sum().alias("compute"),
        pl.col("_len").filter((pl.col("state") & 2) > 0).sum().alias("comm"),
        pl.col("_len").filter((pl.col("state") & 3) == 2).sum().alias("exposed_comm"),
        pl.col("_len").sum().alias("busy"),
    )


__all__ = [
    "READS",
    "STEP_FIGURES_SCHEMA",
    "DigestTrace",
    "RankFigures",
    "digest_trace",
    "figures_of",
    "rank_figures",
]
