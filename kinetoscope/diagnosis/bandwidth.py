"""Per-collective algorithm and bus bandwidth, as NCCL's tests (nccl-tests, PERFORMANCE.md) define them.

For one instance of a collective over ``n`` ranks moving ``S`` bytes in ``t`` seconds:

``algbw = S / t``
    ``S``: the buffer size of the operation (all-reduce, broadcast, reduce-scatter input,
    all-to-all: the per-rank buffer; all-gather: the gathered output = ``n`` x the input).
``busbw = algbw x factor``
    the rate each link must sustain, comparable to the hardware's peak: all-reduce
    ``2(n−1)/n``; all-gather, reduce-scatter, all-to-all ``(n−1)/n``; broadcast, reduce,
    send/recv 1.

``S`` = ``nelems`` (the trace's ``In msg nelems``) x the element size (the ``f32``/``f16``/
``bf16``/... token of the kernel name, else 4 bytes, flagged in ``dtype_assumed``; the
``msg_dtype`` column is not read: scale-out's slim traces do not carry it). ``t`` is the *transfer* time:
from the last rank's arrival to the median end (aligned clocks), so waiting for late ranks is
not counted as slow transfer. Instances are matched across ranks by their order within the
collective type (the k-th all-reduce of every rank). Only *bulk* instances count (at least a
tenth of the type's largest): the 1-element all-reduces beside DDP's gradient buckets (Join's
flags) are counted in ``small_instances``. CPU/gloo traces carry no ``In msg nelems``: the size
then comes from the issuing ``c10d::`` op's recorded shapes (``host_op_nelems``).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from statistics import median
from typing import Any

import polars as pl

from kinetoscope.diagnosis.extract import figures_of
from kinetoscope.trace.model import Trace

_DTYPE_BYTES = {
    "float": 4,
    "float32": 4,
    "f32": 4,
    "int": 4,
    "int32": 4,
    "i32": 4,
    "uint32": 4,
    "half": 2,
    "float16": 2,
    "f16": 2,
    "bfloat16": 2,
    "bf16": 2,
    "short": 2,
    "int16": 2,
    "double": 8,
    "float64": 8,
    "f64": 8,
    "long": 8,
    "int64": 8,
    "i64": 8,
    "uint64": 8,
    "byte": 1,
    "char": 1,
    "bool": 1,
    "int8": 1,
    "uint8": 1,
    "i8": 1,
    "u8": 1,
    "int8_t": 1,
    "uint8_t": 1,
}
_NAME_DTYPE = re.compile(
    r"_(f32|f16|bf16|f64|i32|i64|i8|u8|float|half|double|int8_t|uint8_t)(?=_|\(|$)", re.IGNORECASE
)
BUS_FACTOR: dict[str, Callable[[int], float]] = {
    "allreduce": lambda n: 2 * (n - 1) / n,
    "allgather": lambda n: (n - 1) / n,
    "reducescatter": lambda n: (n - 1) / n,
    "alltoall": lambda n: (n - 1) / n,
}


def element_bytes(kernel_name: str | None) -> tuple[int, bool]:
    """Bytes per element from the dtype token of the collective's kernel name
    (``..._Sum_f32_RING_LL``, ``..._bf16``), and whether it was assumed (4 bytes)."""
    m = _NAME_DTYPE.search(kernel_name or "")
    if m and m.group(1).lower() in _DTYPE_BYTES:
        return _DTYPE_BYTES[m.group(1).lower()], False
    return 4, True


def _with_nelems(trace: Trace, df: pl.DataFrame) -> pl.DataFrame:
    """``df`` with missing ``nelems`` filled from the issuing host op's shapes (the rank's
    figure ``host_nelems``, carried by a ``DigestTrace``)."""
    if df["nelems"].null_count() == 0:
        return df
    by_ts = figures_of(trace).host_nelems
    if not by_ts:
        return df
    fill = pl.Series([by_ts.get(int(a)) for a in df["arrival"].to_list()], dtype=pl.Int64)
    return df.with_columns(pl.col("nelems").fill_null(fill))


def collective_bandwidth(
    traces: dict[int, Trace], colls: dict[int, pl.DataFrame], offsets: dict[int, int]
) -> dict[str, dict[str, Any]]:
    """Per collective type: instances, median bytes, transfer time, algbw and busbw (GB/s)."""
    world = len(traces)
    out: dict[str, dict[str, Any]] = {}
    types = sorted(
        {c for df in colls.values() if df.height for c in df["coll"].unique().to_list()} - {"sendrecv"}
    )
    for coll in types:
        per_rank = {
            r: _with_nelems(traces[r], df.filter(pl.col("coll") == coll).sort("arrival"))
            for r, df in colls.items()
            if df.height
        }
        per_rank = {r: d for r, d in per_rank.items() if d.height}
        if len(per_rank) < 2:
            continue
        sizes = {r: element_bytes(str(d["name"][0])) for r, d in per_rank.items()}
        k_max = min(d.height for d in per_rank.values())
        rows = []
        for k in range(k_max):
            arr = [int(d["arrival"][k]) + int(offsets.get(r, 0)) for r, d in per_rank.items()]
            end = [int(d["end"][k]) + int(offsets.get(r, 0)) for r, d in per_rank.items()]
            nel = [d["nelems"][k] for d in per_rank.values() if d["nelems"][k] is not None]
            t = median(end) - max(arr)
            if not nel or t <= 0:
                continue
            r0 = next(iter(per_rank))
            s = float(median(nel)) * sizes[r0][0] * (world if coll == "allgather" else 1)
            rows.append((s, t))
        if not rows:
            continue
        # bulk transfers only: DDP's gradient buckets, not the 1-element flags beside them (Join)
        biggest = max(sz for sz, _ in rows)
        small = sum(1 for sz, _ in rows if sz < 0.1 * biggest)
        rows = [(sz, t) for sz, t in rows if sz >= 0.1 * biggest]
        factor = BUS_FACTOR[coll](world) if coll in BUS_FACTOR else 1.0
        alg = [s / t for s, t in rows]  # bytes per ns = GB/s
        out[coll] = {
            "instances": len(rows),
            "small_instances": small,
            "ranks": world,
            "bytes_median": int(median(s for s, _ in rows)),
            "transfer_ms_median": round(median(t for _, t in rows) / 1e6, 4),
            "algbw_GBps": round(median(alg), 3),
            "busbw_GBps": round(median(alg) * factor, 3),
            "busbw_GBps_p90": round(sorted(alg)[int(0.9 * (len(alg) - 1))] * factor, 3),
            "bus_factor": round(factor, 4),
            "dtype_bytes": sizes[next(iter(per_rank))][0],
            "dtype_assumed": any(a for _, a in sizes.values()),
        }
    return out
