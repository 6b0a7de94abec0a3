"""Pattern detectors over single traces that feed the recommendations.

Attention path (per rank)
    *math path*: ``aten::_scaled_dot_product_attention_math`` ops (SDPA fell back to the
    unfused implementation), and hand-written attention: on one thread, the sequence of
    outermost matmul-like ops (``aten::matmul``/``bmm``/``baddbmm``/``einsum``) and softmax ops
    (``aten::softmax``/``_softmax``) contains ``matmul, softmax, matmul``.
    *fused path*: ``aten::_scaled_dot_product_{flash,efficient,cudnn}_attention*``,
    ``aten::_flash_attention_forward``, ``aten::_efficient_attention_forward``, or kernels
    named ``*flash*``/``*fmha*``/``*efficient_attention*``/``*AttentionKernel*``.

Recompilation (per rank), from TorchDynamo/Inductor annotations
    ``Torch-Compiled Region: F/C`` (cpu_op; ``C`` > 0 is a recompiled version of frame ``F``),
    compile annotations carrying ``compile_id=F/C`` (``entire_frame_compile_data``,
    ``dynamo_data``, ...), one per compilation inside the trace window; the compile time is the
    union of the ``dynamo`` / ``entire_frame_compile`` / ``_compile.compile_inner (dynamo_timed)``
    spans; ``TorchDynamo Cache Lookup`` counts guard evaluations (one per call).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson
import polars as pl

from kinetoscope.analysis.intervals import busy_span
from kinetoscope.trace.model import Trace
from kinetoscope.trace.schema import RUNTIME_KINDS

MATH_SDPA = r"^aten::_scaled_dot_product_attention_math"
FUSED_SDPA = (
    r"^aten::_scaled_dot_product_(?:flash|efficient|cudnn|fused)\w*attention|^aten::_flash_attention_forward"
    r"|^aten::_efficient_attention_forward"
)
FUSED_KERNEL = r"(?i)flash|fmha|efficient_attention|AttentionKernel|attn_fwd"
_MM = r"^aten::(?:matmul|bmm|baddbmm|einsum)$"
_SOFTMAX = r"^aten::_?softmax$"
_SDPA = r"^aten::_?scaled_dot_product"

_REGION = re.compile(r"^Torch-Compiled Region: (\d+)/(\d+)")
_COMPILE_ID = re.compile(r"compile_id=(\d+)/(\d+)")
# Spans of Dynamo compile work (PyTorch 2.x ``dynamo_timed`` regions), unioned.
_COMPILE_SPANS = (
    "dynamo",
    "entire_frame_compile",
    "_compile.compile_inner (dynamo_timed)",
    "compile_fx_inner",
)


@dataclass
class AttentionFinding:
    math_sdpa_ops: int = 0
    manual_patterns: int = 0
    fused_ops: int = 0
    fused_kernels: int = 0
    math_time_us: float = 0.0

    @property
    def math_path(self) -> bool:
        return (self.math_sdpa_ops + self.manual_patterns) > 0 and (self.fused_ops + self.fused_kernels) == 0


def _outermost(df: pl.DataFrame) -> pl.DataFrame:
    df = df.sort("tid", "ts", pl.col("dur"), descending=[False, False, True]).with_columns(
        _enc=(pl.col("ts") + pl.col("dur")).cum_max().shift(1).over("tid")
    )
    return df.filter(pl.col("_enc").is_null() | (pl.col("ts") >= pl.col("_enc"))).drop("_enc")


def _first_dims(s: str | None) -> list[int] | None:
    if not s:
        return None
    try:
        v = orjson.loads(s)
    except orjson.JSONDecodeError:
        return None
    if isinstance(v, list) and v and isinstance(v[0], list) and all(isinstance(x, int) for x in v[0]):
        return v[0]
    return None


def _attention_shapes(
    da: str | None, db: str | None, dc: str | None, a: dict[str, Any], b: dict[str, Any], c: dict[str, Any]
) -> bool:
    """matmul -> softmax -> matmul looks like attention: the softmax input is at least 3-D (batch
    [x heads] x queries x keys) and has the shape of the first product and of the second
    product's first operand. Without recorded shapes: the three ops follow each other within
    1 ms (a weaker sign)."""
    sa, sb, sc = _first_dims(da), _first_dims(db), _first_dims(dc)
    if sb is None:
        gap1 = b["ts"] - (a["ts"] + a["dur"])
        gap2 = c["ts"] - (b["ts"] + b["dur"])
        return sa is None and 0 <= gap1 <= 1_000_000 and 0 <= gap2 <= 1_000_000
    if len(sb) < 3 or sb[-1] < 2:
        return False
    if sa is not None and (len(sa) != len(sb) or sa[:-1] != sb[:-1]):
        return False
    return sc is None or sc == sb


def detect_attention(trace: Trace) -> AttentionFinding:
    ev = trace.events
    f = AttentionFinding()
    # the CPU ops' columns read below only (not a copy of every column of half the events)
    ops = ev.select("kind", "tid", "ts", "dur", "name", "input_dims").filter(pl.col("kind") == "cpu_op")
    math = ops.filter(pl.col("name").str.contains(MATH_SDPA))
    f.math_sdpa_ops = math.height
    f.math_time_us = float(math["dur"].sum() or 0) / 1000.0
    f.fused_ops = ops.filter(pl.col("name").str.contains(FUSED_SDPA)).height
    f.fused_kernels = ev.filter(
        (pl.col("kind") == "kernel") & pl.col("name").str.contains(FUSED_KERNEL)
    ).height
    # SDPA ops are in the sequence too, so that the matmul/softmax inside a math-path SDPA are
    # nested (not outermost) and not counted a second time as hand-written attention.
    seq = ops.filter(
        pl.col("name").str.contains(_MM)
        | pl.col("name").str.contains(_SOFTMAX)
        | pl.col("name").str.contains(_SDPA)
    ).select("tid", "ts", "dur", "name", "input_dims")
    if seq.height >= 3:
        seq = _outermost(seq).sort("tid", "ts")
        rows = seq.to_dicts()
        i = 0
        while i + 2 < len(rows):
            a, b, c = rows[i], rows[i + 1], rows[i + 2]
            if (
                a["tid"] == b["tid"] == c["tid"]
                and re.match(_MM, a["name"])
                and re.match(_SOFTMAX, b["name"])
                and re.match(_MM, c["name"])
                and _attention_shapes(a["input_dims"], b["input_dims"], c["input_dims"], a, b, c)
            ):
                f.manual_patterns += 1
                f.math_time_us += (a["dur"] + b["dur"] + c["dur"]) / 1000.0
                i += 3
            else:
                i += 1
    return f


@dataclass
class CompileFinding:
    frames: set[int] = field(default_factory=set)
    compile_ids: set[tuple[int, int]] = field(default_factory=set)
    recompiles: int = 0  # compile ids with C > 0
    compile_time_us: float = 0.0  # compile work inside the window
    compiles_in_window: int = 0
    cache_lookups: int = 0
    compiled_region_calls: int = 0

    @property
    def uses_compile(self) -> bool:
        return bool(self.compiled_region_calls or self.compile_ids or self.cache_lookups)


def detect_compilation(trace: Trace) -> CompileFinding:
    ev = trace.events
    f = CompileFinding()
    reg = ev.filter(pl.col("name").str.starts_with("Torch-Compiled Region"))
    f.compiled_region_calls = reg.height
    for name in reg["name"].unique().to_list():
        m = _REGION.match(name)
        if m:
            f.frames.add(int(m.group(1)))
            f.compile_ids.add((int(m.group(1)), int(m.group(2))))
    f.cache_lookups = ev.filter(pl.col("name") == "TorchDynamo Cache Lookup").height
    comp = ev.filter(pl.col("name").str.contains(r"compile_id=\d+/\d+"))
    whole = ev.filter(pl.col("name").is_in(list(_COMPILE_SPANS)))
    if whole.is_empty():
        whole = comp.filter(pl.col("name").str.starts_with("entire_frame_compile"))
    ids_in_window = set()
    for name in comp["name"].to_list():
        m = _COMPILE_ID.search(name)
        if m:
            ids_in_window.add((int(m.group(1)), int(m.group(2))))
    f.compile_ids |= ids_in_window
    f.compiles_in_window = len(ids_in_window)
    if whole.height:
        f.compile_time_us = (
            busy_span(whole.select("ts", (pl.col("ts") + pl.col("dur")).alias("end")))["busy"][0] / 1000.0
        )
    f.recompiles = sum(1 for _fr, c in f.compile_ids if c > 0)
    return f


@dataclass
class LaunchGaps:
    """Host-bound GPU idle of one rank: gaps before a device event whose launch call came after
    the GPU had run out of queued work (the same rule as ``breakdown``'s ``launch_gap``), one
    value per gap. ``median_gap_us``: the typical wait for the host per such kernel."""

    gaps_us: list[float] = field(default_factory=list)
    device_events: int = 0

    @property
    def median_gap_us(self) -> float | None:
        return float(np.median(self.gaps_us)) if self.gaps_us else None


def detect_launch_gaps(trace: Trace) -> LaunchGaps:
    dev = trace.device_events()
    if dev.is_empty():
        return LaunchGaps()
    return LaunchGaps(gaps_us=(_host_gaps_ns(trace, dev) / 1000.0).to_list(), device_events=dev.height)


def _host_gaps_ns(trace: Trace, dev: pl.DataFrame) -> pl.Series:
    """The host-bound gaps before ``dev`` events (``LaunchGaps``), ns, in device time order."""
    launches = (  # ``trace.runtime()``'s rows, the two columns read (not a copy of every column)
        trace.events.lazy()
        .select("kind", "correlation", "ts")
        .filter(pl.col("kind").is_in(list(RUNTIME_KINDS)) & pl.col("correlation").is_not_null())
        .group_by("correlation")
        .agg(pl.col("ts").min().alias("_lts"))
        .collect()
    )
    d = (
        dev.select("ts", (pl.col("ts") + pl.col("dur")).alias("end"), "correlation")
        .sort("ts")
        .with_columns(_front=pl.col("end").cum_max().shift(1))
        .join(launches, on="correlation", how="left")
        .with_columns(_gap=(pl.col("ts") - pl.col("_front")).clip(lower_bound=0))
    )
    host = d.filter((pl.col("_gap") > 0) & pl.col("_lts").is_not_null() & (pl.col("_lts") > pl.col("_front")))
    return host["_gap"]


@dataclass
class LaunchGapCounts:
    """One rank's host-bound gaps (``LaunchGaps``) as distinct lengths (ns, ascending) and how
    many gaps have each: the per-rank figure (``extract.RankFigures.launch_gaps``), from which
    the job's pooled median and count are exact (``pooled_launch_gaps``)."""

    gap_ns: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=np.int64))
    count: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=np.int64))


