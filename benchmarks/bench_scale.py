"""Benchmark: one job's rank traces analysed in one process vs as a map/reduce (local pool, Ray).

    .venv/bin/python benchmarks/bench_scale.py [--ranks 8 64 256 1024] [--source dlrm|control]
        [--workdir DIR] [--backends single local ray] [--no-ray] [--workers N] [--repeat 1]
    .venv/bin/python benchmarks/bench_scale.py --huge 2 [--rss-cap-mb 5800]
    .venv/bin/python benchmarks/bench_scale.py --fanout 1000

``--fanout HOSTS`` is the fan-out benchmark of ``bench_fanout.py`` (its code, its output):
``kscope trace`` to HOSTS simulated daemons, time to the first answer and to all triggered.

Rank sets (written once to ``--workdir``, then reused):

* ``--source dlrm`` (default): N ranks cycling over the 8 real DLRM V100 ranks of
  ``/work/shared/traces/param_dlrm8`` (0.9 MB JSON each: NCCL all-to-all + all-reduce, one
  ProfilerStep), ``distributedInfo.rank`` 0..N-1 and world size N;
* ``--source control``: N copies of ``trace_diff/control`` (35 MB JSON each), as
  ``bench_analyze.py --ranks``.

Each measurement runs in a fresh subprocess with the Parquet cache off (every rank is parsed) and
computes the full default ``kscope analyze`` document (every default analysis + the job
diagnosis) through ``kinetoscope.scale.run_analysis`` with ``backend`` = ``single`` (this
process), ``local`` (process pool) or ``ray`` (a local Ray started inside the timed call). It
prints wall seconds (best of ``--repeat``), the driver's peak RSS (``ru_maxrss`` of the measuring
process: what must fit on the machine that runs ``kscope analyze``; pool and Ray workers are
other processes), ratios against ``single`` of the same run, the driver's growth per rank
between consecutive rank counts, the wall against ``single ÷ workers`` (the ideal split), and
whether the documents are equal (SHA-256).

``--huge GB`` instead synthesises one JSON trace of that size from ``trace_diff/control``
(written event by event, under ``--workdir``, deleted afterwards) and analyses it in one process:
wall, peak RSS (``ru_maxrss``) and RSS ÷ JSON size, and the peak of the process plus its own
chunk-parse workers (a file of 2 GiB or more is parsed by worker processes; sampled every 0.5 s,
so a lower bound). The measuring child is killed above ``--rss-cap-mb``.
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
DLRM = Path("/work/shared/traces/param_dlrm8")


def child(mode: str, folder: str, workers: int) -> dict:
    """One measurement (runs in its own interpreter). ``folder`` may be one trace file."""
    import orjson

    from kinetoscope.scale import AnalyzeRequest, run_analysis

    if Path(folder).is_file():
        files = [Path(folder)]
    else:
        files = sorted(
            Path(folder).glob("rank-*.json*"), key=lambda p: int(p.name.split("-")[1].split(".")[0])
        )
    req = AnalyzeRequest(cache=False, backend=mode, workers=workers or None)
    t0 = time.perf_counter()
    doc = run_analysis(req, files).document
    wall = time.perf_counter() - t0
    digest = hashlib.sha256(orjson.dumps(doc, option=orjson.OPT_SORT_KEYS)).hexdigest()
    return {
        "wall": wall,
        "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "digest": digest,
        "errors": len(doc.get("errors") or {}),
    }


def run_child(mode: str, folder: Path, workers: int, rss_cap_mb: float = 0.0) -> dict:
    """Run ``child`` in a fresh interpreter; with ``rss_cap_mb`` it is killed (and reported) when
    its RSS passes the cap, so a measurement never endangers a shared machine."""
    import psutil

    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    env.pop("RAY_ADDRESS", None)
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), "--child", mode, str(folder), str(workers)],
            stdout=out,
            stderr=err,
            env=env,
            cwd=ROOT,
        )
        capped = False
        tree_mb = 0.0  # the child and its own workers (chunk-parse processes), sampled
        while proc.poll() is None:
            time.sleep(0.5)
            try:
                parent = psutil.Process(proc.pid)
                rss = parent.memory_info().rss / 2**20
                tree_mb = max(tree_mb, rss + _children_rss_mb(parent))
            except psutil.NoSuchProcess:
                break
            if rss_cap_mb and rss > rss_cap_mb:
                proc.kill()
                capped = True
        proc.wait()
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read().decode(), err.read().decode(errors="replace")
    if capped:
        return {"failed": f"killed by the benchmark: RSS over the {rss_cap_mb:.0f} MB cap"}
    if proc.returncode != 0:
        return {"failed": (stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1]}
    return {**json.loads(stdout.strip().splitlines()[-1]), "tree_mb": tree_mb}


def _children_rss_mb(parent: object) -> float:
    """RSS of ``parent``'s descendants (psutil.Process), MB; those gone meanwhile count 0."""
    import psutil

    total = 0.0
    for c in parent.children(recursive=True):  # type: ignore[attr-defined]
        try:
            total += c.memory_info().rss / 2**20
        except psutil.NoSuchProcess:
            pass
    return total


