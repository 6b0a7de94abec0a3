"""Shared by tests/report and tests/web: synthetic multi-rank Kineto trace files with hostile
names, and a Debian-chromium Playwright launcher.

``write_job`` writes real Kineto-shaped JSON files (``distributedInfo``, ``ProfilerStep#N``,
``cudaLaunchKernel`` + kernels linked by correlation, NCCL all-reduce kernels, a memcpy) plus a
kscope ``manifest.json``, so the files go through the real loader, analyses, diagnosis, catalog
and web app. Rank ``straggler`` arrives late at the all-reduce in ``late_steps``.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

HOSTILE = "<img src=x onerror=alert(1)>"
HOSTILE_SCRIPT = "q\"uo'te & </script><script>alert(2)</script> ünïcødé ☃ \u2028"
HOSTILE_CMD = 'python train.py --tag "<script>alert(3)</script>"'
GEMM = "void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_128x128_32x3_nn_align4>(Params)"
ELEMENTWISE = "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>, at::detail::Array<char*, 3> >(int, at::native::CUDAFunctor_add<float>, at::detail::Array<char*, 3>)"
NCCL = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)"

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def _x(cat: str, name: str, pid: int, tid: int, ts_us: float, dur_us: float, **args: Any) -> dict[str, Any]:
    ev: dict[str, Any] = {
        "ph": "X",
        "cat": cat,
        "name": name,
        "pid": pid,
        "tid": tid,
        "ts": round(ts_us, 3),
        "dur": round(dur_us, 3),
    }
    if args:
        ev["args"] = args
    return ev


def rank_events(
    rank: int,
    world: int,
    steps: int,
    *,
    straggler: int,
    late_steps: Sequence[int],
    late_ms: float,
    hostile: bool,
    t0_us: float,
    period_ms: float = 40.0,
) -> list[dict[str, Any]]:
    ev: list[dict[str, Any]] = []
    corr = 1
    pid, tid = 100 + rank, 200 + rank
    names = [GEMM, HOSTILE if hostile else GEMM, ELEMENTWISE, HOSTILE_SCRIPT if hostile else ELEMENTWISE]
    base = t0_us
    for s in range(steps):
        step_us = (period_ms + (late_ms if s in late_steps else 0.0)) * 1000.0
        step_no = 100 + s
        ev.append(_x("cpu_op", f"ProfilerStep#{step_no}", pid, tid, base, step_us - 50))
        ev.append(
            _x("user_annotation", "<b>forward</b>" if hostile else "forward", pid, tid, base + 10, 9000)
        )
        # compute: 4 kernels of 4 ms, launched 0.5 ms before they run
        t = base + 200.0
        for k, name in enumerate(names):
            launch = t - 500.0 if k == 0 else t - 300.0
            ev.append(_x("cpu_op", "aten::mm" if k < 2 else "aten::add", pid, tid, launch - 20, 80))
            ev.append(_x("cuda_runtime", "cudaLaunchKernel", pid, tid, launch, 30, correlation=corr))
            ev.append(
                _x(
                    "kernel",
                    name,
                    0,
                    7,
                    t,
                    4000.0,
                    stream=7,
                    correlation=corr,
                    device=0,
                    **{"External id": corr, "grid": [80, 1, 1], "block": [128, 1, 1]},
                )
            )
            corr += 1
            t += 4200.0
        # memcpy
        ev.append(_x("cuda_runtime", "cudaMemcpyAsync", pid, tid, t - 100, 20, correlation=corr))
        ev.append(
            _x(
                "gpu_memcpy",
                "Memcpy HtoD (Pageable -> Device)",
                0,
                7,
                t,
                600.0,
                stream=7,
                correlation=corr,
                device=0,
                bytes=4 << 20,
                **{"memory bandwidth (GB/s)": 7.0},
            )
        )
        corr += 1
        t += 800.0
        # all-reduce: arrival = t (+ straggler delay); everyone ends 2 ms after the last arrival
        late = late_ms * 1000.0 if s in late_steps else 0.0
        last = t + late
        arrival = t + (late if rank == straggler else 0.0)
        ev.append(_x("cuda_runtime", "cudaLaunchKernel", pid, tid, arrival - 200, 25, correlation=corr))
        ev.append(
            _x(
                "kernel",
                NCCL,
                0,
                20,
                arrival,
                last + 2000.0 - arrival,
                stream=20,
                correlation=corr,
                device=0,
                **{
                    "Collective name": "allreduce",
                    "Process Group Name": "0",
                    "In msg nelems": 1 << 20,
                    "Out msg nelems": 1 << 20,
                    "dtype": "Float",
                    "Group size": world,
                },
            )
        )
        corr += 1
        ev.append(_x("cpu_op", "Optimizer.step#SGD.step", pid, tid, last + 2500.0, 300))
        base += step_us
    return ev


def write_job(
    folder: Path,
    *,
    world: int = 2,
    steps: int = 8,
    straggler: int = 1,
    late_steps: Sequence[int] = (2, 5, 6),
    late_ms: float = 25.0,
    hostile: bool = True,
    trace_id: str = "kst-20261121-000000-test",
    job_id: str = "4242",
    gz: bool = False,
) -> list[Path]:
    """Write one Kineto JSON file per rank and a kscope ``manifest.json`` into ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    entries = []
    t0 = 1_700_000_000_000_000.0
    for r in range(world):
        doc = {
            "schemaVersion": 1,
            "distributedInfo": {"backend": "nccl", "rank": r, "world_size": world},
            "deviceProperties": [
                {
                    "id": 0,
                    "name": "NVIDIA A100-SXM4-80GB",
                    "totalGlobalMem": 85_000_000_000,
                    "computeMajor": 8,
                    "computeMinor": 0,
                    "numSms": 108,
                }
            ],
            "trace_id": trace_id,
            "traceEvents": rank_events(
                r,
                world,
                steps,
                straggler=straggler,
                late_steps=late_steps,
                late_ms=late_ms,
                hostile=hostile,
                t0_us=t0 + 37.0 * r,
            ),
            "traceName": f"rank-{r}.pt.trace.json",
        }
        name = f"rank-{r}_{5000 + r}.pt.trace.json" + (".gz" if gz else "")
        p = folder / name
        data = json.dumps(doc).encode()
        p.write_bytes(gzip.compress(data) if gz else data)
        paths.append(p)
        entries.append(
            {
                "file": name,
                "path": str(p),
                "host": "node-a",
                "pid": 5000 + r,
                "rank": r,
                "local_rank": r,
                "world_size": world,
                "job_id": job_id,
                "cmdline": HOSTILE_CMD if hostile else "python train.py",
                "bytes": p.stat().st_size,
                "complete": True,
            }
        )
    manifest = {
        "kinetoscope_manifest": 1,
        "trace_id": trace_id,
        "created": "2026-11-21T00:00:00Z",
        "config": "ACTIVITIES_ITERATIONS=8\nPROFILE_START_ITERATION_ROUNDUP=1",
        "files": entries,
    }
    (folder / "manifest.json").write_text(json.dumps(manifest, indent=1))
    return paths


