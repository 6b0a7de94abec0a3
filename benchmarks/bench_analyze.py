"""Benchmark: Kinetoscope load + four analyses vs HTA, against the JSON parse floor.

    /tmp/kvenv/bin/python benchmarks/bench_analyze.py [--repeat 3] [--workdir DIR] [--skip-hta]
        [--min-mb 5] [--synthetic-copies 10] [--only NAME ...] [--json OUT]

For every trace under tests/data/traces larger than ``--min-mb`` MB uncompressed, plus a
synthetic trace of >= 400 MB made by repeating ``trace_diff/control`` with shifted timestamps
(hta_features.md §3.4; written to ``--workdir``, default a temp dir, never the repo), it times,
each in a fresh subprocess (so ``ru_maxrss`` is per measurement):

* ``ks cold``   kinetoscope.trace.load_trace(cache=False) + temporal, idle, kernel, overlap
* ``ks first``  the same with the cache on and empty (parse + Parquet write)
* ``ks cache``  the same from the Parquet cache
* ``hta``       HTA (traceinsight 0.6.1) TraceAnalysis + the same four analyses (visualize=False,
                ranks passed explicitly)
* ``floor json``   isal gunzip + generic ``msgspec.json.decode`` of the whole file
* ``floor typed``  isal gunzip + ``msgspec`` decode of ``traceEvents`` into the loader's typed
                   structs in one call (only the needed fields; the floor the targets use)
* ``floor chunked`` the loader's own reader + splitter + typed decode, without building tables
                   (what this design cannot go below)
* ``N ranks``    ``load_traces`` of N copies of control (distributedInfo.rank 0..N-1) + the four
                 analyses over all ranks, vs HTA ``TraceAnalysis(trace_dir=...)``

Native decoder (issue 14; ``--engine`` and ``--whole`` run only these, each ``--repeat`` times,
interleaved, medians; ratios are within the same run, so a loaded box moves both sides):

* ``--engine``  in process, JSON -> tables (``parse_trace(workers=0)`` of the decompressed JSON,
                page cache warm): MB/s per core (raw MB / CPU seconds) native vs Python
                (``KSCOPE_NATIVE=0``), for every trace of tests/data/traces
* ``--whole``   whole processes, start-up included: ``kscope analyze --no-cache`` with the four
                analyses (native, and ``KSCOPE_NATIVE=0``) vs HTA (a fresh interpreter importing
                HTA + TraceAnalysis + the four analyses) on the 54 MB and 87 MB traces
                (``--only`` picks others) and on the multi-rank sets (the real 8-rank DLRM job
                of /work/shared/traces/param_dlrm8 when present, and ``--ranks`` copies of
                control); peak RSS of each process (``wait4``). ``--other DIR`` also times
                another checkout's kscope (``PYTHONPATH=DIR``; e.g. ``git archive`` of the commit
                before a change, with its built ``_decoder*.so`` copied in) in the same rounds;
                ``--all-analyses`` runs every analysis (``--only`` each, the heavy ones with their
                declared reads) instead of the four

Times are wall seconds of the measured work only (imports excluded), best of ``--repeat``;
``cpu`` columns are the process CPU seconds of the same run. Peak RSS is the child's
``ru_maxrss`` (includes the interpreter and imports; see the ``baseline`` row).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import re
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TRACES = REPO / "tests" / "data" / "traces"
SYNTH_SOURCE = TRACES / "hta" / "trace_diff" / "control" / "control.json.gz"
MARK = "@@BENCH@@"


# ---------------------------------------------------------------------------------------------
# child side
# ---------------------------------------------------------------------------------------------
def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def _ks_analyses(traces):
    from kinetoscope.analysis.comm_overlap import comm_comp_overlap
    from kinetoscope.analysis.idle_time import idle_time_breakdown
    from kinetoscope.analysis.kernel_breakdown import kernel_breakdown
    from kinetoscope.analysis.temporal import temporal_breakdown

    return [
        temporal_breakdown(traces),
        idle_time_breakdown(traces),
        kernel_breakdown(traces),
        comm_comp_overlap(traces),
    ]


def _worker_usage() -> dict:
    """Peak RSS (VmHWM) and CPU seconds of this process's chunk worker processes, then stop them."""
    from kinetoscope.trace import parallel

    pool = parallel._POOL
    rss, cpu = [], 0.0
    if pool is not None:
        tick = os.sysconf("SC_CLK_TCK")
        for w in pool.workers:
            try:
                with open(f"/proc/{w.pid}/status") as fh:
                    for line in fh:
                        if line.startswith("VmHWM:"):
                            rss.append(int(line.split()[1]) / 1024.0)
                with open(f"/proc/{w.pid}/stat") as fh:
                    fields = fh.read().rsplit(")", 1)[1].split()
                    cpu += (int(fields[11]) + int(fields[12])) / tick
            except (OSError, ValueError, IndexError):
                pass
        parallel.shutdown()
    return {"workers_n": len(rss), "worker_rss": rss, "worker_cpu": cpu}


