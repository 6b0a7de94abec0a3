"""How long does a stack snapshot pause the process it reads? (docs/stacks.md, "Overhead")

The target is an 8-thread training process: the main thread trains a small MLP, six helper
threads wait on queues the way a training process's side threads do (a data-loader feeder, a
checkpoint writer, a metrics pusher: each wakes every 10 ms and does a little work), and one
**heartbeat** thread wakes every 0.5 ms and reports every wake-up that came later than
``--gap-ms`` after the previous one. While
py-spy has the process stopped, the heartbeat cannot run: the gap that overlaps a snapshot is the
pause that snapshot caused. The same gaps measured over a window without snapshots are the
baseline (scheduling noise of this machine), printed beside it.

    .venv/bin/python benchmarks/bench_stacks.py --snapshots 20 [--native] [--locals]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kinetoscope.daemon.stacks import snapshot  # noqa: E402

TARGET = r"""
import sys, threading, time, torch
gap_s = float(sys.argv[1])
torch.set_num_threads(1)
import queue
def helper():
    q, a = queue.Queue(), torch.randn(64, 64)
    while True:
        try:
            q.get(timeout=0.01)
        except queue.Empty:
            a = (a @ a).tanh()
for _ in range(6):
    threading.Thread(target=helper, daemon=True).start()
def heartbeat():
    import os
    try:  # run the moment it is runnable: a gap is then the process being stopped, not scheduling
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))
    except (OSError, AttributeError):
        pass
    last = time.time()
    while True:
        time.sleep(0.0005)
        now = time.time()
        if now - last > gap_s:
            print(f"GAP {last:.6f} {now:.6f}", flush=True)
        last = now
threading.Thread(target=heartbeat, daemon=True).start()
model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x, y = torch.randn(64, 256), torch.randn(64, 1)
print("READY", flush=True)
while True:
    loss = torch.nn.functional.mse_loss(model(x), y)
    opt.zero_grad(); loss.backward(); opt.step()
"""


def _gaps(lines: list[str], start: float, end: float) -> list[float]:
    """Gaps (ms) that overlap [start, end]."""
    out = []
    for ln in lines:
        _tag, a, b = ln.split()
        if float(b) >= start and float(a) <= end:
            out.append((float(b) - float(a)) * 1000)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--snapshots", type=int, default=20)
    ap.add_argument("--native", action="store_true")
    ap.add_argument("--locals", action="store_true")
    ap.add_argument("--gap-ms", type=float, default=2.0, help="report heartbeat gaps above this")
    args = ap.parse_args()
    proc = subprocess.Popen(
        [sys.executable, "-c", TARGET, str(args.gap_ms / 1000)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    lines: list[str] = []
    assert proc.stdout is not None
    while proc.stdout.readline().strip() != "READY":  # gaps while torch starts do not count
        pass

    def read() -> None:
        assert proc.stdout is not None
        for ln in proc.stdout:
            if ln.startswith("GAP"):
                lines.append(ln)

    threading.Thread(target=read, daemon=True).start()
    try:
        time.sleep(2.0)  # warm up
        base_start = time.time()
        time.sleep(3.0)
        base_end = time.time()
        pauses, walls, cpus, threads = [], [], [], 0
        for _ in range(args.snapshots):
            r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
            t0 = time.time()
            snap = snapshot(proc.pid, native=args.native, with_locals=args.locals, timeout_s=60)
            t1 = time.time()
            r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
            cpus.append((r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime) * 1000)
            if snap.error:
                raise SystemExit(f"snapshot failed: {snap.error}")
            threads = len(snap.threads)
            walls.append((t1 - t0) * 1000)
            time.sleep(0.5)
            pauses.append(max(_gaps(lines, t0, t1), default=0.0))
        base = _gaps(lines, base_start, base_end)
    finally:
        proc.kill()
        proc.wait()
    base_max = max(base, default=0.0)
    med = statistics.median(pauses)
    print(
        f"target: {threads} threads (py-spy saw), {args.snapshots} snapshots, native={args.native}, locals={args.locals}"
    )
    print(f"pause per snapshot (heartbeat gap overlapping it): median {med:.1f} ms, max {max(pauses):.1f} ms")
    print(f"py-spy wall time per snapshot: median {statistics.median(walls):.1f} ms, max {max(walls):.1f} ms")
    print(
        f"py-spy CPU time per snapshot (user+sys, its whole run: a load-independent bound of the work done "
        f"while the target is stopped): median {statistics.median(cpus):.1f} ms, max {max(cpus):.1f} ms"
    )
    print(f"load average while measuring: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    print(f"baseline (no snapshot, 3 s): {len(base)} gaps over {args.gap_ms:g} ms, largest {base_max:.1f} ms")
    print(f"median pause / largest baseline gap: {med / base_max:.2f}x" if base_max else "baseline: no gap")
    print(f"target < 50 ms: {'met' if med < 50 else 'NOT met'} (median)")


if __name__ == "__main__":
    main()
