"""A synthetic repeated-profiling set: small Kineto GPU traces of single-process jobs whose GPU
busy share is known by construction, and the corruption PyTorch issues #192021 and #175790
describe for later profiling runs of the same process: kernels at the start of the run stamped
before the launch call that issued them.

One sample is ``steps`` steps of ``period_ms``; each step launches ``kernels`` kernels evenly
(``cudaLaunchKernel`` on the host thread, ``correlation`` linking each to its kernel on stream 7)
whose durations add up to ``busy`` × the step. ``corrupt`` kernels of the first step(s) are
moved ``shift_ms`` before their launch.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

US = 1.0  # Kineto JSON times are microseconds


def trace_events(
    busy: float,
    *,
    steps: int = 10,
    period_ms: float = 100.0,
    kernels: int = 8,
    corrupt: int = 0,
    shift_ms: float = 400.0,
    t0_us: float = 1_000_000.0,
    pid: int = 4242,
) -> list[dict[str, Any]]:
    period = period_ms * 1000 * US
    slot = period / kernels
    kdur = busy * period / kernels
    ev: list[dict[str, Any]] = []
    corr = 0
    for s in range(steps):
        start = t0_us + s * period
        ev.append(
            {
                "ph": "X",
                "cat": "user_annotation",
                "name": f"ProfilerStep#{s}",
                "pid": pid,
                "tid": pid,
                "ts": start,
                "dur": period - 1,
            }
        )
        for k in range(kernels):
            corr += 1
            launch = start + k * slot + 1
            kernel_ts = launch + 5
            if corr <= corrupt:
                kernel_ts = launch - shift_ms * 1000
            ev.append(
                {
                    "ph": "X",
                    "cat": "cuda_runtime",
                    "name": "cudaLaunchKernel",
                    "pid": pid,
                    "tid": pid,
                    "ts": launch,
                    "dur": 4,
                    "args": {"correlation": corr, "External id": corr},
                }
            )
            ev.append(
                {
                    "ph": "X",
                    "cat": "kernel",
                    "name": f"gemm_kernel_{k}",
                    "pid": 0,
                    "tid": 7,
                    "ts": kernel_ts,
                    "dur": kdur,
                    "args": {"correlation": corr, "stream": 7, "device": 0, "External id": corr},
                }
            )
    return ev


def write_sample(folder: Path, busy: float, **kwargs: Any) -> Path:
    """One rank file of one sample in ``folder`` (created); returns its path."""
    folder.mkdir(parents=True, exist_ok=True)
    doc = {
        "schemaVersion": 1,
        "deviceProperties": [
            {"id": 0, "name": "NVIDIA H100", "totalGlobalMem": 85_000_000_000, "numSms": 132}
        ],
        "distributedInfo": {"backend": "nccl", "rank": 0, "world_size": 1},
        "traceEvents": trace_events(busy, **kwargs),
    }
    path = folder / "rank-0_4242.pt.trace.json"
    path.write_text(json.dumps(doc), encoding="utf-8")
    return path
