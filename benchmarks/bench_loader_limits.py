"""Benchmark: the loader's work grows linearly with whitespace, and a decompression bomb stops
at the limit in bounded memory (issue 16).

    .venv/bin/python benchmarks/bench_loader_limits.py [--sizes 50 100 200] [--bomb-gb 1]

For each size S (MB of blanks) and each placement (between '}' and ',', after ',', leading
'[' + blanks + ']'), it times ``parse_trace`` in this process and prints the time per MB and the
ratio of the largest to the smallest size's time per MB: about 1 when the work is linear (it was
about 2.5x from 100 to 400 MB before). Then a gzip of ``{"traceEvents":[`` + ``--bomb-gb`` GB of
blanks + ``]}`` is loaded in a subprocess with the default limits, printing the message, wall
time and peak RSS (before: the whole stream was inflated; 5.5 GB took > 400 s and 5.3 GB RSS).
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[50, 100, 200])
    ap.add_argument("--bomb-gb", type=float, default=1.0)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="kscope-bench-limits-") as d:
        whitespace(sorted(args.sizes), Path(d))
        bomb(args.bomb_gb, Path(d))


if __name__ == "__main__":
    main()
