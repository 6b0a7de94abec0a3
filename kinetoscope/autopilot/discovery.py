"""Discovery: ask every daemon which processes are registered and group them into jobs.

One sweep calls ``kscopeListProcesses`` on every host concurrently (a bounded thread pool; a
daemon costs one short TCP exchange) and turns the answers into :class:`SeenJob` records keyed by
a **job key** (see ``kinetoscope.store.fleet_models``): Kineto's own job id is ``0`` for every job
outside Slurm, so processes are grouped by Slurm job id, else by the job identity the daemon
derived (``job_source``/``job_id``, docs/deploy.md §5), else (older daemons) by the torch
rendezvous (``MASTER_ADDR:MASTER_PORT`` + ``TORCHELASTIC_RUN_ID``), else each process alone.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from kinetoscope.collect.client import DaemonClient, DaemonError, HostAddress, parse_host
from kinetoscope.collect.trigger import poll_interval_of
from kinetoscope.protocol import rpc
from kinetoscope.store.fleet import SeenJob


@dataclass
class SweepResult:
    """What one discovery sweep found."""

    jobs: list[SeenJob] = field(default_factory=list)
    answered: dict[str, str] = field(default_factory=dict)  # address -> daemon's hostname
    failed: dict[str, str] = field(default_factory=dict)  # address -> why
    skipped: list[str] = field(default_factory=list)  # in back-off, not asked
    seconds: float = 0.0


def job_key(proc: rpc.ProcessInfo, hostname: str) -> str:
    """The job a listed process belongs to (module docstring)."""
    if proc.slurm_job_id:
        return f"slurm:{proc.slurm_job_id}"
    # a daemon with job identity (docs/deploy.md §5) names the job itself: Kubernetes, Ray,
    # torchrun, MPI or the launcher, the same on every host for multi-host launchers
    if proc.job_source not in (None, "kineto", "slurm") and proc.job_id:
        return f"job:{proc.job_id}"
    world = proc.world_size
    addr, port = proc.master_addr, proc.master_port
    if world is not None and world > 1 and addr and port:
        return f"torch:{addr}:{port}:{proc.torchelastic_run_id or '-'}"
    return f"proc:{hostname}:{proc.pid}"


def _is_opted_out(proc: rpc.ProcessInfo, opt_out_values: Sequence[str]) -> bool:
    value = proc.autopilot
    return value is not None and value.strip().lower() in opt_out_values


def _rank_entry(address: str, hostname: str, p: rpc.ProcessInfo) -> dict[str, Any]:
    """One rank of a :class:`SeenJob` (its ``ranks`` JSON)."""
    return {
        "host": address,
        "hostname": hostname,
        "pid": p.pid,
        "rank": p.rank,
        "poll_s": poll_interval_of(p),
        "cpu_s": p.cpu_s,  # the hang check (autopilot/hang.py)
    }


def group_jobs(
    listings: dict[str, tuple[str, list[rpc.ProcessInfo]]],
    opt_out_values: Sequence[str],
    devices_per_rank: int,
) -> list[SeenJob]:
    """``address -> (hostname, processes)`` into jobs (launchers and dead processes left out)."""
    groups: dict[str, list[tuple[str, str, rpc.ProcessInfo]]] = {}
    for address, (hostname, procs) in listings.items():
        for p in procs:
            if p.is_launcher or p.alive is False:
                continue
            groups.setdefault(job_key(p, hostname), []).append((address, hostname, p))
    jobs = []
    for key, members in sorted(groups.items()):
        procs = [m[2] for m in members]
        sizes = {p.world_size for p in procs if p.world_size is not None}
        ranks = [_rank_entry(a, h, p) for a, h, p in members]
        ranks.sort(key=lambda r: (r["rank"] if isinstance(r["rank"], int) else 1 << 30, r["host"], r["pid"]))
        ages = [p.registered_s_ago for p in procs if p.registered_s_ago is not None]
        jobs.append(
            SeenJob(
                job_key=key,
                job_id=procs[0].job_id,
                cmdline=next((p.cmdline for p in procs if p.cmdline), None),
                hosts=sorted({m[0] for m in members}),
                ranks=ranks,
                world_size=max(sizes) if sizes else len(procs),
                devices=len(procs) * devices_per_rank,
                opted_out=any(_is_opted_out(p, opt_out_values) for p in procs),
                age_s=max(ages, default=0.0),
            )
        )
    return jobs


def sweep(
    addresses: Sequence[str],
    *,
    token: str | None,
    rpc_timeout: float,
    workers: int,
    opt_out_values: Sequence[str],
    devices_per_rank: int = 1,
    skip: frozenset[str] = frozenset(),
    client_factory: Callable[[HostAddress], DaemonClient] | None = None,
) -> SweepResult:
    """Ask every address not in ``skip`` for its processes; group the answers into jobs."""
    started = time.perf_counter()
    result = SweepResult(skipped=[a for a in addresses if a in skip])
    asked = [a for a in addresses if a not in skip]

    def one(address: str) -> tuple[str, rpc.KscopeListProcessesResponse | None, str | None]:
        addr = parse_host(address)
        client = (
            client_factory(addr) if client_factory else DaemonClient(addr, token=token, timeout=rpc_timeout)
        )
        try:
            return address, client.list_processes(), None
        except DaemonError as exc:
            return address, None, str(exc)

    listings: dict[str, tuple[str, list[rpc.ProcessInfo]]] = {}
    if asked:
        with ThreadPoolExecutor(
            max_workers=max(1, min(workers, len(asked))), thread_name_prefix="kscope-sweep"
        ) as pool:
            for address, reply, error in pool.map(one, asked):
                if reply is None:
                    result.failed[address] = error or "no answer"
                    continue
                hostname = reply.hostname or parse_host(address).host
                result.answered[address] = hostname
                listings[address] = (hostname, reply.processes)
    result.jobs = group_jobs(listings, opt_out_values, devices_per_rank)
    result.seconds = time.perf_counter() - started
    return result
