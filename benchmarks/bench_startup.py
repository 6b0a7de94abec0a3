"""Benchmark of CLI start-up (not a test): how long `kscope --help` and two sub-command helps take,
as a ratio against a bare `python -c pass` measured in the same run (so a loaded machine moves
both numbers together).

Each command runs N times, interleaved round-robin with the baseline (a burst of load hits all
of them alike); the figure is the median wall time of a fresh process, including the
interpreter's own start-up. ``kscope analyze small --no-cache`` runs the four main analyses on a
13-event trace: almost all of it is start-up (the imports the command needs). Target: `kscope --help` <= 0.25 s (issue 10: it took 0.63-0.72 s
when every sub-command module and its libraries were imported up front).

    python benchmarks/bench_startup.py            # ~20 s
    python benchmarks/bench_startup.py --runs 41
    python benchmarks/bench_startup.py --other /tmp/old-checkout   # also time another checkout, same run
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TARGET_S = 0.25
CASES: dict[str, list[str]] = {
    "python -c pass": ["-c", "pass"],
    "kscope --help": ["-m", "kinetoscope.cli.main", "--help"],
    "kscope analyze --help": ["-m", "kinetoscope.cli.main", "analyze", "--help"],
    "kscope trace --help": ["-m", "kinetoscope.cli.main", "trace", "--help"],
    # every analysis's name and description: the registry's static table, no analysis imported
    "kscope analyze --list": ["-m", "kinetoscope.cli.main", "analyze", "--list"],
    # a whole small analysis (13 events), start-up dominated: what the command imports (issue 14)
    "kscope analyze small --no-cache": [
        "-m",
        "kinetoscope.cli.main",
        "analyze",
        "--no-cache",
        "--only",
        "temporal_breakdown",
        "--only",
        "idle_time_breakdown",
        "--only",
        "kernel_breakdown",
        "--only",
        "comm_comp_overlap",
        str(REPO / "tests" / "data" / "traces" / "hta" / "trace_file_list" / "inference_rank_1.json.gz"),
    ],
}


def run_once(args: list[str], cwd: Path) -> tuple[float, float]:
    """(wall, CPU) seconds of one fresh ``python <args>`` process in ``cwd`` (``-m`` imports the
    package found there first); output discarded, must succeed. CPU (user + system, from
    ``wait4``) is what a loaded machine inflates least: other processes take the cores, not
    this one's instructions."""
    env = {**os.environ, "COLUMNS": "100"}
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, *args], stdout=subprocess.DEVNULL, env=env, cwd=cwd)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    if os.waitstatus_to_exitcode(status):
        raise RuntimeError(f"{args} failed in {cwd}")
    return wall, usage.ru_utime + usage.ru_stime


def measure(runs: int, other: Path | None) -> dict[str, tuple[float, float]]:
    """Median (wall, CPU) seconds per case, the cases interleaved round-robin; one warm-up round
    first. With ``other``, the kscope cases run in that checkout too (named ``other: ...``)."""
    cases = {name: (args, REPO) for name, args in CASES.items()}
    if other is not None:
        cases |= {
            f"other: {name}": (args, other) for name, args in CASES.items() if name.startswith("kscope")
        }
    samples: dict[str, list[tuple[float, float]]] = {name: [] for name in cases}
    for args, cwd in cases.values():
        run_once(args, cwd)  # warm the page cache and .pyc files
    for _ in range(runs):
        for name, (args, cwd) in cases.items():
            samples[name].append(run_once(args, cwd))
    return {
        name: (statistics.median(v[0] for v in values), statistics.median(v[1] for v in values))
        for name, values in samples.items()
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=21, help="runs per command (median; default 21)")
    parser.add_argument(
        "--other", type=Path, help="another checkout to time in the same run (e.g. the old code)"
    )
    args = parser.parse_args()
    medians = measure(args.runs, args.other)
    base = medians["python -c pass"][0]
    print(f"CLI start-up, median of {args.runs} runs ({sys.executable}, {os.cpu_count()} CPUs)")
    print(f"load average: {os.getloadavg()} (wall time moves with it; CPU seconds much less)")
    print(f"{'command':<38} {'seconds':>8} {'x python -c pass':>17} {'CPU s':>7}")
    for name, (sec, cpu) in medians.items():
        print(f"{name:<38} {sec:>8.3f} {sec / base:>17.2f} {cpu:>7.3f}")
    verdict = "meets" if medians["kscope --help"][0] <= TARGET_S else "misses"
    print(f"kscope --help {verdict} the {TARGET_S:.2f} s target")
    return 0


if __name__ == "__main__":
    sys.exit(main())