def _hta_four(out: dict, ranks: list[int], **trace_analysis_kw: object) -> dict:
    """HTA's load (``TraceAnalysis(**trace_analysis_kw)``) + the four analyses, timed into ``out``."""
    import logging

    logging.disable(logging.CRITICAL)
    from hta.trace_analysis import TraceAnalysis

    t0, c0 = time.perf_counter(), time.process_time()
    ta = TraceAnalysis(**trace_analysis_kw)
    t1 = time.perf_counter()
    ta.get_temporal_breakdown(visualize=False)
    ta.get_idle_time_breakdown(ranks=ranks, visualize=False)
    ta.get_gpu_kernel_breakdown(visualize=False)
    ta.get_comm_comp_overlap(visualize=False)
    out["load"] = t1 - t0
    out["analyses"] = time.perf_counter() - t1
    out["wall"] = time.perf_counter() - t0
    out["cpu"] = time.process_time() - c0
    return out


def child(mode: str, path: str, extra: str) -> dict:
    sys.path.insert(0, str(REPO))
    out: dict = {}
    if mode == "baseline":
        import kinetoscope.analysis.temporal  # noqa: F401
        import kinetoscope.trace  # noqa: F401

        return {"wall": 0.0, "cpu": 0.0}
    if mode.startswith("ks") and "multi" not in mode:
        return _child_ks(mode, path, extra, out)
    if mode == "engine":
        return engine_child(path, int(extra))
    if mode == "make-synth":
        return {"path": str(make_synthetic(Path(path), int(extra))), "wall": 0.0, "cpu": 0.0}
    if mode == "raw-size":
        return {"size": raw_size(Path(path)), "wall": 0.0, "cpu": 0.0}
    if mode == "hta":
        rank = int(extra)
        return _hta_four(out, [rank], trace_files={rank: path}, trace_dir=os.path.dirname(path))
    if mode == "floor-chunked":
        return _child_floor_chunked(path, out)
    if mode in ("ks-multi", "ks-multi-cache"):
        return _child_ks_multi(mode, path, extra, out)
    if mode == "hta-multi":
        return _hta_four(out, list(range(int(extra))), trace_dir=path)
    if mode == "make-ranks":
        return {"path": str(make_ranks(Path(path), int(extra))), "wall": 0.0, "cpu": 0.0}
    if mode in ("floor-json", "floor-typed"):
        return _child_floor(mode, path, out)
    raise SystemExit(f"unknown mode {mode}")


def _child_ks(mode: str, path: str, extra: str, out: dict) -> dict:
    from kinetoscope.trace import load_trace, parallel, prestart_workers

    _ks_analyses([])  # import the analysis modules before timing
    # extra: "<cache dir>" for ks-first/ks-cache; for ks-cold: "" (automatic: worker
    # processes started inside the timed call when the file is large enough), "0" (in
    # this process), "N" (N workers), "warm" / "warmN" (workers started and ready before
    # the timed call, as for a second file or after prestart_workers())
    workers = None
    if mode == "ks-cold":
        kw = {"cache": False}
        if extra.startswith("warm"):
            n = int(extra[4:]) if extra[4:] else None
            prestart_workers(n)
            pool = parallel.get_pool(n, start=False)
            if pool is not None:
                pool.wait_ready(120)
                parallel.release_pool(pool)
                workers = pool.n
        elif extra:
            workers = int(extra)
        if workers is not None:
            kw["workers"] = workers
    else:
        kw = {"cache": True, "cache_dir": extra}
    stats0 = dict(parallel.STATS)
    t0, c0 = time.perf_counter(), time.process_time()
    trace = load_trace(path, **kw)
    t1 = time.perf_counter()
    _ks_analyses([trace])
    out["load"] = t1 - t0
    out["analyses"] = time.perf_counter() - t1
    out["wall"] = time.perf_counter() - t0
    out["cpu"] = time.process_time() - c0
    out["events"] = len(trace.events)
    out["rank"] = trace.meta.rank
    out["chunks_by_workers"] = parallel.STATS["built"] - stats0.get("built", 0)
    out["chunks_failed"] = parallel.STATS["failed"] - stats0.get("failed", 0)
    out.update(_worker_usage())
    return out


def _child_floor_chunked(path: str, out: dict) -> dict:
    from kinetoscope.trace.decode import EventStream
    from kinetoscope.trace.reader import BlockReader

    t0, c0 = time.perf_counter(), time.process_time()
    gc.disable()
    n = 0
    with BlockReader(path) as reader:
        for chunk in EventStream(path, reader).chunks():
            n += len(chunk.events)
            chunk.events = []
    out["wall"] = time.perf_counter() - t0
    out["cpu"] = time.process_time() - c0
    out["events"] = n
    return out


def _child_ks_multi(mode: str, path: str, extra: str, out: dict) -> dict:
    from kinetoscope.trace import load_traces

    _ks_analyses([])
    kw = {"cache": False} if mode == "ks-multi" else {"cache": True, "cache_dir": extra}
    t0, c0 = time.perf_counter(), time.process_time()
    traces = load_traces(path, **kw)
    t1 = time.perf_counter()
    _ks_analyses(traces)
    out["load"] = t1 - t0
    out["analyses"] = time.perf_counter() - t1
    out["wall"] = time.perf_counter() - t0
    out["cpu"] = time.process_time() - c0
    out["events"] = sum(len(t.events) for t in traces)
    return out


