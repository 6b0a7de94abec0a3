"""How often `kscope demo` names its straggler, next to CPU burners (issue 27: 10 of 10).

Runs the demo (``run_demo`` with its default options: the same job as ``kscope demo``) ``N``
times, each in a fresh process, while ``--burners`` busy-loop processes compete for the CPUs.
Per run it prints the verdict's first line, the ranks the verdict names (``stragglers.ranks``),
the rank the demo injected (read from the demo's own configuration, ``DemoContext``, and its
step log: ``ground_truth``) and whether the first line names exactly that rank. Last line: the
count, the load average and the CPU seconds of the runs.

    nice -n 10 python benchmarks/bench_demo_verdict.py [--runs 10] [--burners 1] [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# One demo in a child process: prints one JSON line with what the bench needs.
_CHILD = r"""
import io, json, sys
from rich.console import Console
from kinetoscope.demo.driver import DemoOptions, run_demo
from kinetoscope.document import decode
ctx = run_demo(DemoOptions(workdir=sys.argv[1]), console=Console(file=io.StringIO(), width=200))
doc = decode(ctx.extras["document"])
lines = [s for s in doc.summary_lines or [] if not s.startswith("Recommendation (")]
print(json.dumps({
    "injected": ctx.straggler_rank,
    "straggler": ctx.options.straggler,
    "truth": ctx.extras.get("ground_truth"),
    "first_line": lines[0] if lines else "",
    "ranks": list(doc.stragglers.ranks) if doc.stragglers is not None else [],
    "kind": doc.stragglers.kind if doc.stragglers is not None else None,
}))
"""


def named_in(line: str) -> set[int]:
    """The ranks a verdict line names (``rank 3``, ``ranks 1, 3``; before the first ``(``-free
    clause that starts a recommendation)."""
    head = line.split(":", 1)[1] if ":" in line else line
    out: set[int] = set()
    for m in re.finditer(r"\branks? ((?:\d+(?:, | and )?)+)", head):
        out |= {int(x) for x in re.findall(r"\d+", m.group(1))}
    return out


def one_run(workdir: Path) -> dict[str, object]:
    """One demo in a fresh process; its JSON line, or the error."""
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, str(workdir)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    if done.returncode != 0:
        return {"error": (done.stderr.strip().splitlines() or ["?"])[-1][:300]}
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--burners", type=int, default=1, help="busy-loop processes beside each run")
    ap.add_argument("--keep", type=Path, help="copy the work folder (traces, logs) of each miss here")
    a = ap.parse_args(argv)
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(max(0, a.burners))]
    ok = 0
    loads: list[float] = []
    t0 = time.perf_counter()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for i in range(a.runs):
                row = one_run(Path(tmp) / f"demo{i}")
                loads.append(os.getloadavg()[0])
                injected = row.get("injected")
                first = str(row.get("first_line") or "")
                row["exact"] = (
                    bool(first) and named_in(first) == {injected} and row.get("ranks") == [injected]
                )
                ok += bool(row["exact"])
                if a.keep is not None and not row["exact"]:
                    shutil.copytree(Path(tmp) / f"demo{i}", a.keep / f"demo{i}", dirs_exist_ok=True)
                print(json.dumps({"run": i, **row}), flush=True)
        cpu = resource.getrusage(resource.RUSAGE_CHILDREN)  # the demos' (burners not reaped yet)
    finally:
        for p in burners:
            p.kill()
            p.wait()
    print(
        json.dumps(
            {
                "named_exactly": f"{ok}/{a.runs}",
                "burners": a.burners,
                "load_avg_1m": [round(x, 1) for x in loads],
                "wall_s": round(time.perf_counter() - t0, 1),
                "cpu_s_children": round(cpu.ru_utime + cpu.ru_stime, 1),
            }
        )
    )
    return 0 if ok == a.runs else 1


if __name__ == "__main__":
    sys.exit(main())