def best(mode: str, folder: Path, workers: int, repeat: int) -> dict:
    runs = [run_child(mode, folder, workers) for _ in range(repeat)]
    ok = [r for r in runs if "failed" not in r] or runs
    return min(ok, key=lambda r: r.get("wall", 0.0))


def make_dlrm_ranks(workdir: Path, n: int) -> Path:
    """N rank files cycling over the 8 DLRM ranks (module docstring); written once."""
    import orjson

    folder = workdir / f"dlrm{n}"
    if folder.is_dir() and len(list(folder.glob("rank-*.json"))) == n:
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    sources = sorted(DLRM.glob("worker*.json"))
    docs = [orjson.loads(s.read_bytes()) for s in sources]
    for r in range(n):
        doc = docs[r % len(docs)]
        doc["distributedInfo"] = {**doc.get("distributedInfo", {}), "rank": r, "world_size": n}
        (folder / f"rank-{r}.json").write_bytes(orjson.dumps(doc))
    return folder


def make_huge(workdir: Path, target_bytes: int) -> Path:
    """One JSON trace of about ``target_bytes``: ``trace_diff/control`` repeated with shifted
    timestamps and ids (as ``bench_analyze.make_synthetic``), written event by event so that
    building a 2 GB file needs the memory of one copy, not of the file."""
    import orjson
    from isal import igzip

    out = workdir / f"huge_{target_bytes >> 20}MB.json"
    if out.exists():
        return out
    src = ROOT / "tests" / "data" / "traces" / "hta" / "trace_diff" / "control" / "control.json.gz"
    doc = orjson.loads(igzip.decompress(src.read_bytes()))
    events = doc.pop("traceEvents")
    timed = [e for e in events if isinstance(e.get("ts"), (int, float))]
    span = max(e["ts"] + e.get("dur", 0) for e in timed) - min(e["ts"] for e in timed) + 1000
    copy_bytes = sum(len(orjson.dumps(e)) + 2 for e in events)
    copies = max(1, round(target_bytes / copy_bytes))
    tmp = out.with_suffix(".tmp")
    with open(tmp, "wb") as fh:
        fh.write(orjson.dumps(doc)[:-1] + b', "traceEvents": [\n')
        first = True
        for k in range(copies):
            off = k * 100_000_000
            for e in events:
                if k and e.get("ph") == "M":
                    continue
                e = dict(e)
                if isinstance(e.get("ts"), (int, float)) and e.get("ph") != "M":
                    e["ts"] = e["ts"] + k * span
                if isinstance(e.get("id"), int):
                    e["id"] += off
                args = e.get("args")
                if isinstance(args, dict):
                    args = dict(args)
                    for key in ("correlation", "External id", "external id"):
                        if isinstance(args.get(key), int) and args[key] > 0:
                            args[key] += off
                    e["args"] = args
                name = e.get("name")
                if isinstance(name, str) and name.startswith("ProfilerStep#"):
                    e["name"] = f"ProfilerStep#{int(name[13:]) + k * 1000}"
                fh.write((b"" if first else b",\n") + orjson.dumps(e))
                first = False
        fh.write(b"\n]}\n")
    os.replace(tmp, out)
    return out


def huge(workdir: Path, gb: float, cap_mb: float) -> None:
    """``--huge GB``: build the file, analyse it in one process (the whole default document),
    print wall, peak RSS and RSS ÷ file size; the file is deleted afterwards."""
    t = time.perf_counter()
    path = make_huge(workdir, int(gb * 2**30))
    size = path.stat().st_size
    print(
        f"... built {path} ({size / 2**20:.0f} MB) in {time.perf_counter() - t:.0f}s",
        file=sys.stderr,
        flush=True,
    )
    try:
        r = run_child("single", path, 0, rss_cap_mb=cap_mb)
    finally:
        path.unlink(missing_ok=True)
    print(
        f"\nCommand: `python benchmarks/bench_scale.py --huge {gb}` ({os.cpu_count()} CPUs, cache off, "
        f"RSS cap {cap_mb:.0f} MB)\n"
    )
    print(
        "| trace | JSON MB | wall s | peak RSS MB | RSS ÷ JSON | with parse workers, sampled MB "
        "| ÷ JSON | errors |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---|")
    if "failed" in r:
        print(f"| {path.name} | {size / 2**20:.0f} | failed: {r['failed'][:120]} | | | | | |")
    else:
        print(
            f"| {path.name} | {size / 2**20:.0f} | {r['wall']:.1f} | {r['rss_mb']:.0f} | "
            f"{r['rss_mb'] * 2**20 / size:.2f}x | {r['tree_mb']:.0f} | {r['tree_mb'] * 2**20 / size:.2f}x "
            f"| {r['errors']} |"
        )


