"""Benchmark: `kscope trace` fanned out to N simulated hosts (issue 12, "Fan-out to 1,000 hosts").

    .venv/bin/python benchmarks/bench_fanout.py [--hosts 1000] [--procs 4] [--repeat 3]

A simulated fleet (``sim_fleet.py``: the daemon's real RPC server and handlers on loopback, with
invented registered processes) runs in a child process so that only the trigger is measured
here. Printed per run:

* ``lib``  ``trigger_trace(hosts, Target(all=True), iterations=5)``: wall seconds until every
           host has answered (all triggered), and the time to the first answer;
* ``cli``  ``kscope trace --host H1,H2,... --all --iterations 5 --no-catalog --json`` as a
           subprocess: wall seconds including interpreter start-up, and its exit status.

Target: all triggered within 3 s for 1,000 hosts. Figures: docs/autopilot.md.
Called by ``bench_scale.py --fanout N`` (``run(N)``).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Self

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))


def _serve_fleet(hosts: int, procs: int, trace_root: str, conn: Any) -> None:
    """Child process: run the simulated fleet until told to stop."""
    from sim_fleet import SimFleet

    with SimFleet(hosts, procs, trace_root=trace_root) as fleet:
        conn.send(fleet.addresses)
        while conn.recv() == "poll":
            conn.send(fleet.poll_all())


class FleetProcess:
    """A simulated fleet in a child process (``with FleetProcess(1000) as fleet: fleet.addresses``)."""

    def __init__(self, hosts: int, procs: int = 4) -> None:
        self.hosts, self.procs = hosts, procs
        self.tmp = tempfile.TemporaryDirectory(prefix="kscope-fanout-")
        ctx = mp.get_context("spawn")
        self.parent, child = ctx.Pipe()
        self.proc = ctx.Process(target=_serve_fleet, args=(hosts, procs, self.tmp.name, child), daemon=True)

    def __enter__(self) -> Self:
        self.proc.start()
        self.addresses: list[str] = self.parent.recv()
        return self

    def poll_all(self) -> int:
        """Let every simulated process poll (hands out the pending configs of the last request)."""
        self.parent.send("poll")
        return int(self.parent.recv())

    def __exit__(self, *exc: object) -> None:
        self.parent.send("stop")
        self.proc.join(60)
        self.tmp.cleanup()


def trigger_once(addresses: list[str]) -> dict[str, float]:
    """One library fan-out: seconds to the first answer and to all."""
    from kinetoscope.collect import trigger as trig
    from kinetoscope.collect.client import DaemonClient, parse_host

    first: list[float] = []
    original = DaemonClient.trace
    start = time.perf_counter()

    def timed(self: DaemonClient, *args: Any, **fields: Any) -> Any:
        reply = original(self, *args, **fields)
        if not first:
            first.append(time.perf_counter() - start)
        return reply

    DaemonClient.trace = timed  # type: ignore[method-assign]
    try:
        request = trig.TraceRequest(
            hosts=tuple(parse_host(a) for a in addresses),
            target=trig.Target(all=True),
            options=trig.TraceOptions(iterations=5, align=False),
        )
        res = trig.trigger_trace(
            request,
            write_manifest_file=False,
        )
    finally:
        DaemonClient.trace = original  # type: ignore[method-assign]
    total = time.perf_counter() - start
    assert not res.errors, res.errors[:3]
    return {"first_s": round(first[0], 3), "all_s": round(total, 3), "triggered": len(res.triggered)}


def cli_once(addresses: list[str]) -> dict[str, Any]:
    """`kscope trace` over the fleet as a subprocess."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    start = time.perf_counter()
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "kinetoscope.cli.main",
            "trace",
            "--host",
            ",".join(addresses),
            "--all",
            "--iterations",
            "5",
            "--no-align",
            "--no-catalog",
            "--json",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        check=False,
    )
    wall = time.perf_counter() - start
    doc = json.loads(out.stdout) if out.stdout.strip().startswith("{") else {}
    return {
        "wall_s": round(wall, 3),
        "rc": out.returncode,
        "triggered": sum(1 for m in doc.get("matched", []) if m.get("triggered")),
    }


def run(hosts: int = 1000, procs: int = 4, repeat: int = 3, cli: bool = True) -> dict[str, Any]:
    libs, clis = [], []
    with FleetProcess(hosts, procs) as fleet:
        for _ in range(repeat):
            libs.append(trigger_once(fleet.addresses))
            fleet.poll_all()
        if cli:
            clis.append(cli_once(fleet.addresses))
    best = min(libs, key=lambda r: r["all_s"])
    return {"hosts": hosts, "procs_per_host": procs, "lib": libs, "lib_best": best, "cli": clis}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hosts", type=int, default=1000)
    ap.add_argument("--procs", type=int, default=4, help="registered processes per host")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--no-cli", action="store_true")
    args = ap.parse_args()
    out = run(args.hosts, args.procs, args.repeat, cli=not args.no_cli)
    b = out["lib_best"]
    print(
        f"fan-out to {args.hosts} hosts ({args.procs} processes each): first answer {b['first_s']:.3f} s, "
        f"all triggered {b['all_s']:.3f} s ({b['triggered']} processes; best of {args.repeat})"
    )
    for c in out["cli"]:
        print(
            f"kscope trace --host <{args.hosts} hosts> --all: {c['wall_s']:.2f} s wall incl. start-up, "
            f"exit {c['rc']}, {c['triggered']} processes triggered"
        )
    print(json.dumps(out))


if __name__ == "__main__":
    main()
