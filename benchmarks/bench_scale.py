"""Benchmark: one job's rank traces analysed in one process vs as a map/reduce (local pool, Ray).

    /tmp/kvenv/bin/python benchmarks/bench_scale.py [--ranks 8 32] [--workdir DIR] [--no-ray]
        [--workers N] [--repeat 1]

For each rank count N, N copies of ``trace_diff/control`` become ranks 0..N-1 (the set of
``bench_analyze.py --ranks``, written once to ``--workdir``). Each measurement runs in a fresh
subprocess with the Parquet cache off (every rank is parsed), and computes the full default
``kscope analyze`` document (every default analysis + the job diagnosis):

* ``single``  ``kinetoscope.pipeline.analyze_paths(files)``: everything in one process (the
              default for a handful of files; it parses files in parallel worker interpreters)
* ``local``   the same with ``backend="local"`` (process pool, one rank per task)
* ``ray``     the same with ``backend="ray"`` (a local Ray started inside the timed call)

It prints wall seconds (best of ``--repeat``), the driver's peak RSS (``ru_maxrss`` of the
measuring process: what must fit on the machine that runs ``kscope analyze``), and ratios
against ``single`` of the same run, and checks that the three documents are equal.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


def child(mode: str, folder: str, workers: int) -> dict:
    """One measurement (runs in its own interpreter)."""
    import orjson

    from kinetoscope.pipeline import analyze_paths

    files = sorted(Path(folder).glob("*.json.gz"))
    backend = None if mode == "single" else mode
    t0 = time.perf_counter()
    doc = analyze_paths(files, cache=False, backend=backend, workers=workers or None)
    wall = time.perf_counter() - t0
    digest = hashlib.sha256(orjson.dumps(doc, option=orjson.OPT_SORT_KEYS)).hexdigest()
    return {
        "wall": wall,
        "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "digest": digest,
        "errors": len(doc.get("errors") or {}),
    }


def run_child(mode: str, folder: Path, workers: int) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), "--child", mode, str(folder), str(workers)],
        capture_output=True, text=True, env=env, cwd=ROOT,
    )
    if proc.returncode != 0:
        return {"failed": (proc.stderr.strip().splitlines() or ["exit %d" % proc.returncode])[-1]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def best(mode: str, folder: Path, workers: int, repeat: int) -> dict:
    runs = [run_child(mode, folder, workers) for _ in range(repeat)]
    ok = [r for r in runs if "failed" not in r] or runs
    return min(ok, key=lambda r: r.get("wall", 0.0))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--child", nargs=3, metavar=("MODE", "FOLDER", "WORKERS"), help=argparse.SUPPRESS)
    ap.add_argument("--ranks", type=int, nargs="+", default=[8, 32])
    ap.add_argument("--workdir", type=Path, default=None)
    ap.add_argument("--workers", type=int, default=0, help="pool / Ray CPUs (0: one per CPU)")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--no-ray", action="store_true")
    args = ap.parse_args()
    if args.child:
        mode, folder, workers = args.child
        print(json.dumps(child(mode, folder, int(workers))))
        return

    sys.path.insert(0, str(HERE))
    from bench_analyze import make_ranks  # the same rank set as bench_analyze.py --ranks

    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="kscope-bench-scale-"))
    workdir.mkdir(parents=True, exist_ok=True)
    modes = ["single", "local"] + ([] if args.no_ray else ["ray"])
    rows = []
    for n in args.ranks:
        folder = make_ranks(workdir, n)
        res = {}
        for mode in modes:
            print(f"... {n} ranks, {mode}", file=sys.stderr)
            res[mode] = best(mode, folder, args.workers, args.repeat)
        rows.append((n, res))

    print(f"\nCommand: `python benchmarks/bench_scale.py --ranks {' '.join(map(str, args.ranks))}`"
          f" ({os.cpu_count()} CPUs, workers={args.workers or os.cpu_count()}, cache off, best of {args.repeat})\n")
    print("| ranks | backend | wall s | wall ÷ single | driver peak RSS MB | RSS ÷ single | same document |")
    print("|---:|---|---:|---:|---:|---:|---|")
    for n, res in rows:
        base = res["single"]
        for mode in modes:
            r = res[mode]
            if "failed" in r:
                print(f"| {n} | {mode} | failed: {r['failed'][:80]} | | | | |")
                continue
            same = "yes" if r["digest"] == base.get("digest") else "**NO**"
            print(
                f"| {n} | {mode} | {r['wall']:.2f} | {r['wall'] / base['wall']:.2f}x | {r['rss_mb']:.0f} "
                f"| {r['rss_mb'] / base['rss_mb']:.2f}x | {same} |"
            )


if __name__ == "__main__":
    main()