# ---------------------------------------------------------------------------------------
# Browser
# ---------------------------------------------------------------------------------------
def chromium_or_skip() -> str:
    if not Path(CHROMIUM).exists():
        pytest.skip(
            f"Debian chromium is not installed at {CHROMIUM} (scripts/setup-test-system.sh installs it)"
        )
    pytest.importorskip(
        "playwright.sync_api", reason="playwright is not installed (pip install 'kinetoscope[test]')"
    )
    return CHROMIUM


@contextlib.contextmanager
def browser_context(**kwargs: Any) -> Iterator[Any]:
    """A fresh persistent Chromium context (own user-data-dir), always closed."""
    from playwright.sync_api import sync_playwright

    chromium_or_skip()
    user_data = tempfile.mkdtemp(prefix="kscope-chromium-")
    pw = sync_playwright().start()
    ctx = None
    try:
        ctx = pw.chromium.launch_persistent_context(
            user_data,
            executable_path=CHROMIUM,
            args=CHROMIUM_ARGS,
            headless=True,
            viewport={"width": 1280, "height": 860},
            **kwargs,
        )
        yield ctx
    finally:
        if ctx is not None:
            with contextlib.suppress(Exception):
                ctx.close()
        with contextlib.suppress(Exception):
            pw.stop()
        shutil.rmtree(user_data, ignore_errors=True)


class PageWatch:
    """Records dialogs (and dismisses them), page errors and console errors of a page."""

    def __init__(self, page: Any) -> None:
        self.dialogs: list[str] = []
        self.errors: list[str] = []
        self.console: list[str] = []
        page.on("dialog", self._dialog)
        page.on("pageerror", lambda e: self.errors.append(str(e)))
        page.on("console", lambda m: self.console.append(f"{m.type}: {m.text}"))

    def _dialog(self, d: Any) -> None:
        self.dialogs.append(d.message)
        with contextlib.suppress(Exception):
            d.dismiss()


def injected_elements(page: Any) -> list[str]:
    """Elements a hostile name would have created if it had been parsed as HTML."""
    return page.evaluate(
        """() => Array.from(document.querySelectorAll('img[src="x"], img[onerror], script:not([nonce]):not([type="application/json"]):not([src])'))
             .map(e => e.outerHTML.slice(0, 200))"""
    )


def env_with_repo(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    repo = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = repo + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.pop("KSCOPE_CATALOG", None)
    env["COLUMNS"] = "200"
    if extra:
        env.update(extra)
    return env
