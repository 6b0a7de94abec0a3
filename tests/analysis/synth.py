"""Build ``Trace`` objects directly from the schema, with answers known by construction.

Times are integer ns. ``kernel(...)``, ``launch(...)`` etc. return plain dicts; ``make_trace``
fills every other column of ``EVENTS_SCHEMA`` with nulls and numbers ``idx`` in list order
(so the list order is the "file order", which need not be time order).
"""

from __future__ import annotations

from typing import Any

import polars as pl

from kinetoscope.trace.model import Trace, TraceMeta
from kinetoscope.trace.schema import CAT_TO_KIND, EVENTS_SCHEMA

US = 1000  # ns per µs

_corr = [0]


def _next_corr() -> int:
    _corr[0] += 1
    return _corr[0]


def kernel(
    ts: int,
    dur: int,
    *,
    name: str = "void gemm_kernel<float>(float*)",
    stream: int = 7,
    correlation: int | None = None,
    cat: str = "kernel",
    pid: int = 0,
    **extra: Any,
) -> dict[str, Any]:
    return {
        "cat": cat,
        "name": name,
        "pid": pid,
        "tid": stream,
        "ts": ts,
        "dur": dur,
        "stream": stream,
        "correlation": correlation,
        **extra,
    }


def comm(ts: int, dur: int, **kw: Any) -> dict[str, Any]:
    return kernel(ts, dur, name="ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*)", **kw)


def memcpy(
    ts: int, dur: int, *, bw: float | None = None, name: str = "Memcpy HtoD (Pinned -> Device)", **kw: Any
):
    return kernel(ts, dur, name=name, cat="gpu_memcpy", memory_bw_gbps=bw, **kw)


def launch(
    ts: int, dur: int, correlation: int, *, name: str = "cudaLaunchKernel", tid: int = 100
) -> dict[str, Any]:
    return {
        "cat": "cuda_runtime",
        "name": name,
        "pid": 1,
        "tid": tid,
        "ts": ts,
        "dur": dur,
        "correlation": correlation,
    }


def op(ts: int, dur: int, name: str, *, cat: str = "cpu_op", tid: int = 100) -> dict[str, Any]:
    return {"cat": cat, "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur}


def launched(launch_ts: int, launch_dur: int, k_ts: int, k_dur: int, **kw: Any) -> list[dict[str, Any]]:
    """A launch call and its kernel, linked by a fresh correlation id."""
    c = _next_corr()
    maker = kw.pop("maker", kernel)
    lname = kw.pop("launch_name", "cudaLaunchKernel")
    return [launch(launch_ts, launch_dur, c, name=lname), maker(k_ts, k_dur, correlation=c, **kw)]


def make_trace(events: list[dict[str, Any]], *, rank: int | None = 0, path: str = "synthetic.json") -> Trace:
    rows = []
    for i, e in enumerate(events):
        row = dict.fromkeys(EVENTS_SCHEMA)
        row.update({k: v for k, v in e.items() if k in EVENTS_SCHEMA})
        row["idx"] = i
        row["kind"] = CAT_TO_KIND.get(row["cat"] or "", "other")
        rows.append(row)
    df = (
        pl.DataFrame(rows, schema=EVENTS_SCHEMA, orient="row") if rows else pl.DataFrame(schema=EVENTS_SCHEMA)
    )
    meta = TraceMeta(
        path=path,
        rank=rank,
        rank_source="distributedInfo" if rank is not None else "unknown",
        device_type="NVIDIA GPU" if any(e.get("stream") is not None for e in events) else "CPU",
        num_trace_events=len(events),
    )
    return Trace(meta=meta, events=df)