def _child_floor(mode: str, path: str, out: dict) -> dict:
    import msgspec
    from isal import igzip

    from kinetoscope.trace.decode import TYPED_DECODER

    t0, c0 = time.perf_counter(), time.process_time()
    gc.disable()
    with open(path, "rb") as fh:
        data = igzip.decompress(fh.read()) if path.endswith(".gz") else fh.read()
    if mode == "floor-json":
        doc = msgspec.json.decode(data)
        n = len(doc["traceEvents"]) if isinstance(doc, dict) else len(doc)
        del doc
    else:
        j = data.index(b"[", data.index(b'"traceEvents"'))
        view = memoryview(data)[j:]
        try:
            evs = TYPED_DECODER.decode(view)
        except msgspec.DecodeError as exc:
            end = int(re.search(r"byte (\d+)", str(exc)).group(1)) - 1
            evs = TYPED_DECODER.decode(view[:end])
        n = len(evs)
        del evs, view
    del data
    out["wall"] = time.perf_counter() - t0
    out["cpu"] = time.process_time() - c0
    out["events"] = n
    return out


def engine_child(path: str, repeat: int) -> dict:
    """In process, JSON -> tables, native and Python alternately (``repeat`` times each after a
    warm-up): medians of wall and CPU seconds. The JSON is decompressed to a temp file first
    (page cache), so the figures are the decoding, not the gunzip."""
    import statistics

    from kinetoscope.trace import TraceError, _native, parse_trace
    from kinetoscope.trace.reference import read_bytes

    data = read_bytes(path)
    try:
        parse_trace(path, workers=0)
    except TraceError as exc:  # not a trace (an execution trace): nothing to time
        return {"error": str(exc), "raw_mb": len(data) / 1e6, "wall": 0.0, "cpu": 0.0}
    fd, tmp = tempfile.mkstemp(suffix=".json")
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
    out: dict = {"raw_mb": len(data) / 1e6, "wall": 0.0, "cpu": 0.0}
    del data
    runs: dict[str, list[tuple[float, float]]] = {"native": [], "python": []}
    try:
        for k in range(repeat + 1):
            for name, flag in (("native", "1"), ("python", "0")):
                os.environ["KSCOPE_NATIVE"] = flag
                before = _native.STATS["native"]
                gc.collect()
                t0, c0 = time.perf_counter(), time.process_time()
                trace = parse_trace(tmp, workers=0, locate=False)
                wall, cpu = time.perf_counter() - t0, time.process_time() - c0
                if k:
                    runs[name].append((wall, cpu))
                out[f"{name}_chunks"] = _native.STATS["native"] - before
                out["events"] = len(trace.events)
                del trace
    finally:
        os.unlink(tmp)
    for name, rs in runs.items():
        out[f"{name}_wall"] = statistics.median(r[0] for r in rs)
        out[f"{name}_cpu"] = statistics.median(r[1] for r in rs)
    return out


def run_engine(repeat: int, only: list[str] | None) -> list[dict]:
    rows = []
    for p in sorted(TRACES.rglob("*.json*")):
        if not p.name.endswith((".json", ".json.gz")) or (only and not any(o in str(p) for o in only)):
            continue
        r = run_child("engine", str(p), str(repeat))
        r["trace"] = str(p.relative_to(TRACES / "hta"))
        print(json.dumps(r), file=sys.stderr)
        if "error" not in r:
            rows.append(r)
    return rows


