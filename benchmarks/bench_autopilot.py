"""Benchmark: the autopilot against N simulated hosts (issue 11).

    .venv/bin/python benchmarks/bench_autopilot.py [--hosts 1000] [--procs 4] [--idle-s 20]

The simulated fleet (``sim_fleet.py``: the daemon's real RPC server and handlers on loopback,
``--procs`` invented registered ranks of one job per host) runs in a child process. Measured:

1. ``sweep``   one discovery sweep (``kscopeListProcesses`` on every host, grouping) — seconds;
2. ``upsert``  recording the N jobs in a fresh SQLite catalog — seconds;
3. ``plan``    claiming a sample of every job (lease + ``planned`` row each) — seconds;
4. ``fanout``  triggering those N samples (one ``kscopeTrace`` per job, ``max_in_flight`` = N,
               the autopilot's thread pool) and recording them ``triggered`` — seconds;
5. ``idle``    a real ``kscope autopilot`` process (nothing due: warm-up 1 h) after its first
               cycle: CPU share of one core over ``--idle-s`` seconds between sweeps, and RSS.

Targets: sweep and fan-out each < 3 s for 1,000 hosts; < 2 % of a core when idle.
Figures: docs/autopilot.md.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))


def in_process(addresses: list[str], workdir: Path) -> dict[str, Any]:
    """Steps 1-4 in this process."""
    from kinetoscope.autopilot.policy import Policy
    from kinetoscope.autopilot.service import Autopilot, AutopilotConfig, CycleReport

    n = len(addresses)
    policy = Policy(warmup_s=0, min_age_s=0, max_in_flight=n, workers=64, rpc_timeout_s=30)
    pilot = Autopilot(
        AutopilotConfig(
            hosts=addresses, catalog_url=str(workdir / "catalog.db"), policy=policy, instance="bench"
        )
    )
    from kinetoscope.autopilot.discovery import sweep

    t0 = time.perf_counter()
    result = sweep(addresses, token=None, rpc_timeout=30, workers=policy.workers, opt_out_values=("off",))
    sweep_s = time.perf_counter() - t0
    assert len(result.answered) == n, result.failed
    t0 = time.perf_counter()
    pilot.store.upsert_jobs(result.jobs, 0)
    upsert_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    samples = pilot.plan(CycleReport(), set())
    plan_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=policy.workers) as pool:  # what Autopilot.execute does first
        results = list(pool.map(pilot._trigger, samples))
    pilot.store.mark_triggered(
        {s.sample_id: pilot._request_of(s, r) for s, r in zip(samples, results) if r.files}
    )
    fanout_s = time.perf_counter() - t0
    pilot.close()
    return {
        "sweep_s": round(sweep_s, 3),
        "jobs": len(result.jobs),
        "upsert_s": round(upsert_s, 3),
        "plan_s": round(plan_s, 3),
        "samples": len(samples),
        "fanout_s": round(fanout_s, 3),
        "triggered": sum(len(r.files) for r in results),
        "errors": sum(len(r.errors) for r in results),
    }


def idle_service(addresses: list[str], workdir: Path, idle_s: float) -> dict[str, Any]:
    """Step 5: a real `kscope autopilot` between sweeps."""
    import psutil

    hosts = workdir / "hosts.txt"
    hosts.write_text("\n".join(addresses) + "\n")
    policy = workdir / "policy.toml"
    policy.write_text("warmup_s = 3600\nsweep_interval_s = 3600\n")
    log = workdir / "autopilot.log"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "kinetoscope.cli.main",
                "autopilot",
                "--hosts-file",
                str(hosts),
                "--catalog",
                str(workdir / "service.db"),
                "--policy",
                str(policy),
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
        )
    try:
        deadline = time.monotonic() + 300
        while "cycle done" not in log.read_text(errors="replace"):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(log.read_text()[-2000:])
            time.sleep(0.2)
        p = psutil.Process(proc.pid)
        time.sleep(1.0)
        c0, t0 = p.cpu_times(), time.monotonic()
        time.sleep(idle_s)
        c1, t1 = p.cpu_times(), time.monotonic()
        cpu = (c1.user + c1.system - c0.user - c0.system) / (t1 - t0) * 100.0
        rss = p.memory_info().rss
        first_cycle = next(ln for ln in log.read_text().splitlines() if "cycle done" in ln)
    finally:
        proc.terminate()
        proc.wait(30)
    return {
        "idle_cpu_pct_of_core": round(max(0.0, cpu), 3),  # a counter read twice within its resolution
        "rss_mib": round(rss / 2**20, 1),
        "first_cycle": first_cycle,
        "exit_on_sigterm": proc.returncode,
    }


def main() -> None:
    from bench_fanout import FleetProcess

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hosts", type=int, default=1000)
    ap.add_argument("--procs", type=int, default=4)
    ap.add_argument("--idle-s", type=float, default=20.0)
    args = ap.parse_args()
    with (
        tempfile.TemporaryDirectory(prefix="kscope-bench-ap-") as tmp,
        FleetProcess(args.hosts, args.procs) as fleet,
    ):
        work = Path(tmp)
        out = in_process(fleet.addresses, work)
        fleet.poll_all()
        out.update(idle_service(fleet.addresses, work, args.idle_s))
    print(
        f"{args.hosts} simulated hosts x {args.procs} ranks: sweep {out['sweep_s']:.2f} s, "
        f"record jobs {out['upsert_s']:.2f} s, claim samples {out['plan_s']:.2f} s, "
        f"fan-out {out['fanout_s']:.2f} s ({out['triggered']} processes, {out['errors']} errors); "
        f"idle {out['idle_cpu_pct_of_core']:.2f} % of a core, RSS {out['rss_mib']:.0f} MiB"
    )
    print(json.dumps(out))


if __name__ == "__main__":
    main()
