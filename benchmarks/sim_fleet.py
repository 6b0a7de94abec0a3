"""A simulated fleet: N daemons on loopback in this process, speaking the real dyno RPC.

Each simulated host is the daemon's own RPC stack (``kinetoscope.daemon.rpc_server.RpcServer`` +
``handlers.RpcHandlers`` + ``registry.Registry``), with its registry filled with fake registered
processes (as if Kineto clients had polled). ``kscopeListProcesses``, ``kscopeTrace`` and
``kscopeTraceStatus`` run the daemon's real code; only the processes are invented (their /proc
view is this process's, so they count as alive, and no trace file is ever written).

Used by ``benchmarks/bench_autopilot.py``, ``benchmarks/bench_fanout.py`` and tests::

    with SimFleet(hosts=1000, procs_per_host=4, trace_root=tmp) as fleet:
        fleet.addresses        # ["127.0.0.1:40001", ...]
"""

from __future__ import annotations

import os
import resource
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Self

from kinetoscope.daemon.handlers import RpcHandlers
from kinetoscope.daemon.metrics import DaemonMetrics
from kinetoscope.daemon.procinfo import ProcInfo
from kinetoscope.daemon.registry import Registry
from kinetoscope.daemon.rpc_server import BindSpec, RpcServer
from kinetoscope.daemon.traces import TraceBook

IDLE_POLL_TYPE = 3  # torch 2.13's "idle, give me a config" poll (ACTIVITIES bit set)


@dataclass
class SimHost:
    hostname: str
    registry: Registry
    handlers: RpcHandlers
    server: RpcServer

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.server.port}"


def raise_fd_limit(needed: int) -> None:
    """Each host needs a listening socket, and a sweep opens one connection per host."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < needed:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(needed, soft)), hard))


def _fake_info(host_index: int, pid: int, rank: int, world: int, opted_out: bool) -> ProcInfo:
    return ProcInfo(
        pid=os.getpid(),
        ppid=1,
        start_time=None,
        uid=os.getuid(),
        cmdline=f"python train.py --sim-host {host_index}",
        environ_readable=True,
        rank=rank,
        local_rank=rank,
        world_size=world,
        master_addr=f"sim{host_index}",
        master_port=29500,
        torchelastic_run_id=f"sim-{host_index}",
        autopilot="off" if opted_out else None,
    )


class SimFleet:
    """``hosts`` simulated daemons, each with ``procs_per_host`` registered ranks of one job."""

    def __init__(
        self, hosts: int, procs_per_host: int = 4, trace_root: str | None = None, opted_out_every: int = 0
    ) -> None:
        self.n = hosts
        self.procs_per_host = procs_per_host
        self.opted_out_every = opted_out_every
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        if trace_root is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="kscope-simfleet-")
            trace_root = self._tmp.name
        self.trace_root = trace_root
        self.hosts: list[SimHost] = []

    @property
    def addresses(self) -> list[str]:
        return [h.address for h in self.hosts]

    def _make_host(self, i: int) -> SimHost:
        hostname = f"sim{i:05d}"
        opted = bool(self.opted_out_every) and i % self.opted_out_every == 0
        infos: dict[int, ProcInfo] = {}

        def reader(leaf_pid: int, _sender: int | None) -> ProcInfo | None:
            return infos.get(leaf_pid)

        registry = Registry(gc_timeout_s=1e9, info_reader=reader)
        for r in range(self.procs_per_host):
            pid = 100_000 + i * 100 + r
            infos[pid] = _fake_info(i, pid, r, self.procs_per_host, opted)
            registry.poll(0, (pid, 1), IDLE_POLL_TYPE)
        root = Path(self.trace_root)  # one shared root, as an NFS trace root shared by every host
        root.mkdir(parents=True, exist_ok=True)
        handlers = RpcHandlers(
            registry=registry,
            book=TraceBook(),
            metrics=DaemonMetrics(),
            hostname=hostname,
            trace_root=str(root),
        )
        server = RpcServer(
            [BindSpec("127.0.0.1")],
            0,
            handlers.handle_frame,
            handlers.frame_error,
            fast=handlers.is_fast,
            max_connections=8,
        )
        server.start()
        return SimHost(hostname, registry, handlers, server)

    def start(self) -> SimFleet:
        raise_fd_limit(self.n * 3 + 256)
        for i in range(self.n):
            self.hosts.append(self._make_host(i))
        return self

    def poll_all(self) -> int:
        """Every simulated process polls once (as Kineto does every few seconds): pending trace
        configs are handed out, so the next request does not find them busy. Returns how many.

        A simulated process finishes a trace the moment it picks it up (it writes no file), so
        the daemon does not hold its next config back behind an unfinished iteration trace."""
        delivered = 0
        for h in self.hosts:
            for proc, _launcher in h.registry.snapshot():
                delivered += bool(h.registry.poll(int(proc.job_id), proc.pids, IDLE_POLL_TYPE))
                proc.delivered = None
        return delivered

    def stop(self) -> None:
        for h in self.hosts:
            h.server.stop()
        self.hosts = []
        if self._tmp is not None:
            self._tmp.cleanup()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


@contextmanager
def sim_fleet(hosts: int, procs_per_host: int = 4, **kw: object) -> Iterator[SimFleet]:
    fleet = SimFleet(hosts, procs_per_host, **kw)  # type: ignore[arg-type]
    try:
        yield fleet.start()
    finally:
        fleet.stop()


def write_hosts_file(path: str | Path, addresses: list[str]) -> Path:
    p = Path(path)
    p.write_text("# simulated fleet\n" + "\n".join(addresses) + "\n", encoding="utf-8")
    return p