def print_engine(rows: list[dict]) -> None:
    print("In process, JSON -> tables (parse_trace(workers=0) of the decompressed JSON; medians):")
    print(
        "| trace | raw MB | X events | native s (CPU s) | Python s (CPU s) | native MB/s per core | Python MB/s per core | Python CPU ÷ native CPU | chunks decoded natively |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for r in sorted(rows, key=lambda r: r["raw_mb"]):
        nc, pc = max(r["native_cpu"], 1e-9), max(r["python_cpu"], 1e-9)
        print(
            f"| {r['trace']} | {r['raw_mb']:.1f} | {r['events']:,} | {r['native_wall']:.3f} ({nc:.3f}) "
            f"| {r['python_wall']:.3f} ({pc:.3f}) | {r['raw_mb'] / nc:.0f} | {r['raw_mb'] / pc:.0f} "
            f"| {pc / nc:.2f}x | {r['native_chunks']} |"
        )


def whole_process(cmd: list[str], env: dict[str, str]) -> tuple[float, float, float]:
    """(wall seconds, peak RSS MB, CPU seconds) of one fresh process running ``cmd`` (must
    succeed); CPU is user + system of the process and the workers it waited for (``wait4``)."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, cwd=str(REPO))
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
    if proc.returncode:
        raise RuntimeError(f"{cmd} failed (rc {proc.returncode}): {err[-2000:]}")
    return wall, usage.ru_maxrss / 1024.0, usage.ru_utime + usage.ru_stime


FOUR = ["--only", "temporal_breakdown", "--only", "idle_time_breakdown", "--only", "kernel_breakdown",
        "--only", "comm_comp_overlap"]  # fmt: skip
ANALYSES = FOUR  # what --whole runs: the four, or every analysis with --all-analyses
THREADS: list[int] = []  # --threads: KSCOPE_LOAD_THREADS values timed besides the default


def run_whole(
    target: str, rank_extra: str, repeat: int, skip_hta: bool, multi: bool, other: Path | None = None
) -> dict:
    """Median wall and peak RSS of kscope analyze (native, Python) and HTA on ``target``,
    interleaved round-robin; with ``other`` (a checkout, e.g. ``git archive`` of an older commit)
    also its native kscope, importing that code first (``PYTHONPATH``), in the same rounds."""
    import statistics

    kscope = Path(sys.executable).with_name("kscope")
    ks = [str(kscope)] if kscope.exists() else [sys.executable, "-m", "kinetoscope.cli.main"]
    base_env = {**os.environ, "COLUMNS": "100"}
    base_env.pop("KSCOPE_NATIVE", None)
    cases = {
        "ks native": (ks + ["analyze", "--no-cache", *ANALYSES, target], {**base_env, "KSCOPE_NATIVE": "1"}),
        "ks python": (ks + ["analyze", "--no-cache", *ANALYSES, target], {**base_env, "KSCOPE_NATIVE": "0"}),
    }
    if other is not None:
        env = {**base_env, "KSCOPE_NATIVE": "1", "PYTHONPATH": str(other)}
        cases["other native"] = (ks + ["analyze", "--no-cache", *ANALYSES, target], env)
    # as installed: `pip install` compiles every module's bytecode, HTA's included; an editable
    # checkout under PYTHONDONTWRITEBYTECODE=1 (this box) compiles kinetoscope's from source in
    # every process. A private bytecode cache, written by one warm-up run, gives the installed case.
    cached = {**base_env, "KSCOPE_NATIVE": "1", "PYTHONPYCACHEPREFIX": str(_pycache_dir())}
    cached.pop("PYTHONDONTWRITEBYTECODE", None)
    cases["ks native bytecode"] = (ks + ["analyze", "--no-cache", *ANALYSES, target], cached)
    for n in THREADS:
        env = {**cached, "KSCOPE_LOAD_THREADS": str(n)}
        cases[f"ks threads {n}"] = (ks + ["analyze", "--no-cache", *ANALYSES, target], env)
    whole_process(*cases["ks native bytecode"])  # warm-up: writes the bytecode
    if not skip_hta:
        mode = "hta-multi" if multi else "hta"
        cases["hta"] = ([sys.executable, __file__, "--child", mode, target, rank_extra], base_env)
    got: dict[str, list[tuple[float, float, float]]] = {k: [] for k in cases}
    for _ in range(repeat):
        for name, (cmd, env) in cases.items():
            got[name].append(whole_process(cmd, env))
    return {
        name: {
            "wall": statistics.median(r[0] for r in rs),
            "rss": max(r[1] for r in rs),
            "cpu": statistics.median(r[2] for r in rs),
            "runs": [r[0] for r in rs],
        }
        for name, rs in got.items()
    }


def _pycache_dir() -> Path:
    """A bytecode cache private to this benchmark run (``PYTHONPYCACHEPREFIX``)."""
    import atexit
    import shutil
    import tempfile

    global _PYCACHE
    if _PYCACHE is None:
        _PYCACHE = Path(tempfile.mkdtemp(prefix="kbench-pycache-"))
        atexit.register(shutil.rmtree, _PYCACHE, True)
    return _PYCACHE


_PYCACHE: Path | None = None


def print_whole(results: list[tuple[str, dict]]) -> None:
    print(
        f"Whole processes, start-up included (kscope analyze --no-cache + {'every analysis' if ANALYSES != FOUR else 'the four analyses'} vs HTA; medians):"
    )
    print(
        "| input | HTA s | KS native s | KS Python s (KSCOPE_NATIVE=0) | HTA ÷ KS native | HTA ÷ KS Python | KS Python ÷ KS native | peak RSS MB: HTA / KS native / KS Python |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for name, r in results:
        hta, kn, kp = r.get("hta"), r["ks native"], r["ks python"]
        if "other native" in r:  # --other: the other checkout's native kscope, same rounds
            o = r["other native"]
            ratio = f", HTA ÷ other {hta['wall'] / o['wall']:.1f}x" if hta else ""
            name = f"{name} (--other native: {o['wall']:.2f} s{ratio}, {o['rss']:.0f} MB)"
        h = f"{hta['wall']:.2f}" if hta else "-"
        rn = f"{hta['wall'] / kn['wall']:.1f}x" if hta else "-"
        rp = f"{hta['wall'] / kp['wall']:.1f}x" if hta else "-"
        hr = f"{hta['rss']:.0f}" if hta else "-"
        print(
            f"| {name} | {h} | {kn['wall']:.2f} | {kp['wall']:.2f} | {rn} | {rp} | {kp['wall'] / kn['wall']:.2f}x "
            f"| {hr} / {kn['rss']:.0f} / {kp['rss']:.0f} |"
        )
    print("\nAs installed (kinetoscope's bytecode cached, as `pip install` leaves it; HTA's always is):")
    print("| input | HTA s | KS native, bytecode cached s | HTA ÷ KS | peak RSS MB |")
    print("|---|---|---|---|---|")
    for name, r in results:
        hta, kb = r.get("hta"), r.get("ks native bytecode")
        if kb is None:
            continue
        ratio = f"{hta['wall'] / kb['wall']:.1f}x" if hta else "-"
        h = f"{hta['wall']:.2f}" if hta else "-"
        print(f"| {name.split(' (--other')[0]} | {h} | {kb['wall']:.2f} | {ratio} | {kb['rss']:.0f} |")
    if THREADS:
        print(
            "\nDecoding threads (KSCOPE_LOAD_THREADS=N, bytecode cached; 'cached' is the default, no threads):"
        )
        print("| input | N | wall s | CPU s | peak RSS MB |")
        print("|---|---|---|---|---|")
        rows = [("cached", "ks native bytecode"), *((str(n), f"ks threads {n}") for n in THREADS)]
        for name, r in results:
            for label, key in rows:
                c = r[key]
                print(f"| {name} | {label} | {c['wall']:.3f} | {c['cpu']:.3f} | {c['rss']:.0f} |")
    print("\nCPU seconds of the same processes (user + system, workers included; medians):")
    print("| input | HTA | KS native | KS Python | other native | HTA ÷ KS native |")
    print("|---|---|---|---|---|---|")
    for name, r in results:
        cpu = {k: v.get("cpu") for k, v in r.items()}
        cell = {k: f"{v:.2f}" if v is not None else "-" for k, v in cpu.items()}
        ratio = f"{cpu['hta'] / cpu['ks native']:.1f}x" if cpu.get("hta") and cpu.get("ks native") else "-"
        print(
            f"| {name} | {cell.get('hta', '-')} | {cell['ks native']} | {cell['ks python']} "
            f"| {cell.get('other native', '-')} | {ratio} |"
        )


def main_native(args: argparse.Namespace) -> None:
    """``--engine`` / ``--whole``: the native decoder's figures (issue 14)."""
    global ANALYSES, THREADS
    THREADS = list(args.threads)
    print(f"CPUs: {os.cpu_count()}, load average at start: {os.getloadavg()}", file=sys.stderr)
    if args.all_analyses:
        from kinetoscope.analysis import registry

        ANALYSES = [a for name in registry.names() for a in ("--only", name)]
    if args.engine:
        print_engine(run_engine(args.repeat, args.only))
        print()
    if args.whole:
        results = []
        only = args.only or ["df_index_resolver", "mtia_trace_single_rank"]
        for p in sorted(TRACES.rglob("*.json*")):
            if p.name.endswith((".json", ".json.gz")) and any(o in str(p) for o in only):
                rank = run_child("ks-cold", str(p), "0").get("rank") or 0
                name = str(p.relative_to(TRACES / "hta"))
                print(f"... {name}", file=sys.stderr)
                results.append(
                    (
                        name,
                        run_whole(
                            str(p), str(rank), args.repeat, args.skip_hta, multi=False, other=args.other
                        ),
                    )
                )
        dlrm = Path("/work/shared/traces/param_dlrm8")
        if dlrm.is_dir():
            print("... param_dlrm8", file=sys.stderr)
            n = len(list(dlrm.glob("*.json*")))
            results.append(
                (
                    f"param_dlrm8 ({n} ranks)",
                    run_whole(str(dlrm), str(n), args.repeat, args.skip_hta, multi=True, other=args.other),
                )
            )
        if args.ranks:
            workdir = args.workdir or Path(tempfile.mkdtemp(prefix="kscope-bench-"))
            workdir.mkdir(parents=True, exist_ok=True)
            d = run_child("make-ranks", str(workdir), str(args.ranks))["path"]
            print(f"... {args.ranks} ranks", file=sys.stderr)
            results.append(
                (
                    f"{args.ranks} x control",
                    run_whole(d, str(args.ranks), args.repeat, args.skip_hta, multi=True, other=args.other),
                )
            )
        for name, r in results:
            print(json.dumps({"input": name, **r}), file=sys.stderr)
        print_whole(results)
    print(f"\nload average at the end: {os.getloadavg()} (the box is shared: compare ratios, not seconds)")


# ---------------------------------------------------------------------------------------------
# parent side
# ---------------------------------------------------------------------------------------------
def run_child(mode: str, path: str, extra: str = "", timeout: float = 1800) -> dict:
    cmd = [sys.executable, __file__, "--child", mode, path, extra]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=str(REPO))
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith(MARK):
            return json.loads(line[len(MARK) :])
    raise RuntimeError(f"{mode} {path} failed (rc {proc.returncode}):\n{proc.stderr[-3000:]}")


