"""A 4-rank CPU job traced right after launch: is the headline ever wrong? (issue 28)

Each run starts a private ``kscope daemon`` and a real torchrun job (4 ranks, gloo, CPU; rank 1
sleeps ``--straggler-ms`` before ``backward()`` every step: a persistent straggler), waits until
``--delay`` seconds after the launch (and until the ranks have registered with the daemon), then
runs the real CLI: ``kscope trace --job-id J --iterations 10 --wait --timeout T --json``, and
diagnoses the files. Each run is one of:

``right``         the headline names rank 1 as a persistent straggler (or an intermittent or
                  mixed verdict including rank 1: a rank the loaded host stalled beside it);
``not-assessed``  ``NOT ASSESSED`` with its reason (the evidence says the trace cannot carry it);
``no-verdict``    ``NO STRAGGLER`` / ``STRAGGLERS NOT ASSESSED`` (missed, but not wrong);
``wrong``         any other straggler named, or an ``UNEVEN INPUTS`` headline;
``no-trace``      the trace request itself failed (exit 1).

    nice -n 10 python benchmarks/bench_early_trace.py --runs 10 [--json out.json]

Prints one line per run (delay, exit status, steps per rank, headline) and the counts.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

STRAGGLER = 1


def classify(headline: str) -> str:
    """The run's outcome from the first summary line (module docstring)."""
    h = re.sub(r"^(\[[^\]]*\] )+", "", headline)
    if h.startswith("NOT ASSESSED"):
        return "not-assessed"
    if h.startswith("UNEVEN INPUTS"):
        return "wrong"
    if h.startswith(("PERSISTENT STRAGGLER", "INTERMITTENT STRAGGLER", "MIXED STRAGGLER")):
        named = {int(n) for n in re.findall(r"rank (\d+)", h)}
        if h.startswith("PERSISTENT"):
            return "right" if named == {STRAGGLER} else "wrong"
        return "right" if STRAGGLER in named else "wrong"
    return "no-verdict"


def one_run(
    workdir: Path,
    delay_s: float,
    timeout_s: float,
    straggler_ms: float,
    seed: int,
    when_stepping: bool = False,
    extra: tuple[str, ...] = (),
    after_steps: int = 0,
) -> dict[str, Any]:
    """One launch, one early trace, one diagnosis (module docstring)."""
    from kinetoscope.demo.local import LocalDaemon, TrainingJob
    from kinetoscope.diagnosis import diagnose

    job_id = random.Random(seed).randint(10_000, 2**31 - 1)
    out: dict[str, Any] = {"seed": seed}
    with LocalDaemon(workdir) as daemon:
        env = {**daemon.kineto_env(), "SLURM_JOB_ID": str(job_id)}
        launched = time.monotonic()
        with TrainingJob(
            workdir,
            ranks=4,
            steps=0,
            straggler="persistent",
            straggler_rank=STRAGGLER,
            straggler_ms=(straggler_ms, straggler_ms),
            model="tiny",
            max_seconds=240,
            env=env,
            extra_args=["--quiet"],
            seed=seed,
        ) as job:
            daemon.wait_for_processes(4, job_id=job_id, timeout=120, alive=job.alive)
            if after_steps:  # the moment the job starts stepping, not a fixed delay
                job.wait_for_steps(after_steps, timeout=180)
            time.sleep(max(0.0, delay_s - (time.monotonic() - launched)))
            out["delay_s"] = round(time.monotonic() - launched, 1)
            out["steps_at_trigger"] = max((d.get("step", 0) for d in job.progress().values()), default=0)
            argv = [
                sys.executable, "-m", "kinetoscope.cli.main", "trace", "-H", str(daemon.address),
                "--job-id", str(job_id), "--iterations", "10", "--wait", "--timeout", f"{timeout_s:g}",
                "--json", "--no-catalog",
            ] + (["--when-stepping"] if when_stepping else []) + list(extra)  # fmt: skip
            proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s + 120)
            job.stop()
    out["exit"] = proc.returncode
    try:
        doc = json.loads(proc.stdout)
    except ValueError:
        out.update(outcome="no-trace", headline=proc.stderr.strip().splitlines()[-1:] or [""])
        return out
    out["captured"] = {
        k: (doc.get("captured") or {}).get(k) for k in ("usable", "reason", "steps_in_common", "warming_up")
    }
    trace_dir = doc.get("output_dir")
    if proc.returncode == 1 or not trace_dir:
        out.update(outcome="no-trace", headline=[e.get("message") for e in doc.get("errors", [])][:1])
        return out
    d = diagnose(trace_dir)
    summary = list(d.summary())
    out["headline"] = summary[0]
    out["steps_per_rank"] = {r.rank: r.steps for r in d.evidence.ranks} if d.evidence else {}
    out["outcome"] = classify(summary[0])
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--delay", type=float, default=5.0, help="seconds after launch to trigger (default 5)")
    ap.add_argument("--timeout", type=float, default=90.0, help="kscope trace --timeout (default 90)")
    ap.add_argument("--straggler-ms", type=float, default=30.0)
    ap.add_argument("--when-stepping", action="store_true", help="pass --when-stepping to kscope trace")
    ap.add_argument(
        "--no-align", action="store_true", help="pass --no-align (each rank starts at its next step)"
    )
    ap.add_argument(
        "--after-steps",
        type=int,
        default=0,
        help="trigger once the job has done N steps (and --delay passed)",
    )
    ap.add_argument("--json", dest="json_out", default=None, help="write the runs here")
    args = ap.parse_args()
    runs = []
    for k in range(args.runs):
        with tempfile.TemporaryDirectory(prefix="kscope-early-") as tmp:
            extra = ("--no-align",) if args.no_align else ()
            r = one_run(
                Path(tmp),
                args.delay,
                args.timeout,
                args.straggler_ms,
                100 + k,
                args.when_stepping,
                extra,
                args.after_steps,
            )
        runs.append(r)
        print(
            f"run {k + 1}: {r['outcome']:<12} delay {r.get('delay_s')} s, step {r.get('steps_at_trigger')} at "
            f"trigger, exit {r.get('exit')}, steps per rank {r.get('steps_per_rank')}: {r.get('headline')}",
            flush=True,
        )
    counts: dict[str, int] = {}
    for r in runs:
        counts[r["outcome"]] = counts.get(r["outcome"], 0) + 1
    print("outcomes: " + ", ".join(f"{k} {v}/{len(runs)}" for k, v in sorted(counts.items())))
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(runs, indent=1))
    return 1 if counts.get("wrong") else 0


if __name__ == "__main__":
    sys.exit(main())
