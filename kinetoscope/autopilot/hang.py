"""Hangs found without anyone asking: the autopilot notices a job whose ranks stopped working,
takes stacks of every rank, records them with their groups, and opens a ``hang`` alert naming
the outlier ranks (docs/stacks.md, "The autopilot's hang check"; docs/autopilot.md).

Two signals make a job **suspect**:

* ``cpu_idle``: every rank of the job used less than ``idle_cpu_pct`` of a core (user + system
  CPU seconds from the daemons' process listing, between two sweeps) for at least ``for_s``
  seconds, while its processes stay registered. A rank blocked in a collective, a lock or a
  read uses no CPU; a training rank that steps uses a lot.
* ``trace_timeout``: a sample's trace of the job ended ``timeout`` or ``stalled`` (an
  iteration-based trace waits for steps that never come) while the processes are alive.

A suspect job's stacks are taken ``samples`` times ``interval_s`` apart (``kscope stacks
--samples``). It is **hung** when every rank read is ``stuck`` (same stack and locals in every
snapshot): then the capture is recorded in ``job_stacks`` and a ``hang`` episode opens (one
webhook per episode, like every alert). A job seen busy again (some rank above the CPU
threshold) closes the episode. A job is checked at most once per ``min_gap_s``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from kinetoscope.collect.client import parse_host
from kinetoscope.collect.stack_groups import STUCK, StacksReport
from kinetoscope.collect.stacks import StacksRequest, take_stacks
from kinetoscope.collect.trigger import Target
from kinetoscope.document.decode import decode_stacks
from kinetoscope.store.catalog import Catalog
from kinetoscope.store.fleet import FleetStore, SeenJob
from kinetoscope.store.stacks_store import record_stacks

log = logging.getLogger("kinetoscope.autopilot")
KIND = "hang"


@dataclass(frozen=True)
class HangPolicy:
    """``[hang]`` of the policy file."""

    enabled: bool = True
    idle_cpu_pct: float = 5.0  # a rank under this share of one core is idle
    for_s: float = 300.0  # every rank idle this long: take stacks
    samples: int = 2  # snapshots per check (stuck = the same in all)
    interval_s: float = 1.0
    min_gap_s: float = 1800.0  # between two checks of one job
    stack_timeout_s: float = 10.0  # per process


@dataclass
class HangFinding:
    """A check's outcome (what the cycle report and the log say)."""

    job_key: str
    signal: str
    hung: bool
    stacks_id: str | None
    outliers: list[Any]
    verdict: str