def best(mode: str, path: str, extra: str, repeat: int, prepare=None) -> dict:
    runs = []
    for _ in range(repeat):
        if prepare is not None:
            prepare()
        runs.append(run_child(mode, path, extra))
    b = min(runs, key=lambda r: r["wall"])
    b["rss_max"] = max(r["rss"] for r in runs)
    b["rss"] = min(r["rss"] for r in runs)
    return b


def raw_size(path: Path) -> int:
    if path.suffix == ".gz":
        from isal import igzip

        n = 0
        with igzip.open(path) as fh:
            while True:
                b = fh.read(1 << 22)
                if not b:
                    return n
                n += len(b)
    return path.stat().st_size


def make_synthetic(workdir: Path, copies: int) -> Path:
    """``copies`` x trace_diff/control: ts shifted by (span + 1 ms) per copy, correlation /
    External id / flow ids offset by k*1e8, ProfilerStep#N renumbered; orjson indent 2, gzip."""
    out = workdir / f"control_x{copies}.json.gz"
    if out.exists():
        return out
    import orjson
    from isal import igzip

    doc = orjson.loads(igzip.decompress(SYNTH_SOURCE.read_bytes()))
    events = doc["traceEvents"]
    ts = [e["ts"] for e in events if isinstance(e.get("ts"), (int, float))]
    ends = [e["ts"] + e.get("dur", 0) for e in events if isinstance(e.get("ts"), (int, float))]
    span = max(ends) - min(ts) + 1000
    steps = sorted(
        {int(m.group(1)) for e in events if (m := re.match(r"ProfilerStep#(\d+)", str(e.get("name", ""))))}
    )
    nsteps = (max(steps) - min(steps) + 1) if steps else 0
    new_events = []
    for k in range(copies):
        off = k * 100_000_000
        for e in events:
            e = dict(e)
            if isinstance(e.get("ts"), (int, float)) and e.get("ph") != "M":
                e["ts"] = e["ts"] + k * span
            if "id" in e and isinstance(e["id"], int):
                e["id"] += off
            args = e.get("args")
            if isinstance(args, dict):
                args = dict(args)
                for key in ("correlation", "External id", "external id"):
                    if isinstance(args.get(key), int) and args[key] > 0:
                        args[key] += off
                e["args"] = args
            name = e.get("name")
            if isinstance(name, str) and name.startswith("ProfilerStep#") and nsteps:
                e["name"] = f"ProfilerStep#{int(name[13:]) + k * nsteps}"
            new_events.append(e)
    doc["traceEvents"] = new_events
    raw = orjson.dumps(doc, option=orjson.OPT_INDENT_2)
    del doc, new_events
    tmp = out.with_suffix(".tmp")
    with igzip.open(tmp, "wb", compresslevel=1) as fh:
        fh.write(raw)
    os.replace(tmp, out)
    return out