def launch_gap_counts(trace: Trace) -> LaunchGapCounts:
    """``trace``'s host-bound gaps, counted by length (``LaunchGapCounts``)."""
    dev = trace.device_events()
    if dev.is_empty():
        return LaunchGapCounts()
    values, counts = np.unique(_host_gaps_ns(trace, dev).to_numpy().astype(np.int64), return_counts=True)
    return LaunchGapCounts(gap_ns=values, count=counts.astype(np.int64))


def pooled_launch_gaps(ranks: list[LaunchGapCounts]) -> tuple[float | None, int]:
    """The median host-bound gap (us) over every gap of every rank in ``ranks`` (None without
    gaps) and the number of gaps: ``np.median`` of all ``LaunchGaps.gaps_us`` pooled."""
    if not ranks:
        return None, 0
    values = np.concatenate([r.gap_ns for r in ranks])
    counts = np.concatenate([r.count for r in ranks])
    n = int(counts.sum())
    if n == 0:
        return None, 0
    order = np.argsort(values, kind="stable")
    values, cum = values[order], np.cumsum(counts[order])
    lo = values[int(np.searchsorted(cum, (n - 1) // 2, side="right"))] / 1000.0
    hi = values[int(np.searchsorted(cum, n // 2, side="right"))] / 1000.0
    return float(np.mean([lo, hi])), n


_DATA = re.compile(r"^(?:dynamo_data|entire_frame_compile_data)\b.*compile_id=(\d+)/(\d+)")


@dataclass(frozen=True)
class CompileRegion:
    """One compilation of a rank on its own clock (``compile_regions``): frame ``F``, compile
    count ``C``, the start of the outermost compile span holding its annotation (else the
    annotation's time) and that span's end (None without a span)."""

    frame: int
    count: int
    start: int
    end: int | None


def compile_regions(trace: Trace) -> list[CompileRegion]:
    """The compilations of one rank in annotation order, first annotation of each ``F/C`` only
    (the per-rank figure ``extract.RankFigures.compile_regions``, read by
    ``recompile.compile_events``; O(compilations))."""
    ev = trace.events
    ann = ev.filter(
        pl.col("name").str.contains(r"^(?:dynamo_data|entire_frame_compile_data)\b.*compile_id=\d+/\d+")
    )
    spans = ev.filter(pl.col("name").is_in(list(_COMPILE_SPANS)) & pl.col("dur").is_not_null()).select(
        "ts", (pl.col("ts") + pl.col("dur")).alias("end")
    )
    seen: dict[tuple[int, int], CompileRegion] = {}
    for name, ts in ann.sort("ts").select("name", "ts").iter_rows():
        m = _DATA.match(name)
        if not m:
            continue
        key = (int(m.group(1)), int(m.group(2)))
        if key in seen:
            continue
        around = spans.filter((pl.col("ts") <= ts) & (pl.col("end") >= ts)).sort("ts")
        start, end = (int(around["ts"][0]), int(around["end"].max())) if around.height else (int(ts), None)  # type: ignore[arg-type]
        seen[key] = CompileRegion(frame=key[0], count=key[1], start=start, end=end)
    return list(seen.values())