def make_rank_set(workdir: Path, n: int, source: str) -> Path:
    if source == "dlrm":
        return make_dlrm_ranks(workdir, n)
    sys.path.insert(0, str(HERE))
    from bench_analyze import make_ranks  # the same rank set as bench_analyze.py --ranks

    return make_ranks(workdir, n)


def print_table(rows: list[tuple[int, dict]], modes: list[str], workers: int) -> None:
    print(
        "| ranks | backend | wall s | wall ÷ single | wall ÷ (single ÷ workers) | driver peak RSS MB "
        "| RSS ÷ single | driver MB per added rank | same document |"
    )
    print("|---:|---|---:|---:|---:|---:|---:|---:|---|")
    prev: dict[str, tuple[int, float]] = {}
    for n, res in rows:
        base = res.get("single", {})
        for mode in modes:
            r = res[mode]
            if "failed" in r:
                print(f"| {n} | {mode} | failed: {r['failed'][:80]} | | | | | | |")
                continue
            b_wall, b_rss = base.get("wall"), base.get("rss_mb")
            ideal = r["wall"] / (b_wall / workers) if b_wall and mode != "single" else None
            grow = ""
            if mode in prev:
                pn, prss = prev[mode]
                grow = f"{(r['rss_mb'] - prss) / (n - pn):.3f}"
            prev[mode] = (n, r["rss_mb"])
            same = "yes" if r["digest"] == base.get("digest") else ("-" if not base else "**NO**")
            print(
                f"| {n} | {mode} | {r['wall']:.2f} | {r['wall'] / b_wall:.2f}x | "
                f"{f'{ideal:.2f}x' if ideal else '-'} | {r['rss_mb']:.0f} | "
                f"{r['rss_mb'] / b_rss:.2f}x | {grow or '-'} | {same} |"
                if b_wall and b_rss
                else f"| {n} | {mode} | {r['wall']:.2f} | - | - | {r['rss_mb']:.0f} | - | {grow or '-'} | - |"
            )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--child", nargs=3, metavar=("MODE", "FOLDER", "WORKERS"), help=argparse.SUPPRESS)
    ap.add_argument("--ranks", type=int, nargs="+", default=[8, 64, 256, 1024])
    ap.add_argument("--source", choices=("dlrm", "control"), default="dlrm")
    ap.add_argument("--workdir", type=Path, default=None)
    ap.add_argument("--workers", type=int, default=0, help="pool / Ray CPUs (0: one per CPU)")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument(
        "--backends", nargs="+", choices=("single", "local", "ray"), default=["single", "local", "ray"]
    )
    ap.add_argument("--no-ray", action="store_true")
    ap.add_argument(
        "--huge",
        type=float,
        default=0.0,
        metavar="GB",
        help="instead: one synthesised JSON trace of GB gigabytes analysed in one process",
    )
    ap.add_argument(
        "--rss-cap-mb", type=float, default=5800.0, help="with --huge: kill the measurement above this RSS"
    )
    ap.add_argument(
        "--fanout",
        type=int,
        default=0,
        metavar="HOSTS",
        help="kscope trace to HOSTS simulated daemons (benchmarks/bench_fanout.py) instead",
    )
    args = ap.parse_args()
    if args.fanout:  # the fan-out benchmark's own code (benchmarks/bench_fanout.py)
        sys.path.insert(0, str(HERE))
        from bench_fanout import report, run

        report(run(args.fanout))
        return
    if args.child:
        mode, folder, workers = args.child
        print(json.dumps(child(mode, folder, int(workers))))
        return

    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="kscope-bench-scale-"))
    workdir.mkdir(parents=True, exist_ok=True)
    if args.huge:
        huge(workdir, args.huge, args.rss_cap_mb)
        return
    modes = [m for m in args.backends if not (args.no_ray and m == "ray")]
    workers = args.workers or os.cpu_count() or 1
    rows = []
    for n in args.ranks:
        folder = make_rank_set(workdir, n, args.source)
        res = {}
        for mode in modes:
            print(f"... {n} ranks, {mode}", file=sys.stderr, flush=True)
            res[mode] = best(mode, folder, args.workers, args.repeat)
            print(f"    {res[mode]}", file=sys.stderr, flush=True)
        rows.append((n, res))

    print(
        f"\nCommand: `python benchmarks/bench_scale.py --ranks {' '.join(map(str, args.ranks))} --source {args.source}"
        f" --backends {' '.join(modes)}` ({os.cpu_count()} CPUs, workers={workers}, cache off, best of {args.repeat})\n"
    )
    print_table(rows, modes, workers)


if __name__ == "__main__":
    main()
