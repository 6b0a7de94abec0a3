"""Synthetic rank traces whose right diagnosis is known by construction.

A job of ``world`` ranks runs ``steps`` DDP-like steps of period ``period_ms`` (true time). In
step ``s`` rank ``r`` computes for ``compute_ms[r]`` ms, then arrives at ``n_coll`` all-reduces
``late_ms[r][s]`` ms later than it would have; every collective ends ``transfer_ms`` after the
last rank arrived, on every rank (so DDP equalises step wall times), and the optimizer step
follows. Each rank's trace is written on its own clock: ``own time = true time - offset[r]``,
so the aligned time is ``own + offset[r]``.

Two flavours: ``gloo`` (collectives are ``gloo:all_reduce`` annotations on a worker thread, host
compute is ``aten::mm`` cpu_ops) and ``nccl`` (``ncclDevKernel_AllReduce`` kernels on stream 20,
compute kernels on stream 7, launched by ``cudaLaunchKernel``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import polars as pl

from kinetoscope.trace.model import Trace, TraceMeta
from kinetoscope.trace.schema import EVENTS_SCHEMA

MS = 1_000_000  # ns


def _ev(kind: str, name: str, tid: int, ts: int, dur: int, **args: Any) -> dict[str, Any]:
    row = dict.fromkeys(EVENTS_SCHEMA)
    row.update(kind=kind, cat=kind, name=name, pid=1, tid=tid, ts=int(ts), dur=int(dur))
    row.update(args)
    return row


def make_job(
    world: int = 4,
    steps: int = 10,
    *,
    late_ms: Sequence[Sequence[float]] | None = None,
    compute_ms: Sequence[float] | None = None,
    offsets_ns: Sequence[int] | None = None,
    hosts: Sequence[str | None] | None = None,
    period_ms: float | Sequence[float] = 100.0,
    n_coll: int = 2,
    transfer_ms: float = 2.0,
    jitter_ns: Sequence[Sequence[Sequence[int]]] | None = None,
    end_jitter_ns: Sequence[Sequence[Sequence[int]]] | None = None,
    flavour: str = "gloo",
    drop: set[tuple[int, int, int]] | None = None,
    skip_steps: dict[int, set[int]] | None = None,
    t0_ns: int = 1_700_000_000 * 1_000_000_000,
    world_size_meta: int | None = None,
    device_name: str | None = None,
    extra_events: dict[int, list[dict[str, Any]]] | None = None,
) -> list[Trace]:
    """Build the rank traces (module docstring). ``drop``: ``(rank, step, coll)`` collectives
    left out of a rank's trace; ``skip_steps``: rank -> steps missing from its trace window;
    ``jitter_ns[r][s][c]`` moves a rank's arrival, ``end_jitter_ns[r][s][c]`` its recorded end
    (gloo workers record completion late by up to ms on a loaded host); ``period_ms`` may give
    each step its own length (a real step stretches by its straggler's delay)."""
    late_ms = late_ms or [[0.0] * steps for _ in range(world)]
    periods = (
        [float(period_ms)] * steps if isinstance(period_ms, (int, float)) else [float(p) for p in period_ms]
    )
    starts_ms = [sum(periods[:k]) for k in range(steps)]
    compute_ms = compute_ms or [20.0] * world
    offsets_ns = offsets_ns or [0] * world
    hosts = hosts or [f"host{r}" for r in range(world)]
    drop = drop or set()
    skip_steps = skip_steps or {}
    traces = []
    # true times
    arrivals = [[[0] * n_coll for _ in range(steps)] for _ in range(world)]
    ends = [[0] * n_coll for _ in range(steps)]
    for s in range(steps):
        base = t0_ns + int(starts_ms[s] * MS)
        for c in range(n_coll):
            for r in range(world):
                j = jitter_ns[r][s][c] if jitter_ns else 0
                arrivals[r][s][c] = (
                    base + int(compute_ms[r] * MS) + int(c * 1 * MS) + int(late_ms[r][s] * MS) + j
                )
            ends[s][c] = max(arrivals[r][s][c] for r in range(world)) + int(transfer_ms * MS) + c * 1000
    for r in range(world):
        off = int(offsets_ns[r])
        rows: list[dict[str, Any]] = []
        corr = 1000 * (r + 1)
        for s in range(steps):
            if s in skip_steps.get(r, set()):
                continue
            base = t0_ns + int(starts_ms[s] * MS) - off
            opt_start = max(ends[s]) - off + MS // 10
            if flavour == "gloo":
                rows.append(_ev("cpu_op", "aten::mm", 1, base + MS // 10, int(compute_ms[r] * MS) - MS // 5))
            else:
                for k in range(4):
                    ks = base + MS // 10 + k * int(compute_ms[r] * MS) // 4
                    kd = int(compute_ms[r] * MS) // 4 - 20_000
                    corr += 1
                    rows.append(
                        _ev("cuda_runtime", "cudaLaunchKernel", 1, ks - 50_000, 5_000, correlation=corr)
                    )
                    rows.append(
                        _ev(
                            "kernel",
                            "ampere_bf16_s16816gemm_bf16_128x128",
                            7,
                            ks,
                            kd,
                            stream=7,
                            correlation=corr,
                            device=0,
                        )
                    )
            for c in range(n_coll):
                if (r, s, c) in drop:
                    continue
                a = arrivals[r][s][c] - off
                e = ends[s][c] - off + (end_jitter_ns[r][s][c] if end_jitter_ns else 0)
                if flavour == "gloo":
                    rows.append(_ev("cpu_op", "c10d::allreduce_", 1, a - 200_000, 50_000))
                    rows.append(_ev("user_annotation", "gloo:all_reduce", 2 + c, a, e - a))
                else:
                    corr += 1
                    rows.append(
                        _ev("cuda_runtime", "cudaLaunchKernel", 1, a - 100_000, 5_000, correlation=corr)
                    )
                    rows.append(
                        _ev(
                            "kernel",
                            "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)",
                            20,
                            a,
                            e - a,
                            stream=20,
                            correlation=corr,
                            device=0,
                            collective_name="allreduce",
                            pg_name="0",
                        )
                    )
            rows.append(_ev("user_annotation", "Optimizer.step#SGD.step", 1, opt_start, MS // 5))
        rows += (extra_events or {}).get(r, [])
        rows.sort(key=lambda x: x["ts"])
        for i, row in enumerate(rows):
            row["idx"] = i
        events = pl.DataFrame(rows, schema=EVENTS_SCHEMA, orient="row")
        props = [{"id": 0, "name": device_name, "numSms": 132}] if device_name else []
        meta = TraceMeta(
            path=f"/synthetic/job/rank-{r}.pt.trace.json",
            rank=r,
            world_size=world_size_meta or world,
            rank_source="manifest",
            hostname=hosts[r],
            job_id="synthetic",
            device_type="CPU" if flavour == "gloo" else "NVIDIA GPU",
            device_properties=props,
        )
        traces.append(Trace(meta=meta, events=events))
    return traces