def make_ranks(workdir: Path, n: int) -> Path:
    """``n`` copies of trace_diff/control with distributedInfo.rank = 0..n-1 (hta_features §3.4;
    indent 2 so that HTA's rank regex finds them)."""
    out = workdir / f"ranks{n}"
    if out.is_dir() and len(list(out.glob("*.json.gz"))) == n:
        return out
    import orjson
    from isal import igzip

    out.mkdir(parents=True, exist_ok=True)
    doc = orjson.loads(igzip.decompress(SYNTH_SOURCE.read_bytes()))
    for r in range(n):
        doc["distributedInfo"] = {**doc.get("distributedInfo", {}), "rank": r, "world_size": n}
        with igzip.open(out / f"rank-{r}.json.gz", "wb", compresslevel=1) as fh:
            fh.write(orjson.dumps(doc, option=orjson.OPT_INDENT_2))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--child", nargs=3, metavar=("MODE", "PATH", "EXTRA"), help=argparse.SUPPRESS)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--synthetic-repeat", type=int, default=1)
    ap.add_argument("--workdir", type=Path, default=None)
    ap.add_argument("--min-mb", type=float, default=5.0)
    ap.add_argument("--synthetic-copies", type=int, default=10)
    ap.add_argument("--no-synthetic", action="store_true")
    ap.add_argument("--skip-hta", action="store_true")
    ap.add_argument("--ranks", type=int, default=8, help="multi-rank set size (0: skip)")
    ap.add_argument("--only", nargs="*", default=None, help="substrings of trace paths to keep")
    ap.add_argument("--json", type=Path, default=None, help="also write the raw results here")
    ap.add_argument(
        "--workers", type=int, default=None, help="N for the N-workers columns (default: automatic)"
    )
    ap.add_argument("--table-only", type=Path, default=None, help="print the tables of a --json file")
    ap.add_argument("--engine", action="store_true", help="only: in-process JSON -> tables, native vs Python")
    ap.add_argument("--whole", action="store_true", help="only: whole kscope analyze processes vs HTA")
    ap.add_argument(
        "--other",
        type=Path,
        default=None,
        help="with --whole: also time this checkout's kscope (e.g. git archive of an older commit), same rounds",
    )
    ap.add_argument(
        "--all-analyses",
        action="store_true",
        help="with --whole: every analysis (--only each, the heavy ones included) instead of the four",
    )
    ap.add_argument(
        "--threads",
        type=int,
        nargs="*",
        default=[],
        help="with --whole: also time KSCOPE_LOAD_THREADS=N (bytecode cached) for each N, same rounds",
    )
    args = ap.parse_args()

    if args.child:
        mode, path, extra = args.child
        res = child(mode, path, extra)
        res["rss"] = _rss_mb()
        print(MARK + json.dumps(res), flush=True)
        return

    if args.engine or args.whole:
        main_native(args)
        return
    if args.table_only:
        data = json.loads(args.table_only.read_text())
        print_table(data["rows"], data["baseline"], data.get("multi"))
        return
    if args.workers is None:
        sys.path.insert(0, str(REPO))
        from kinetoscope.trace.parallel import default_workers

        args.workers = default_workers()
    # the parent stays small: ru_maxrss of a child starts from its parent's size at fork time,
    # so everything heavy (synthetic trace, loads) happens in children
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="kscope-bench-"))
    workdir.mkdir(parents=True, exist_ok=True)
    files = []
    for p in sorted(TRACES.rglob("*.json*")):
        if p.name.endswith((".json", ".json.gz")) and "execution_trace/benchmark_simple_add_et" not in str(p):
            size = run_child("raw-size", str(p))["size"]
            if size > args.min_mb * 1e6:
                files.append((p, size))
    files.sort(key=lambda x: x[1])
    if args.only:
        files = [f for f in files if any(o in str(f[0]) for o in args.only)]
    if not args.no_synthetic:
        t = time.perf_counter()
        synth = Path(run_child("make-synth", str(workdir), str(args.synthetic_copies))["path"])
        size = run_child("raw-size", str(synth))["size"]
        print(
            f"synthetic trace {synth} ({size / 1e6:.0f} MB raw) in {time.perf_counter() - t:.0f}s",
            file=sys.stderr,
        )
        files.append((synth, size))

    base = run_child("baseline", "-", "")
    rows = [_file_row(args, workdir, path, size) for path, size in files]

    multi = None
    if args.ranks:
        d = run_child("make-ranks", str(workdir), str(args.ranks))["path"]
        print(f"... {args.ranks} ranks", file=sys.stderr)
        multi = {"ranks": args.ranks, "ks": best("ks-multi", d, "", args.repeat)}
        cache_dir = workdir / "cache-multi"
        run_child("ks-multi-cache", d, str(cache_dir))
        multi["ks_cache"] = best("ks-multi-cache", d, str(cache_dir), args.repeat)
        if not args.skip_hta:
            multi["hta"] = best("hta-multi", d, str(args.ranks), args.synthetic_repeat)
        print(json.dumps(multi), file=sys.stderr)
    print_table(rows, base, multi)
    if args.json:
        args.json.write_text(json.dumps({"baseline": base, "rows": rows, "multi": multi}, indent=1))