@dataclass
class HangDetector:
    """Per-job CPU history between sweeps (in memory: after a restart, ``for_s`` counts again)."""

    policy: HangPolicy
    cpu: dict[tuple[str, str, int], tuple[float, float]] = field(default_factory=dict)
    idle_since: dict[str, float] = field(default_factory=dict)
    checked: dict[str, float] = field(default_factory=dict)

    def observe(self, jobs: Sequence[SeenJob], now: float | None = None) -> tuple[list[SeenJob], list[str]]:
        """Jobs to check now (idle long enough, not checked within ``min_gap_s``) and the keys
        of jobs seen busy this sweep (their hang episodes end)."""
        now = time.monotonic() if now is None else now
        due, busy = [], []
        for job in jobs:
            if job.opted_out or not job.ranks:
                continue
            idle = self._all_idle(job, now)
            if idle is None:
                continue
            if not idle:
                self.idle_since.pop(job.job_key, None)
                busy.append(job.job_key)
                continue
            since = self.idle_since.get(job.job_key, now)
            if now - since >= self.policy.for_s and self.may_check(job.job_key, now):
                due.append(job)
        seen = {(j.job_key, str(r["host"]), int(r["pid"])) for j in jobs for r in j.ranks}
        for key in [k for k in self.cpu if k not in seen]:
            del self.cpu[key]
        return due, busy

    def _all_idle(self, job: SeenJob, now: float) -> bool | None:
        """Whether every rank was idle since the last sweep (None: not known yet for some rank);
        remembers when the idle stretch began (the previous sweep)."""
        rates: list[float] = []
        started: float | None = None
        known = True
        for r in job.ranks:  # every rank's CPU time is remembered, known or not
            cpu = r.get("cpu_s")
            key = (job.job_key, str(r["host"]), int(r["pid"]))
            prev = self.cpu.get(key)
            if isinstance(cpu, (int, float)):
                self.cpu[key] = (now, float(cpu))
            if prev is None or not isinstance(cpu, (int, float)) or now <= prev[0]:
                known = False
                continue
            rates.append(100.0 * (float(cpu) - prev[1]) / (now - prev[0]))
            started = prev[0] if started is None else min(started, prev[0])
        if not known:
            return None
        idle = all(rate < self.policy.idle_cpu_pct for rate in rates)
        if idle and started is not None:
            self.idle_since.setdefault(job.job_key, started)
        return idle

    def may_check(self, job_key: str, now: float | None = None) -> bool:
        now = time.monotonic() if now is None else now
        last = self.checked.get(job_key)
        return last is None or now - last >= self.policy.min_gap_s

    def check(
        self, catalog: Catalog, job: dict[str, Any] | SeenJob, signal: str, token: str | None
    ) -> HangFinding:
        """Take stacks of ``job``'s ranks; record and open a ``hang`` episode when every rank is stuck."""
        key = job["job_key"] if isinstance(job, dict) else job.job_key
        ranks = job["ranks"] if isinstance(job, dict) else job.ranks
        hosts = job["hosts"] if isinstance(job, dict) else job.hosts
        job_id = job.get("job_id") if isinstance(job, dict) else job.job_id
        self.checked[key] = time.monotonic()
        p = self.policy
        request = StacksRequest(
            hosts=tuple(parse_host(h) for h in hosts),
            target=Target(pids=tuple(sorted({int(r["pid"]) for r in ranks}))),
            samples=max(1, p.samples),
            interval_s=p.interval_s,
            timeout_s=p.stack_timeout_s,
        )
        report = take_stacks(request, token=token)
        read = [r for r in report.ranks if r.error is None]
        hung = bool(read) and all(r.state == STUCK for r in read)
        if not hung:
            log.info(
                "job %s looked idle (%s) but is not stuck: %s",
                key,
                signal,
                report.verdict,
                extra={"event": "hang_check", "job_key": key, "hung": False},
            )
            return HangFinding(key, signal, False, None, [], report.verdict)
        return self._record(catalog, key, job_id, signal, report)

    def _record(
        self, catalog: Catalog, key: str, job_id: str | None, signal: str, report: StacksReport
    ) -> HangFinding:
        row = record_stacks(catalog, report, trigger=f"hang:{signal}", job_id=job_id, job_key=key)
        outliers = list(report.outliers)
        FleetStore(catalog).start_episode(key, KIND, row["stacks_id"], float(len(outliers)), 0.0)
        log.warning(
            "job %s is hung (%s): %s",
            key,
            signal,
            report.verdict,
            extra={"event": "hang", "job_key": key, "stacks_id": row["stacks_id"], "outliers": outliers},
        )
        return HangFinding(key, signal, True, row["stacks_id"], outliers, report.verdict)


def alert_details(catalog: Catalog, alert: dict[str, Any]) -> dict[str, Any]:
    """The webhook fields a ``hang`` alert adds: its stacks id, outlier ranks, groups, verdict."""
    from kinetoscope.store.stacks_store import get_stacks

    row = get_stacks(catalog, str(alert.get("sample_id")))
    if row is None:
        return {}
    stacks = decode_stacks(row["document"])
    return {
        "stacks_id": row["stacks_id"],
        "outlier_ranks": list(row["outliers"]),
        "verdict": row["verdict"],
        "groups": [{"ranks": g.ranks, "summary": g.summary, "outlier": g.outlier} for g in stacks.groups],
    }
