"""Model FLOPs Utilisation (MFU).

Formula (PaLM; seed 002's FSDP appendix)::

    FLOPS_per_step = 6 * tokens_per_batch * num_params          (dense transformer, fwd + bwd)
    MFU = FLOPS_per_step / step_time_s / chip_count / FLOPS_per_chip

* ``FLOPS_per_step``: ``--model-flops`` (FLOPs of one *global* training step, all ranks
  together, e.g. ``6 * tokens_per_batch * num_params``) when given; else measured from the
  trace: the FLOPs of the matrix ops of each rank in each step, summed over the ranks found and
  scaled to the world size. Per op: the ``flops`` arg the profiler writes with
  ``with_flops=True`` (older PyTorch versions export it), else an estimate from the recorded
  input shapes (``record_shapes``): ``2*M*K*N`` for ``mm``/``addmm``, ``2*B*M*K*N`` for
  ``bmm``/``baddbmm``, ``2*N*Cout*Hout*Wout*Cin/groups*kh*kw`` for ``convolution`` (x2 per
  gradient for ``convolution_backward``), ``4*B*H*Lq*Lk*D`` for SDPA forward (x2.5 backward).
  Only the outermost counted op of a nest is counted (``conv2d > convolution >
  mkldnn_convolution`` counts once). These are hardware FLOPs of what ran (recomputation
  included), so with activation checkpointing this is closer to HFU than MFU.
* ``step_time_s``: the job's median step time (median over ranks, then over steps).
* ``chip_count``: the world size (every rank drives one device).
* ``FLOPS_per_chip``: ``--peak-flops`` when given, else the dense peak of the device named in
  ``deviceProperties`` (``PEAK_FLOPS``), for the precision the GEMM kernels ran in (kernel names:
  ``bf16``/``f16``/``tf32``...; default bf16, stated as an assumption). Peaks are dense (no
  2:4 sparsity), datasheet boost clocks.
* CPU-only traces: MFU is not computed (there is no accelerator peak to divide by and a CPU's
  peak depends on cores, SIMD width and clocks in use) unless ``--peak-flops`` gives one.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson
import polars as pl

from kinetoscope.diagnosis.assembly import Job
from kinetoscope.trace.model import Trace

TFLOPS = 1e12

# Dense peak FLOP/s per device, by precision. MI250/MI250X: per GCD (each GCD is one PyTorch
# device; the package holds two). V100 has no bf16 tensor cores and no tf32 (fp32 rate used).
PEAK_FLOPS: dict[str, dict[str, float]] = {
    "V100 SXM2": {"fp16": 125 * TFLOPS, "bf16": 15.7 * TFLOPS, "tf32": 15.7 * TFLOPS, "fp32": 15.7 * TFLOPS},
    "V100 PCIe": {"fp16": 112 * TFLOPS, "bf16": 14 * TFLOPS, "tf32": 14 * TFLOPS, "fp32": 14 * TFLOPS},
    "V100S PCIe": {"fp16": 130 * TFLOPS, "bf16": 16.4 * TFLOPS, "tf32": 16.4 * TFLOPS, "fp32": 16.4 * TFLOPS},
    "A100": {"bf16": 312 * TFLOPS, "fp16": 312 * TFLOPS, "tf32": 156 * TFLOPS, "fp32": 19.5 * TFLOPS},
    "H100 SXM": {
        "bf16": 989.4 * TFLOPS,
        "fp16": 989.4 * TFLOPS,
        "tf32": 494.7 * TFLOPS,
        "fp32": 66.9 * TFLOPS,
    },
    "H100 PCIe": {
        "bf16": 756.5 * TFLOPS,
        "fp16": 756.5 * TFLOPS,
        "tf32": 378 * TFLOPS,
        "fp32": 51.2 * TFLOPS,
    },
    "H100 NVL": {"bf16": 835.5 * TFLOPS, "fp16": 835.5 * TFLOPS, "tf32": 417.5 * TFLOPS, "fp32": 60 * TFLOPS},
    "H200 SXM": {
        "bf16": 989.4 * TFLOPS,
        "fp16": 989.4 * TFLOPS,
        "tf32": 494.7 * TFLOPS,
        "fp32": 66.9 * TFLOPS,
    },
    "H200 NVL": {"bf16": 835.5 * TFLOPS, "fp16": 835.5 * TFLOPS, "tf32": 417.5 * TFLOPS, "fp32": 60 * TFLOPS},
    "H800 SXM": {
        "bf16": 989.4 * TFLOPS,
        "fp16": 989.4 * TFLOPS,
        "tf32": 494.7 * TFLOPS,
        "fp32": 66.9 * TFLOPS,
    },
    "H800 PCIe": {
        "bf16": 756.5 * TFLOPS,
        "fp16": 756.5 * TFLOPS,
        "tf32": 378 * TFLOPS,
        "fp32": 51.2 * TFLOPS,
    },
    "B200": {"bf16": 2250 * TFLOPS, "fp16": 2250 * TFLOPS, "tf32": 1100 * TFLOPS, "fp32": 75 * TFLOPS},
    "MI250 (per GCD)": {
        "bf16": 181.0 * TFLOPS,
        "fp16": 181.0 * TFLOPS,
        "tf32": 45.3 * TFLOPS,
        "fp32": 45.3 * TFLOPS,
    },
    "MI250X (per GCD)": {
        "bf16": 191.5 * TFLOPS,
        "fp16": 191.5 * TFLOPS,
        "tf32": 47.9 * TFLOPS,
        "fp32": 47.9 * TFLOPS,
    },
    "MI300X": {
        "bf16": 1307.4 * TFLOPS,
        "fp16": 1307.4 * TFLOPS,
        "tf32": 653.7 * TFLOPS,
        "fp32": 163.4 * TFLOPS,
    },
}

# (pattern on the lower-cased device name, table key); first match wins.
_NAME_RULES: list[tuple[str, str]] = [
    (r"mi300x", "MI300X"),
    (r"mi250x", "MI250X (per GCD)"),
    (r"mi250", "MI250 (per GCD)"),
    (r"b200", "B200"),
    (r"h800.*pcie", "H800 PCIe"),
    (r"h800", "H800 SXM"),
    (r"h200.*nvl", "H200 NVL"),
    (r"h200", "H200 SXM"),
    (r"h100.*pcie", "H100 PCIe"),
    (r"h100.*nvl", "H100 NVL"),
    (r"h100", "H100 SXM"),
    (r"a100", "A100"),
    (r"v100s", "V100S PCIe"),
    (r"v100.*pcie", "V100 PCIe"),
    (r"v100", "V100 SXM2"),
]
# ROCm often reports a generic name ("AMD Radeon Graphics"): match on compute units per device.
_AMD_BY_CUS = {104: "MI250 (per GCD)", 110: "MI250X (per GCD)", 304: "MI300X"}

PRECISIONS = ("bf16", "fp16", "tf32", "fp32")
_GEMM_KERNEL = r"(?i)gemm|cutlass|xmma|matmul|cublas|hgemm|sgemm|wgmma|mma|conv|ampere_|sm\d\d_|Cijk"
_PREC_RULES = [
    ("bf16", r"(?i)bf16|bfloat16"),
    ("fp16", r"(?i)fp16|f16|half|h884|h1688|h16816|hgemm"),
    ("tf32", r"(?i)tf32"),
    ("fp32", r"(?i)sgemm|fp32|f32|float"),
]


def match_device(name: str | None, cus: int | None = None, vendor_amd: bool = False) -> str | None:
    """Peak-table key for a device name (``deviceProperties[].name``), or None."""
    low = (name or "").lower()
    if "mi250" in low and cus in (104, 110):  # ROCm may name both "MI250X / MI250"
        return _AMD_BY_CUS[cus]
    for pat, key in _NAME_RULES:
        if re.search(pat, low):
            return key
    if (vendor_amd or "amd" in low or "radeon" in low or "instinct" in low) and cus in _AMD_BY_CUS:
        return _AMD_BY_CUS[cus]
    return None


def _device_of(trace: Trace) -> tuple[str | None, int | None]:
    props = trace.meta.device_properties
    if not props:
        return None, None
    dev = trace.events.filter(pl.col("kind") == "kernel")["device"].drop_nulls()
    want = int(dev.mode()[0]) if dev.len() else None
    pick = next((p for p in props if want is not None and p.get("id") == want), props[0])
    return pick.get("name"), pick.get("numSms")


def precision_time(trace: Trace) -> dict[str, int]:
    """GEMM-kernel time (ns) of one trace per precision (kernel-name markers)."""
    acc = {p: 0 for p in PRECISIONS}
    k = trace.events.filter((pl.col("kind") == "kernel") & pl.col("name").str.contains(_GEMM_KERNEL))
    if k.is_empty():
        return acc
    for prec, pat in _PREC_RULES:
        m = k.filter(pl.col("name").str.contains(pat))
        acc[prec] += int(m["dur"].sum() or 0)
        k = k.filter(~pl.col("name").str.contains(pat))
    return acc


def pick_precision(per_rank: Iterable[dict[str, int]]) -> str | None:
    """The precision of most GEMM-kernel time over the ranks (``precision_time`` each), or None."""
    acc = {p: 0 for p in PRECISIONS}
    for one in per_rank:
        for p, v in one.items():
            acc[p] += v
    best = max(acc, key=lambda p: acc[p])
    return best if acc[best] > 0 else None


def detect_precision(traces: Iterable[Trace]) -> str | None:
    """The precision of most GEMM-kernel time (kernel-name markers), or None."""
    return pick_precision(precision_time(t) for t in traces)


# ---- FLOPs from the trace -------------------------------------------------------------------------

_FLOP_OPS = re.compile(
    r"^aten::(mm|addmm|bmm|baddbmm|convolution|convolution_backward|_scaled_dot_product_\w+attention\w*)$"
)


def _dims(s: str | None) -> list[list[int]] | None:
    if not s:
        return None
    try:
        v = orjson.loads(s)
    except orjson.JSONDecodeError:
        return None
    return v if isinstance(v, list) else None


def _concrete(s: str | None) -> list[Any]:
    if not s:
        return []
    try:
        v = orjson.loads(s)
    except orjson.JSONDecodeError:
        return []
    return v if isinstance(v, list) else []


def _pair(v: Any, n: int, default: int) -> list[int]:
    if isinstance(v, str):
        try:
            v = orjson.loads(v) if v else None
        except orjson.JSONDecodeError:
            v = None
    if isinstance(v, list) and v:
        vals = [int(x) for x in v]
        return vals * n if len(vals) == 1 else vals[:n]
    if isinstance(v, (int, float)):
        return [int(v)] * n
    return [default] * n


def estimate_op_flops(name: str, dims_s: str | None, concrete_s: str | None) -> float | None:
    """FLOPs of one op from its recorded input shapes (see module docstring), or None."""
    m = _FLOP_OPS.match(name)
    d = _dims(dims_s)
    if not m or not d:
        return None
    op = m.group(1)
    try:
        if op == "mm":
            (mm, k), (_, n) = d[0], d[1]
            return 2.0 * mm * k * n
        if op == "addmm":
            (mm, k), (_, n) = d[1], d[2]
            return 2.0 * mm * k * n
        if op == "bmm":
            (b, mm, k), (_, _, n) = d[0], d[1]
            return 2.0 * b * mm * k * n
        if op == "baddbmm":
            (b, mm, k), (_, _, n) = d[1], d[2]
            return 2.0 * b * mm * k * n
        if op in ("convolution", "convolution_backward"):
            c = _concrete(concrete_s)
            if op == "convolution":
                x, w = d[0], d[1]
                nsp = len(x) - 2
                stride, pad, dil = (
                    _pair(c[i] if len(c) > i else None, nsp, dflt) for i, dflt in ((3, 1), (4, 0), (5, 1))
                )
                groups = int(c[8]) if len(c) > 8 and str(c[8]).lstrip("-").isdigit() else 1
                out = [
                    (x[2 + i] + 2 * pad[i] - dil[i] * (w[2 + i] - 1) - 1) // stride[i] + 1 for i in range(nsp)
                ]
                return (
                    2.0 * x[0] * w[0] * float(np.prod(out)) * (x[1] // max(groups, 1)) * float(np.prod(w[2:]))
                )
            gout, x, w = d[0], d[1], d[2]
            mask = c[10] if len(c) > 10 else "[True, True, True]"
            n_grads = sum(1 for t in str(mask).split(",")[:2] if "True" in t) or 2
            fwd = 2.0 * gout[0] * gout[1] * float(np.prod(gout[2:])) * x[1] * float(np.prod(w[2:]))
            return fwd * n_grads
        if "attention" in op:
            q_dims, k_dims = d[0], d[1]
            if len(q_dims) < 3 or len(k_dims) < 3:
                return None
            batch = float(np.prod(q_dims[:-2]))
            f = 4.0 * batch * q_dims[-2] * k_dims[-2] * q_dims[-1]
            return f * 2.5 if "backward" in op else f
    except (TypeError, ValueError, IndexError):
        return None
    return None


def trace_step_flops(trace: Trace, steps_r: pl.DataFrame, offset: int) -> pl.DataFrame:
    """FLOPs per step of one rank: ``step, flops, source`` (outermost counted ops only)."""
    # one filter, the candidates only (not a copy of every CPU op first: a huge trace's events)
    cand = trace.events.filter(
        (pl.col("kind") == "cpu_op")
        & (pl.col("flops").is_not_null() | pl.col("name").str.contains(_FLOP_OPS.pattern))
    )
    if cand.is_empty() or steps_r.is_empty():
        return pl.DataFrame(schema={"step": pl.Int64, "flops": pl.Float64, "source": pl.String})
    rows = cand.select("tid", "ts", "dur", "name", "flops", "input_dims", "concrete_inputs").to_dicts()
    vals: list[float | None] = []
    srcs: list[str] = []
    for r in rows:
        if r["flops"] is not None:
            vals.append(float(r["flops"]))
            srcs.append("trace")
        else:
            vals.append(estimate_op_flops(r["name"], r["input_dims"], r["concrete_inputs"]))
            srcs.append("shapes")
    df = (
        cand.select("tid", "ts", "dur")
        .with_columns(pl.Series("f", vals, dtype=pl.Float64), pl.Series("src", srcs, dtype=pl.String))
        .filter(pl.col("f").is_not_null())
    )
    if df.is_empty():
        return pl.DataFrame(schema={"step": pl.Int64, "flops": pl.Float64, "source": pl.String})
    # outermost only: drop ops that start before the running max end of earlier ops on the thread
    df = df.sort("tid", "ts", pl.col("dur"), descending=[False, False, True]).with_columns(
        _enc=(pl.col("ts") + pl.col("dur")).cum_max().shift(1).over("tid")
    )
    df = df.filter(pl.col("_enc").is_null() | (pl.col("ts") >= pl.col("_enc")))
    win = steps_r.select(
        (pl.col("start") - offset).alias("ts"), (pl.col("end") - offset).alias("_e"), pl.col("step")
    ).sort("ts")
    placed = df.sort("ts").join_asof(win, on="ts", strategy="backward").filter(pl.col("ts") < pl.col("_e"))
    per_step: pl.DataFrame = placed.group_by("step").agg(
        pl.col("f").sum().alias("flops"), pl.col("src").mode().first().alias("source")
    )
    return per_step


@dataclass
class MFUResult:
    mfu: float | None = None
    flops_per_step: float | None = None  # global (all ranks) per step
    flops_source: str | None = None  # model_flops | trace | shapes
    step_time_s: float | None = None
    chips: int | None = None
    peak_flops_per_chip: float | None = None
    peak_source: str | None = None
    device: str | None = None
    device_key: str | None = None
    precision: str | None = None
    achieved_flops_per_chip: float | None = None
    reason: str | None = None
    assumptions: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "mfu": self.mfu,
            "flops_per_step": self.flops_per_step,
            "flops_source": self.flops_source,
            "step_time_s": self.step_time_s,
            "chips": self.chips,
            "achieved_flops_per_chip": self.achieved_flops_per_chip,
            "peak_flops_per_chip": self.peak_flops_per_chip,
            "peak_source": self.peak_source,
            "device": self.device,
            "device_key": self.device_key,
            "precision": self.precision,
            "reason": self.reason,
            "assumptions": list(self.assumptions),
            "formula": "MFU = FLOPS_per_step / step_time_s / chip_count / FLOPS_per_chip",
        }


def compute_mfu(
    job: Job,
    steps: pl.DataFrame,
    breakdown: pl.DataFrame,
    clock_offsets: dict[int, int],
    *,
    model_flops: float | None = None,
    peak_flops: float | None = None,
    precision: str | None = None,
) -> MFUResult:
    res = MFUResult()
    if breakdown.is_empty():
        res.reason = "no training steps found (no ProfilerStep#N and no Optimizer.step annotations)"
        return res
    per_step = breakdown.group_by("step").agg(pl.col("step_time(us)").median().alias("T"))
    res.step_time_s = float(per_step["T"].median()) / 1e6  # type: ignore[arg-type]
    world = job.world_size or len(job.traces)
    res.chips = world
    # FLOPs per global step
    if model_flops:
        res.flops_per_step = float(model_flops)
        res.flops_source = "model_flops"
    else:
        _trace_flops(res, job, world)
    # peak
    is_cpu = all(t.meta.device_type == "CPU" for t in job.traces.values())
    if peak_flops:
        res.peak_flops_per_chip = float(peak_flops)
        res.peak_source = "--peak-flops"
    elif not is_cpu:
        _table_peak(res, job, precision)
    if res.flops_per_step is None:
        res.reason = (
            "no FLOPs: pass --model-flops (e.g. 6 * tokens_per_batch * num_params per step), or "
            "record the trace with with_flops=True / record_shapes=True"
        )
        return res
    res.achieved_flops_per_chip = res.flops_per_step / res.step_time_s / world if res.step_time_s else None
    if res.peak_flops_per_chip is None:
        res.reason = _no_peak_reason(res, is_cpu)
        return res
    if res.achieved_flops_per_chip is not None:
        res.mfu = res.achieved_flops_per_chip / res.peak_flops_per_chip
    res.assumptions.append("one device per rank; chip_count = world size")
    return res


def _trace_flops(res: MFUResult, job: Job, world: int) -> None:
    """FLOPs per global step from the ranks' traces (``with_flops`` or recorded shapes): the
    mean over ranks of each rank's median step, scaled to the world size."""
    per_rank = []
    srcs = set()
    for fig in job.figures.values():  # per local step: only the median per rank is used
        f = fig.step_flops
        if f.height:
            per_rank.append(float(f["flops"].median()))
            srcs.update(f["source"].to_list())
    if not per_rank:
        return
    res.flops_per_step = float(np.mean(per_rank)) * world
    res.flops_source = "trace" if srcs == {"trace"} else "shapes"
    if len(per_rank) < world:
        res.assumptions.append(
            f"FLOPs measured on {len(per_rank)} of {world} ranks and scaled to the world size"
        )
    if res.flops_source == "shapes":
        res.assumptions.append(
            "FLOPs estimated from recorded input shapes of matmul/conv/attention ops "
            "(other ops ignored; recomputation counted)"
        )