def _file_row(args: argparse.Namespace, workdir: Path, path: Path, size: int) -> dict:
    """One trace's row: every mode, best of the repeats."""
    synthetic = path.parent == workdir
    rep = args.synthetic_repeat if synthetic else args.repeat
    cache_dir = workdir / "cache"
    name = path.name if synthetic else str(path.relative_to(TRACES / "hta"))
    print(f"... {name}", file=sys.stderr)
    r = {"trace": name, "raw_mb": size / 1e6}
    r["ks_cold"] = best("ks-cold", str(path), "", rep)
    r["ks_w0"] = best("ks-cold", str(path), "0", rep)
    r["ks_warm1"] = best("ks-cold", str(path), "warm1", rep)
    r["ks_warm"] = best("ks-cold", str(path), f"warm{args.workers}", rep)
    rank = r["ks_cold"].get("rank")
    rank = 0 if rank is None else rank
    r["floor_json"] = best("floor-json", str(path), "", rep)
    r["floor_typed"] = best("floor-typed", str(path), "", rep)
    r["floor_chunked"] = best("floor-chunked", str(path), "", rep)

    def clear(cache_dir: Path = cache_dir) -> None:
        import shutil

        shutil.rmtree(cache_dir, ignore_errors=True)

    r["ks_first"] = best("ks-first", str(path), str(cache_dir), rep, prepare=clear)
    r["ks_cache"] = best("ks-cache", str(path), str(cache_dir), rep)
    if not args.skip_hta:
        r["hta"] = best("hta", str(path), str(rank), rep)
    r["events"] = r["ks_cold"]["events"]
    print(json.dumps(r), file=sys.stderr)
    return r


