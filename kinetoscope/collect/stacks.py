"""``kscope stacks`` as a library: ask every daemon for Python stack snapshots of a job's
processes (``kscopeStacks``, docs/protocol.md §9.4), ``samples`` times about ``interval_s``
apart, and group the ranks (:mod:`kinetoscope.collect.stack_groups`). The CLI, the web app's
"take stacks now" button and the autopilot's hang check all call :func:`take_stacks`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from kinetoscope.collect.client import DaemonClient, HostAddress, parse_hosts
from kinetoscope.collect.stack_groups import RankStacks, StacksReport, build_report
from kinetoscope.collect.trigger import HostAnswer, Target, _ask_all, parse_job_id, parse_pids
from kinetoscope.errors import UsageError
from kinetoscope.protocol import rpc

MAX_SAMPLES = 20
DEFAULT_TIMEOUT_S = 10.0  # per process, on the daemon
# The client waits for a daemon's answer twice the per-process bound (two rounds of its 8 parallel
# snapshots at their slowest) plus this margin: long enough for a host's ranks, short for a
# host that is down.
RPC_MARGIN_S = 10.0


@dataclass(frozen=True)
class StacksRequest:
    """Which daemons, which processes, how many snapshots how far apart, with C frames or not."""

    hosts: tuple[HostAddress, ...]
    target: Target
    native: bool = False
    samples: int = 1
    interval_s: float = 1.0
    timeout_s: float = DEFAULT_TIMEOUT_S
    include_launchers: bool = False

    def validate(self) -> None:
        chosen = sum([self.target.job_id is not None, bool(self.target.pids), self.target.all])
        if chosen != 1:
            raise UsageError(
                "choose whose stacks to take: exactly one of --job-id ID, --pids P[,P...] or --all"
            )
        if not 1 <= self.samples <= MAX_SAMPLES:
            raise UsageError(f"--samples must be from 1 to {MAX_SAMPLES}, got {self.samples}")
        if not 0 < self.interval_s <= 60:
            raise UsageError(f"--interval must be above 0 and at most 60 seconds, got {self.interval_s:g}")
        if not 0 < self.timeout_s <= 60:
            raise UsageError(f"--timeout must be above 0 and at most 60 seconds, got {self.timeout_s:g}")

    def rpc_request(self) -> rpc.KscopeStacksRequest:
        fields = self.target.rpc_fields()
        return rpc.KscopeStacksRequest(
            job_id=fields.get("job_id"),
            pids=fields.get("pids"),
            all=bool(fields.get("all")),
            native=self.native,
            locals=self.samples > 1,  # what tells stuck from progressing (stack_groups)
            timeout_ms=int(self.timeout_s * 1000),
            include_launchers=self.include_launchers,
        )

    def target_json(self) -> dict[str, object]:
        t = self.target
        return {"job_id": t.job_id, "pids": list(t.pids), "all": t.all}


def parse_stacks_request(
    *,
    hosts: list[str] | None,
    job_id: str | None = None,
    pids: str | None = None,
    all: bool = False,
    native: bool = False,
    samples: int = 1,
    interval_s: float = 1.0,
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> tuple[StacksRequest, list[str]]:
    """A validated request from what a person typed, and notes (a Slurm array id, ...)."""
    notes: list[str] = []
    jid: int | str | None = None
    if job_id is not None:
        jid, note = parse_job_id(job_id)
        if note:
            notes.append(note)
    target = Target(
        job_id=jid, job_id_text=job_id, pids=parse_pids(pids) if pids is not None else (), all=all
    )
    request = StacksRequest(
        tuple(parse_hosts(hosts or None)),
        target,
        native=native,
        samples=samples,
        interval_s=interval_s,
        timeout_s=timeout_s,
    )
    request.validate()
    return request, notes


def _sample(request: StacksRequest, token: str | None) -> list[HostAnswer[rpc.KscopeStacksResponse]]:
    rpc_request = request.rpc_request()
    return _ask_all(
        list(request.hosts),
        token,
        min(rpc.STACKS_MAX_REQUEST_S, 2 * request.timeout_s) + RPC_MARGIN_S,
        lambda client: DaemonClient.stacks(client, rpc_request),
    )


def take_stacks(request: StacksRequest, token: str | None = None) -> StacksReport:
    """``request.samples`` snapshots of every matching process on every host, grouped."""
    request.validate()
    ranks: dict[tuple[str, int], RankStacks] = {}
    hosts: dict[str, dict[str, object]] = {}
    errors: list[dict[str, object]] = []
    started = time.monotonic()
    for i in range(request.samples):
        if i:
            time.sleep(max(0.0, started + i * request.interval_s - time.monotonic()))
        for hr in _sample(request, token):
            _merge(hr, ranks, hosts, errors, i)
    report = build_report(
        list(ranks.values()),
        target=request.target_json(),
        samples=request.samples,
        interval_s=request.interval_s,
        hosts=list(hosts.values()),
        errors=errors,
    )
    if not report.ranks and not errors:
        errors.append({"kind": "no_match", "host": None, "message": _no_match(request, hosts)})
    return report


def _no_match(request: StacksRequest, hosts: dict[str, dict[str, object]]) -> str:
    what = request.target.describe()
    registered = "; ".join(f"{h}: {v.get('registered')}" for h, v in hosts.items())
    return f"no registered process {what} on {len(hosts)} daemon(s) ({registered})"


def _merge(
    hr: HostAnswer[rpc.KscopeStacksResponse],
    ranks: dict[tuple[str, int], RankStacks],
    hosts: dict[str, dict[str, object]],
    errors: list[dict[str, object]],
    sample: int,
) -> None:
    address = str(hr.address)
    if hr.error is not None:
        if sample == 0 or not any(e.get("host") == address for e in errors):
            errors.append({"kind": hr.error.kind, "host": address, "message": str(hr.error)})
        return
    reply = hr.reply or rpc.KscopeStacksResponse()
    hostname = reply.hostname or hr.address.host
    hosts[address] = {
        "host": address,
        "hostname": hostname,
        "py_spy": reply.py_spy,
        "registered": reply.registered,
    }
    for snap in reply.processes:
        key = (address, snap.pid)
        rank = ranks.get(key)
        if rank is None:
            rank = ranks[key] = RankStacks(
                host=address,
                hostname=hostname,
                pid=snap.pid,
                host_pid=snap.host_pid,
                rank=snap.rank,
                snapshots=[],
            )
        rank.snapshots.append(snap)
