"""Cost of the group-aware diagnosis on a real 64-rank DP x PP x TP job: linear in steps.

Converts the OSDI '25 artifact's AR job (``benchmarks/osdi_to_kineto.py``) with ``N`` and
``4 N`` steps, runs ``kscope analyze`` on each (the product's command, in a fresh process) and
prints the wall and CPU time of each, their ratios (linear: about 4; the issue measured 7
before groups), the CPU seconds (``time.process_time``) of ``diagnose()`` alone on the loaded
traces in a fresh process (the loader's worker processes are not waited for, so the command's
CPU time leaves them out; the diagnosis runs in the process itself), the load average,
how many collective instances were matched complete, the largest clock offset (the truth is 0:
the artifact has one clock) and the first verdict line.

    python benchmarks/bench_groups.py [--steps 11] [--src ../shared/traces/osdi25_whatif]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT_SRC = REPO.parent / "shared" / "traces" / "osdi25_whatif"


def analyze(folder: Path) -> tuple[float, float, dict[str, object]]:
    """Wall and CPU seconds (user + system of the child and the processes it waited for) of
    ``kscope analyze --json`` on ``folder``, and the document. Both ratios are printed: on a
    shared, loaded machine the wall time says much about the other load; the CPU time leaves out
    worker processes the command does not wait for."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "kinetoscope.cli.main", "analyze", str(folder), "--json"],
        check=True,
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, json.loads(done.stdout)


# A fresh process: load the folder's traces, then time diagnose() alone (CPU and wall).
_DIAGNOSE = r"""
import json, sys, time
from kinetoscope.diagnosis import diagnose
from kinetoscope.trace import load_trace
from kinetoscope.trace.discover import trace_files_in
traces = [load_trace(f) for f in trace_files_in(sys.argv[1])]
c, w = time.process_time(), time.perf_counter()
diagnose(traces)
print(json.dumps({"diagnose_cpu_s": round(time.process_time() - c, 2),
                  "diagnose_wall_s": round(time.perf_counter() - w, 2)}))
"""


def diagnose_cpu(folder: Path) -> dict[str, float]:
    """CPU and wall seconds of ``diagnose()`` on ``folder``'s traces, loaded first, in a
    fresh process (``time.process_time``: this process's threads included)."""
    done = subprocess.run(
        [sys.executable, "-c", _DIAGNOSE, str(folder)], check=True, cwd=REPO, capture_output=True, text=True
    )
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def _find(doc: object, key: str) -> object:
    """The first value of ``key`` in a nested document (the diagnosis keys may sit at the top
    or under the diagnosis)."""
    if isinstance(doc, dict):
        if key in doc:
            return doc[key]
        for v in doc.values():
            found = _find(v, key)
            if found is not None:
                return found
    return None


def figures(doc: dict[str, object]) -> dict[str, object]:
    """Matched instances, the largest clock offset (ms) and the verdict's first line."""
    s = _find(doc, "per_instance")
    clock = _find(doc, "clock")
    rows = clock.get("offsets", []) if isinstance(clock, dict) else []
    offsets = [abs(float(r.get("offset_us") or 0.0)) for r in rows if isinstance(r, dict)]
    summary = _find(doc, "diagnosis_summary")
    first = summary[0] if isinstance(summary, list) and summary else summary
    return {
        "complete_instances": s.get("instances") if isinstance(s, dict) else None,
        "partial_instances": s.get("partial_instances_dropped") if isinstance(s, dict) else None,
        "max_offset_ms": round(max(offsets) / 1000.0, 3) if offsets else None,
        "first_line": str(first)[:300] if first else None,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--src", type=Path, default=DEFAULT_SRC)
    ap.add_argument("--job", default="AR")
    ap.add_argument("--steps", type=int, default=11, help="N: the run with N steps, then with 4 N")
    a = ap.parse_args(argv)
    if not (a.src / f"trace-{a.job}.parquet").is_file():
        print(f"error: {a.src}/trace-{a.job}.parquet: not found", file=sys.stderr)
        return 2
    sys.path.insert(0, str(REPO))
    from benchmarks.osdi_to_kineto import convert

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for n in (a.steps, 4 * a.steps):
            folder = Path(tmp) / f"{a.job}-{n}"
            convert(a.src, a.job, folder, n)
            secs, cpu, doc = analyze(folder)
            rows.append(
                {
                    "steps": n,
                    "seconds": round(secs, 2),
                    "cpu_seconds": round(cpu, 2),
                    **diagnose_cpu(folder),
                    "load_avg_1m": round(os.getloadavg()[0], 1),
                    **figures(doc),
                }
            )
            print(json.dumps(rows[-1]))
    wall = rows[1]["seconds"] / rows[0]["seconds"] if rows[0]["seconds"] else float("nan")  # type: ignore[operator]
    cpu = rows[1]["cpu_seconds"] / rows[0]["cpu_seconds"] if rows[0]["cpu_seconds"] else float("nan")  # type: ignore[operator]
    dcpu = (
        rows[1]["diagnose_cpu_s"] / rows[0]["diagnose_cpu_s"] if rows[0]["diagnose_cpu_s"] else float("nan")
    )  # type: ignore[operator]
    print(
        json.dumps(
            {
                "wall_ratio_4x_steps": round(wall, 2),
                "cpu_ratio_4x_steps": round(cpu, 2),
                "diagnose_cpu_ratio_4x_steps": round(dcpu, 2),
                "linear_would_be": 4.0,
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
