"""Repeated profiling of one CUDA process: are later runs' kernels stamped before their launch?

PyTorch issues #192021 and #175790 report that profiling the same process again and again
corrupts device timestamps at the start of each later profiling run: kernels appear to start
before the host launched them. ``kscope autopilot`` does exactly that (it re-samples jobs), so
the evidence block of the diagnosis counts such anomalies (``kinetoscope.diagnosis.timestamps``).
This script checks the real thing on a CUDA machine:

1. a small CUDA training loop (an MLP, AdamW) runs in this process;
2. ``torch.profiler`` is started and stopped ``--runs`` times (default 6) around ``--steps``
   steps each, every run exported as a Chrome trace (``$OUT/traces/run-K.pt.trace.json``, or
   ``--out``);
3. each trace is checked: device events (kernel, memcpy, memset) whose start is more than 1 us
   before the start of their launch (joined on ``correlation``). Counted here in plain Python
   (no dependency beyond torch), and, when ``kinetoscope`` imports, with
   ``kinetoscope.diagnosis.timestamps.timestamp_anomalies`` too (the two must agree).

Prints one line per run and writes ``$OUT/repeated_profiling.json``. Runs in well under 4 min
(about 30 s on an H200). Exit 0 whatever it finds (the figures are the result); 2 without CUDA.

    python benchmarks/device/repeated_profiling.py [--runs 6] [--steps 20] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

DEVICE_CATS = {"kernel", "gpu_memcpy", "gpu_memset"}
RUNTIME_CATS = {"cuda_runtime", "cuda_driver"}
TOLERANCE_US = 1.0


def check_trace(path: Path) -> dict[str, Any]:
    """Plain-Python count of device events stamped before their launch."""
    with open(path) as f:
        doc = json.load(f)
    launches: dict[int, float] = {}
    device: list[tuple[int, float]] = []
    for e in doc.get("traceEvents", []):
        if e.get("ph") != "X":
            continue
        corr = (e.get("args") or {}).get("correlation")
        if corr is None:
            continue
        if e.get("cat") in RUNTIME_CATS:
            launches.setdefault(int(corr), float(e["ts"]))
        elif e.get("cat") in DEVICE_CATS:
            device.append((int(corr), float(e["ts"])))
    early = [(launches[c] - ts) for c, ts in device if c in launches and ts < launches[c] - TOLERANCE_US]
    return {
        "device_events": len(device),
        "linked": sum(1 for c, _ in device if c in launches),
        "device_before_launch": len(early),
        "worst_before_launch_us": round(max(early), 1) if early else None,
    }


def check_with_kinetoscope(path: Path) -> int | None:
    """``timestamp_anomalies(trace).device_before_launch``, or None when kinetoscope cannot load."""
    try:
        sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
        from kinetoscope.diagnosis.timestamps import timestamp_anomalies
        from kinetoscope.trace import load_trace
    except Exception:  # noqa: BLE001 - its dependencies may be missing on the device machine
        return None
    return timestamp_anomalies(load_trace(path, cache=False)).device_before_launch


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=6)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--out", default=os.environ.get("OUT") or "/tmp/kscope-repeated-profiling")
    args = ap.parse_args()
    import torch
    from torch.profiler import ProfilerActivity, profile

    if not torch.cuda.is_available():
        print("no CUDA device: nothing to check", file=sys.stderr)
        return 2
    out = Path(args.out)
    (out / "traces").mkdir(parents=True, exist_ok=True)
    dev = torch.device("cuda")
    model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.GELU(), torch.nn.Linear(4096, 1024)).to(
        dev
    )
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randn(256, 1024, device=dev)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        loss = model(x).square().mean()
        loss.backward()
        opt.step()

    for _ in range(10):  # warm up outside any profiler
        step()
    torch.cuda.synchronize()
    results = []
    t0 = time.time()
    for k in range(1, args.runs + 1):
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(args.steps):
                step()
            torch.cuda.synchronize()
        path = out / "traces" / f"run-{k}.pt.trace.json"
        prof.export_chrome_trace(str(path))
        r = {"run": k, "path": str(path), **check_trace(path)}
        r["kinetoscope_device_before_launch"] = check_with_kinetoscope(path)
        results.append(r)
        print(
            f"run {k}: {r['device_before_launch']} of {r['linked']} linked device events stamped before their "
            f"launch (worst {r['worst_before_launch_us']} us); kinetoscope: {r['kinetoscope_device_before_launch']}",
            flush=True,
        )
        for _ in range(5):  # the job goes on between samples, as under the autopilot
            step()
    summary = {
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name(0),
        "runs": results,
        "later_runs_flagged": sum(1 for r in results[1:] if r["device_before_launch"]),
        "first_run_flagged": bool(results[0]["device_before_launch"]),
        "seconds": round(time.time() - t0, 1),
    }
    (out / "repeated_profiling.json").write_text(json.dumps(summary, indent=1))
    print(
        f"{summary['device']}, torch {summary['torch']}: first run flagged {summary['first_run_flagged']}, "
        f"later runs flagged {summary['later_runs_flagged']}/{len(results) - 1} ({summary['seconds']} s)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
