"""Write small Kineto trace files whose answers are known by construction.

Times are given in ns (integers) and written as µs with 3 decimals, as Kineto does, so loading
gives back the same ns. Events are written in list order; ``TraceBuilder`` assigns correlation
ids to launches and kernels.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from kinetoscope.trace import Trace, load_trace

CPU_PID = 100
CPU_TID = 100


def _us(ns: int) -> float:
    return round(ns / 1000.0, 3)


class TraceBuilder:
    def __init__(self, rank: int | None = 0) -> None:
        self.events: list[dict[str, Any]] = []
        self.rank = rank
        self._corr = 1000

    # ---- host side -----------------------------------------------------------------------
    def op(
        self,
        ts: int,
        dur: int,
        name: str,
        *,
        cat: str = "cpu_op",
        tid: int = CPU_TID,
        pid: int = CPU_PID,
        **args: Any,
    ) -> int:
        self.events.append(
            {
                "ph": "X",
                "cat": cat,
                "name": name,
                "pid": pid,
                "tid": tid,
                "ts": _us(ts),
                "dur": _us(dur),
                "args": dict(args),
            }
        )
        return len(self.events) - 1

    def annotation(self, ts: int, dur: int, name: str, **kw: Any) -> int:
        return self.op(ts, dur, name, cat="user_annotation", **kw)

    def runtime(
        self, ts: int, dur: int, name: str, *, correlation: int | None = None, tid: int = CPU_TID, **args: Any
    ) -> int:
        a = dict(args)
        if correlation is not None:
            a["correlation"] = correlation
        return self.op(ts, dur, name, cat="cuda_runtime", tid=tid, **a)

    # ---- device side -----------------------------------------------------------------------
    def gpu(
        self,
        ts: int,
        dur: int,
        name: str,
        *,
        correlation: int | None,
        stream: int = 7,
        cat: str = "kernel",
        device: int = 0,
        **args: Any,
    ) -> int:
        a = {"device": device, "stream": stream, **args}
        if correlation is not None:
            a["correlation"] = correlation
        self.events.append(
            {
                "ph": "X",
                "cat": cat,
                "name": name,
                "pid": device,
                "tid": stream,
                "ts": _us(ts),
                "dur": _us(dur),
                "args": a,
            }
        )
        return len(self.events) - 1

    def launch(
        self,
        ts: int,
        dur: int,
        k_ts: int,
        k_dur: int,
        kernel: str = "gemm_kernel",
        *,
        stream: int = 7,
        launch_name: str = "cudaLaunchKernel",
        cat: str = "kernel",
        tid: int = CPU_TID,
    ) -> tuple[int, int]:
        """A launch call and the kernel it enqueues; returns (launch idx, kernel idx)."""
        self._corr += 1
        li = self.runtime(ts, dur, launch_name, correlation=self._corr, tid=tid)
        ki = self.gpu(k_ts, k_dur, kernel, correlation=self._corr, stream=stream, cat=cat)
        return li, ki

    def memory(
        self,
        ts: int,
        nbytes: int,
        total_allocated: int,
        *,
        total_reserved: int = 0,
        device_type: int = 1,
        device_id: int = 0,
        tid: int = CPU_TID,
    ) -> int:
        self.events.append(
            {
                "ph": "i",
                "cat": "cpu_instant_event",
                "name": "[memory]",
                "pid": CPU_PID,
                "tid": tid,
                "ts": _us(ts),
                "s": "t",
                "args": {
                    "Device Type": device_type,
                    "Device Id": device_id,
                    "Addr": 1,
                    "Bytes": nbytes,
                    "Total Allocated": total_allocated,
                    "Total Reserved": total_reserved,
                },
            }
        )
        return len(self.events) - 1

    # ---- output -----------------------------------------------------------------------
    def document(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"schemaVersion": 1, "traceEvents": self.events}
        if self.rank is not None:
            doc["distributedInfo"] = {"rank": self.rank, "world_size": 1, "backend": "nccl"}
        return doc

    def write(self, path: Path) -> Path:
        path.write_text(json.dumps(self.document()))
        return path

    def load(self, tmp_path: Path, name: str = "trace.json") -> Trace:
        return load_trace(str(self.write(tmp_path / name)))
