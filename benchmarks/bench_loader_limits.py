"""Benchmark: the loader's work grows linearly with whitespace, and a decompression bomb stops
at the limit in bounded memory (issue 16).

    .venv/bin/python benchmarks/bench_loader_limits.py [--sizes 50 100 200] [--bomb-gb 1]
        [--event-bomb-m 40] [--no-unbounded] [--blank-runs 4] [--only event-bomb ...]

For each size S (MB of blanks) and each placement (between '}' and ',', after ',', leading
'[' + blanks + ']'), it times ``parse_trace`` in this process and prints the time per MB and the
ratio of the largest to the smallest size's time per MB: about 1 when the work is linear (it was
about 2.5x from 100 to 400 MB before). Then a gzip of ``{"traceEvents":[`` + ``--bomb-gb`` GB of
blanks + ``]}`` is loaded in a subprocess with the default limits, printing the message, wall
time and peak RSS (before: the whole stream was inflated; 5.5 GB took > 400 s and 5.3 GB RSS).
Then (issue 32) a gzip bomb of *valid events*: ``--event-bomb-m`` million small complete
events (issue 32 measured 10.9 MB of gzip -> 40.8 M events -> 5 GB RSS), loaded in a subprocess
with the default limits: it must stop at the documented event bound (for gzip, 512 Ki events
per MiB compressed, at least 2 Mi) with peak RSS under 1 GB; the same file is then loaded with
``KSCOPE_MAX_GZIP_EVENTS_PER_MIB`` lifted, for the RSS the bound saves (``--no-unbounded`` skips
that run). Then a run of ``--blank-runs`` runs of 100 MB of blanks between events, each under
the 256 MiB value limit (issue 32: it was refused as one value).
No assertion: figures only (tests count the bytes searched instead, tests/trace/test_limits.py).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

EV = b'{"ph":"X","name":"a","ts":1,"dur":2}'
PLACEMENTS = {
    "after '}'": lambda gap: EV + gap + b"," + EV,
    "after ','": lambda gap: EV + b"," + gap + EV,
    "leading": lambda gap: gap,
}
BOMB = """
import sys, time
from kinetoscope.trace import parse_trace, TraceError
t = time.perf_counter()
try:
    parse_trace(sys.argv[1], workers=0)
    msg = "loaded"
except TraceError as e:
    msg = e.problem
# VmHWM (not ru_maxrss, which counts the parent's pages from before the exec)
hwm = next(line.split()[1] for line in open("/proc/self/status") if line.startswith("VmHWM"))
print(f"{time.perf_counter() - t:.2f} s, peak RSS {int(hwm) >> 10} MB: {msg}")
"""


def time_parse(path: Path) -> float:
    from kinetoscope.trace import parse_trace

    t = time.perf_counter()
    parse_trace(path, workers=0)
    return time.perf_counter() - t


def whitespace(sizes: list[int], workdir: Path) -> None:
    for name, make in PLACEMENTS.items():
        per_mb = []
        for mb in sizes:
            p = workdir / "ws.json"
            p.write_bytes(b'{"traceEvents":[' + make(b" " * (mb << 20)) + b"]}")
            dt = time_parse(p)
            per_mb.append(dt / mb)
            print(f"{name:10s} {mb:5d} MB blanks: {dt:6.2f} s ({1000 * dt / mb:.1f} ms/MB)", flush=True)
        ratio = per_mb[-1] / per_mb[0]
        print(f"{name:10s} time per MB, {sizes[-1]} MB vs {sizes[0]} MB: {ratio:.2f}x (linear: ~1)")


def bomb(gb: float, workdir: Path) -> None:
    from isal import isal_zlib

    p = workdir / "bomb.json.gz"
    c = isal_zlib.compressobj(1, isal_zlib.DEFLATED, 31)
    block = b" " * (64 << 20)
    with p.open("wb") as f:
        f.write(c.compress(b'{"traceEvents":['))
        for _ in range(max(1, int(gb * 16))):
            f.write(c.compress(block))
        f.write(c.compress(b"]}") + c.flush())
    print(f"bomb: {p.stat().st_size >> 10} KiB gzip, {gb} GB of blanks inflated")
    out = subprocess.run([sys.executable, "-c", BOMB, str(p)], capture_output=True, text=True, check=False)
    print("bomb:", (out.stdout or out.stderr).strip())


def event_bomb(millions: float, workdir: Path, unbounded: bool) -> None:
    """A gzip of ``{"traceEvents":[ev,ev,...]}`` with ``millions`` M copies of one small event."""
    import os

    from isal import isal_zlib

    p = workdir / "event-bomb.json.gz"
    c = isal_zlib.compressobj(3, isal_zlib.DEFLATED, 31)
    ev = b'{"ph":"X","name":"a","ts":1,"dur":2,"pid":1,"tid":1}'
    block = (b"," + ev) * 100_000
    n = max(1, int(millions * 10))
    with p.open("wb") as f:
        f.write(c.compress(b'{"traceEvents":[' + ev))
        for _ in range(n):
            f.write(c.compress(block))
        f.write(c.compress(b"]}") + c.flush())
    size = p.stat().st_size
    print(
        f"event bomb: {size / 1e6:.1f} MB gzip, {n * 100_000 + 1:,} events, {(n * 100_000 * 53) / 1e9:.1f} GB JSON"
    )
    runs = [("default limits", {})]
    if unbounded:
        runs.append(("density limit lifted", {"KSCOPE_MAX_GZIP_EVENTS_PER_MIB": str(1 << 40)}))
    for label, extra in runs:
        env = {**os.environ, **extra}
        out = subprocess.run(
            [sys.executable, "-c", BOMB, str(p)], capture_output=True, text=True, check=False, env=env
        )
        print(f"event bomb, {label}:", (out.stdout or out.stderr).strip())


def blank_runs(runs: int, workdir: Path) -> None:
    """``[ev, 100 MB blanks, ev, ...]``: each run under the value limit, the file over it."""
    p = workdir / "blank-runs.json"
    blank = b" " * (100 << 20)
    with p.open("wb") as f:
        f.write(b'{"traceEvents":[')
        for _ in range(runs):
            f.write(EV + b"," + blank)
        f.write(EV + b"]}")
    out = subprocess.run([sys.executable, "-c", BOMB, str(p)], capture_output=True, text=True, check=False)
    print(f"{runs} runs of 100 MB blanks between events:", (out.stdout or out.stderr).strip())
    p.unlink()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[50, 100, 200])
    ap.add_argument("--bomb-gb", type=float, default=1.0)
    ap.add_argument("--event-bomb-m", type=float, default=40.0, help="millions of events in the event bomb")
    ap.add_argument(
        "--no-unbounded", action="store_true", help="skip the event bomb without the density limit"
    )
    ap.add_argument("--blank-runs", type=int, default=4)
    ap.add_argument("--only", choices=["whitespace", "bomb", "event-bomb", "blank-runs"], nargs="+")
    args = ap.parse_args()
    only = set(args.only or ["whitespace", "bomb", "event-bomb", "blank-runs"])
    with tempfile.TemporaryDirectory(prefix="kscope-bench-limits-") as d:
        if "whitespace" in only:
            whitespace(sorted(args.sizes), Path(d))
        if "bomb" in only:
            bomb(args.bomb_gb, Path(d))
        if "event-bomb" in only:
            event_bomb(args.event_bomb_m, Path(d), not args.no_unbounded)
        if "blank-runs" in only:
            blank_runs(args.blank_runs, Path(d))


if __name__ == "__main__":
    main()