def print_table(rows: list[dict], base: dict, multi: dict | None = None) -> None:
    def f(x, nd=2):
        return "-" if x is None else f"{x:.{nd}f}"

    def wrss(r):  # main process RSS + the workers' peak RSS
        w = r.get("worker_rss") or []
        return f"{f(r['rss'], 0)}" + (f" + {len(w)}x{f(max(w), 0)}" if w else "")

    def total(r):
        return r["rss"] + sum(r.get("worker_rss") or [])

    hdr = (
        "| trace | raw MB | X events | HTA s | KS cold s (load + 4 analyses) | KS prestarted s | KS 1 process s "
        "| KS first s | KS cache s (load + 4) | floor json s | floor typed s | floor chunked s "
        "| HTA ÷ KS cold | HTA ÷ KS prestarted | HTA ÷ KS 1 process | KS cold ÷ floor typed | KS prestarted ÷ floor typed "
        "| peak RSS MB: HTA / KS cold (main + workers) / KS 1 process / KS cache / floor typed | KS RSS ÷ raw: 1 process / cold, all processes |"
    )
    print(hdr)
    print("|" + "|".join(["---"] * (hdr.count("|") - 1)) + "|")
    for r in rows:
        hta = r.get("hta")
        cold, cache, ft, fc = r["ks_cold"], r["ks_cache"], r["floor_typed"], r["floor_chunked"]
        w0, warm = r.get("ks_w0", cold), r.get("ks_warm", cold)
        ratio = (lambda k, hta=hta: f"{f(hta['wall'] / k['wall'], 1)}x") if hta else (lambda k: "-")
        print(
            f"| {r['trace']} | {r['raw_mb']:.0f} | {r['events']:,} | {f(hta['wall'] if hta else None)} "
            f"| {f(cold['wall'])} ({f(cold['load'])} + {f(cold['analyses'])}) | {f(warm['wall'])} | {f(w0['wall'])} "
            f"| {f(r['ks_first']['wall'])} "
            f"| {f(cache['wall'])} ({f(cache['load'])} + {f(cache['analyses'])}) | {f(r['floor_json']['wall'])} "
            f"| {f(ft['wall'])} | {f(fc['wall'])} "
            f"| {ratio(cold)} | {ratio(warm)} | {ratio(w0)} | {f(cold['wall'] / ft['wall'])}x | {f(warm['wall'] / ft['wall'])}x "
            f"| {f(hta['rss'] if hta else None, 0)} / {wrss(cold)} / {f(w0['rss'], 0)} / {f(cache['rss'], 0)} / {f(ft['rss'], 0)} "
            f"| {f(w0['rss'] / r['raw_mb'])} / {f(total(cold) / r['raw_mb'])} |"
        )
    print()
    hdr = (
        "| trace | 1 process (workers=0) s | 1 worker, prestarted s | N workers, prestarted s | N workers, started in the call s "
        "| chunks by workers (N, cold) | main CPU s / workers CPU s (N, prestarted) | RSS MB main + workers (N, prestarted) |"
    )
    print(hdr)
    print("|" + "|".join(["---"] * (hdr.count("|") - 1)) + "|")
    for r in rows:
        cold = r["ks_cold"]
        w0, w1, warm = r.get("ks_w0"), r.get("ks_warm1"), r.get("ks_warm")
        if not (w0 and w1 and warm):
            continue
        print(
            f"| {r['trace']} | {f(w0['load'])} | {f(w1['load'])} | {f(warm['load'])} (N={warm.get('workers_n')}) "
            f"| {f(cold['load'])} (N={cold.get('workers_n')}) | {cold.get('chunks_by_workers')} "
            f"| {f(warm['cpu'])} / {f(warm.get('worker_cpu'))} | {wrss(warm)} |"
        )
    if multi:
        hta = multi.get("hta")
        ks, kc = multi["ks"], multi["ks_cache"]
        print(
            f"\n{multi['ranks']} ranks x trace_diff/control (load_traces + 4 analyses over all ranks): "
            f"HTA {f(hta['wall'] if hta else None)} s (load {f(hta['load'] if hta else None)}), "
            f"KS cold {f(ks['wall'])} s (load {f(ks['load'])}), KS cache {f(kc['wall'])} s (load {f(kc['load'])}); "
            f"HTA ÷ KS cold {f(hta['wall'] / ks['wall'], 1) if hta else '-'}x; peak RSS MB HTA "
            f"{f(hta['rss'] if hta else None, 0)} (parent only) / KS {f(ks['rss'], 0)} (parent; workers are separate processes)"
        )
    print(f"\nbaseline (python + imports of kinetoscope.trace and the analyses): RSS {base['rss']:.0f} MB")
    print(
        "KS 1-process RSS above baseline ÷ raw JSON size: "
        + ", ".join(
            f"{r['trace'].split('/')[-1][:24]} {(r.get('ks_w0', r['ks_cold'])['rss'] - base['rss']) / r['raw_mb']:.2f}"
            for r in rows
        )
    )
    print("CPU seconds (same runs; KS cold: main process + workers):")
    for r in rows:
        hta = r.get("hta")
        c = r["ks_cold"]
        print(
            f"  {r['trace']}: hta {f(hta['cpu'] if hta else None)}  ks cold {f(c['cpu'])} + {f(c.get('worker_cpu'))}  "
            f"ks 1 process {f(r.get('ks_w0', c)['cpu'])}  ks cache {f(r['ks_cache']['cpu'])}  floor json {f(r['floor_json']['cpu'])}  "
            f"floor typed {f(r['floor_typed']['cpu'])}  floor chunked {f(r['floor_chunked']['cpu'])}"
        )


if __name__ == "__main__":
    main()