def _table_peak(res: MFUResult, job: Job, precision: str | None) -> None:
    """The device (first rank's) and its peak FLOPs from ``PEAK_FLOPS`` at the precision asked,
    else the one the GEMM kernels' names show most (bf16 when none does)."""
    t0 = next(iter(job.traces.values()))
    name, cus = next(iter(job.figures.values())).device  # t0's (same order as job.traces)
    res.device = name
    key = match_device(name, cus, vendor_amd=t0.meta.device_type == "AMD GPU")
    res.device_key = key
    prec = precision or pick_precision(f.precision_time for f in job.figures.values())
    if prec is None:
        prec = "bf16"
        res.assumptions.append("precision not visible in kernel names: assumed bf16 (mixed precision)")
    res.precision = prec
    if key:
        res.peak_flops_per_chip = PEAK_FLOPS[key][prec]
        res.peak_source = f"table: {key} {prec} dense"


def _no_peak_reason(res: MFUResult, is_cpu: bool) -> str:
    """Why there is no MFU when the FLOPs are known but the peak is not."""
    if is_cpu:
        return (
            "CPU-only trace: MFU is relative to an accelerator's peak FLOPs; a CPU's peak depends on "
            "cores, SIMD width and clock, so it is not assumed. Pass --peak-flops to compute it."
        )
    if not res.device:
        return (
            "the trace has no deviceProperties (the GPU's name is unknown), so its peak FLOPs "
            "are unknown: pass --peak-flops"
        )
    return f"device {res.device!r} is not in the peak-FLOPs table: pass --peak-flops"
