"""The autopilot's cycle: discover → resume → plan → sample (trigger, wait, store, analyse,
record, judge the evidence) → alert. A sample whose evidence cannot carry a verdict
(``autopilot.evidence``) is kept as ``unusable`` and never ranked. ``kscope autopilot`` runs :meth:`Autopilot.run_cycle` once (``--once``) or
until stopped (:meth:`Autopilot.run_forever`).

Crash safety (docs/autopilot.md): every step is a transaction in the catalog
(``kinetoscope.store.fleet``); a sample's id is its trace id, chosen and written (``planned``)
before the trigger. A restarted instance resumes its own unfinished samples: it asks the sample's
daemons for the trace id (``kscopeTraceStatus``) and waits for the files they know, re-triggers
only when no daemon knows it, and re-uses the catalog's analysis of the trace when one exists,
so no sample is lost or analysed twice. Unfinished samples of another instance are taken over
once that instance's lease on the job has expired.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter as Tally
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from kinetoscope.autopilot import alerts as alerting
from kinetoscope.autopilot.anomaly import AnomalyDetector
from kinetoscope.autopilot.discovery import SweepResult, sweep
from kinetoscope.autopilot.evidence import judge
from kinetoscope.autopilot.hang import KIND as HANG
from kinetoscope.autopilot.hang import HangDetector
from kinetoscope.autopilot.lease import LeaseKeeper
from kinetoscope.autopilot.metrics import AutopilotMetrics
from kinetoscope.autopilot.policy import Policy
from kinetoscope.autopilot.summary import summarize
from kinetoscope.autopilot.waiting import why_waiting
from kinetoscope.collect.client import DaemonClient, DaemonError, parse_host
from kinetoscope.collect.trigger import (
    ALIGN_STEPS_PER_S,
    DEFAULT_POLL_INTERVAL_S,
    MatchedProcess,
    Target,
    TraceFile,
    TraceOptions,
    TraceProblem,
    TraceRequest,
    TraceResult,
    align_roundup,
    requested_by,
)
from kinetoscope.collect.workflow import Delivery, TraceWorkflow
from kinetoscope.errors import KinetoscopeError, UsageError
from kinetoscope.store.catalog import Catalog
from kinetoscope.store.fleet import Claim, FleetStore, SampleRow, utcnow

log = logging.getLogger("kinetoscope.autopilot")


@dataclass(frozen=True)
class AnalyzeSettings:
    """How each sample is analysed: ``kscope analyze``'s backend choice (``AnalyzeRequest``)."""

    backend: str = "auto"
    ray_address: str | None = None

    def __post_init__(self) -> None:
        from kinetoscope.scale.request import BACKENDS

        if self.backend not in BACKENDS:
            raise UsageError(f"--backend: {self.backend!r} is not one of {', '.join(BACKENDS)}")


@dataclass
class AutopilotConfig:
    """Everything ``kscope autopilot`` was told."""

    hosts: list[str]
    catalog_url: str | None
    policy: Policy = field(default_factory=Policy)
    store_url: str | None = None
    instance: str = "autopilot"
    token: str | None = None
    output_dir: str | None = None  # trace folder root on the hosts (default: each daemon's --trace-root)
    announced: bool = False  # also watch daemons that announce themselves (kscope daemon --catalog)
    analyze: AnalyzeSettings = field(default_factory=AnalyzeSettings)


@dataclass
class CycleReport:
    """What one cycle did (logged, and printed by ``--once --json``)."""

    sweep_s: float = 0.0
    hosts_answered: int = 0
    hosts_failed: dict[str, str] = field(default_factory=dict)
    hosts_skipped: list[str] = field(default_factory=list)  # down earlier, in back-off: not asked
    jobs_seen: int = 0
    jobs_new: int = 0
    jobs_ended: list[str] = field(default_factory=list)
    resumed: list[str] = field(default_factory=list)
    started: list[str] = field(default_factory=list)
    finished: dict[str, str] = field(default_factory=dict)  # sample id -> final state
    alerts_sent: int = 0
    anomalies: dict[str, str] = field(default_factory=dict)  # job key -> kind, made due this cycle
    waiting: dict[str, str] = field(default_factory=dict)  # job key -> why it was not traced (waiting.py)
    hangs: dict[str, str] = field(default_factory=dict)  # job key -> stacks id of a hang found this cycle
    seconds: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


class Autopilot:
    """One autopilot instance over one catalog."""

    def __init__(
        self, config: AutopilotConfig, metrics: AutopilotMetrics | None = None, catalog: Catalog | None = None
    ) -> None:
        self.config = config
        self.policy = config.policy
        self.metrics = metrics or AutopilotMetrics()
        self.catalog = catalog or Catalog.open(config.catalog_url)
        self.store = FleetStore(self.catalog)
        self._fresh: set[str] = set()  # samples planned by this process (never triggered before)
        self._triggered: dict[str, TraceResult] = {}  # trigger results of this cycle's fan-out
        self.detector = AnomalyDetector(self.policy.anomaly)
        self.hang_detector = HangDetector(self.policy.hang)
        self._open_hangs: set[str] | None = None  # jobs with an open hang episode
        self._anomalies: dict[
            str, tuple[str, float]
        ] = {}  # job key -> (kind, utilisation) made due this cycle

    def close(self) -> None:
        self.catalog.close()

    # -- the cycle -------------------------------------------------------------------------------
    def run_cycle(self) -> CycleReport:
        started = time.perf_counter()
        report = CycleReport()
        result = self.discover(report)
        work = self.resume(report) + self.plan(report, set(result.failed) | set(result.skipped))
        self.explain(result, report)
        self.execute(work, report)
        sent, failed = alerting.send_pending(self.store, self.policy.alerts)
        report.alerts_sent = sent
        self.metrics.alerts.labels("sent").inc(sent)
        self.metrics.alerts.labels("failed").inc(failed)
        report.seconds = round(time.perf_counter() - started, 3)
        self.metrics.cycle_seconds.observe(report.seconds)
        log.info(
            "cycle done: %d hosts answered, %d jobs, %d samples started, %d finished in %.1f s",
            report.hosts_answered,
            report.jobs_seen,
            len(report.started),
            len(report.finished),
            report.seconds,
            extra={"event": "cycle", **{k: v for k, v in report.to_json().items() if k != "hosts_failed"}},
        )
        return report

    def run_forever(self, stop: threading.Event) -> None:
        """Cycles every ``sweep_interval_s`` until ``stop`` is set (SIGTERM); a failing cycle is logged
        and retried at the next interval, never fatal."""
        while not stop.is_set():
            began = time.monotonic()
            try:
                self.run_cycle()
            except KinetoscopeError as exc:
                log.error("cycle failed: %s", exc)
            stop.wait(max(0.0, self.policy.sweep_interval_s - (time.monotonic() - began)))

    # -- discovery -------------------------------------------------------------------------------
    def addresses(self) -> list[str]:
        """The daemons to ask: ``--host``/``--hosts-file``, plus recently announced ones with ``--announced``."""
        out = list(self.config.hosts)
        if self.config.announced:
            out += [a for a in self.store.announced_hosts(self.policy.announced_max_age_s) if a not in out]
        return out

    def discover(self, report: CycleReport) -> SweepResult:
        p = self.policy
        result = sweep(
            self.addresses(),
            token=self.config.token,
            rpc_timeout=p.rpc_timeout_s,
            workers=p.workers,
            opt_out_values=p.opt_out_values,
            devices_per_rank=p.devices_per_rank,
            skip=frozenset(self.store.hosts_in_backoff()),
        )
        for address, hostname in result.answered.items():
            self.store.host_ok(address, hostname)
        for address, error in result.failed.items():
            retry = self.store.host_failed(address, error, p.backoff_base_s, p.backoff_max_s)
            log.warning(
                "daemon %s is down (%s); next try after %s",
                address,
                error,
                retry.isoformat(),
                extra={"event": "host_down", "host": address},
            )
        report.jobs_new = self.store.upsert_jobs(result.jobs, p.warmup_s, interval_s=p.interval_s)
        report.jobs_ended = self.store.mark_ended(
            result.answered, [j.job_key for j in result.jobs], stale_after_s=p.stale_after_s
        )
        if p.anomaly.enabled:
            self.anomalies(result, report)
        if p.hang.enabled:
            self.hangs(result, report)
        report.sweep_s, report.jobs_seen = round(result.seconds, 3), len(result.jobs)
        report.hosts_answered, report.hosts_failed = len(result.answered), dict(result.failed)
        report.hosts_skipped = list(result.skipped)
        self.metrics.sweep_seconds.observe(result.seconds)
        self.metrics.jobs_known.set(sum(1 for j in result.jobs if not j.opted_out))
        self.metrics.jobs_opted_out.set(sum(1 for j in result.jobs if j.opted_out))
        self.metrics.hosts_down.set(len(result.failed) + len(result.skipped))
        return result

    def anomalies(self, result: SweepResult, report: CycleReport) -> None:
        """Make jobs whose utilisation is anomalous due now (kinetoscope.autopilot.anomaly)."""
        jobs = {j.job_key: j.hosts for j in result.jobs if not j.opted_out}
        hosts = sorted({h for hs in jobs.values() for h in hs})
        hits = self.detector.check(jobs, self.detector.host_utilisation(hosts, self.policy.workers))
        for key, (kind, util) in hits.items():
            if self.store.make_due(key, self.policy.anomaly.min_gap_s):
                self._anomalies[key] = (kind, util)
                report.anomalies[key] = kind
                self.metrics.anomalies.labels(kind).inc()
                log.info(
                    "job %s: GPU utilisation %.1f %% (%s): trace now",
                    key,
                    util,
                    kind,
                    extra={"event": "anomaly", "job_key": key, "kind": kind, "utilisation": util},
                )

    def hangs(self, result: SweepResult, report: CycleReport) -> None:
        """Take stacks of jobs whose ranks all went idle; record and alert the hung ones
        (kinetoscope.autopilot.hang). A job seen busy again ends its hang episode."""
        if self._open_hangs is None:  # episodes left open by an earlier run: one query, once
            self._open_hangs = {
                a["job_key"] for a in self.store.alerts() if a["kind"] == HANG and a["closed"] is None
            }
        due, busy = self.hang_detector.observe(result.jobs)
        for key in busy:
            if key in self._open_hangs:
                self.store.end_episode(key, HANG)
                self._open_hangs.discard(key)
        for job in due:
            finding = self.hang_detector.check(self.catalog, job, "cpu_idle", self.config.token)
            if finding.hung and finding.stacks_id:
                report.hangs[job.job_key] = finding.stacks_id
                self._open_hangs.add(job.job_key)

    def _hang_after_trace(self, sample: SampleRow, reason: str | None) -> None:
        """A sample whose trace timed out or stalled: is the job hung? (kinetoscope.autopilot.hang)"""
        if not self.policy.hang.enabled or reason not in ("timeout", "stalled"):
            return
        job = self.store.job(sample.job_key)
        if job is None or not self.hang_detector.may_check(sample.job_key):
            return
        try:
            finding = self.hang_detector.check(self.catalog, job, "trace_timeout", self.config.token)
            if finding.hung and self._open_hangs is not None:
                self._open_hangs.add(sample.job_key)
        except KinetoscopeError as exc:
            log.warning("hang check of %s failed: %s", sample.job_key, exc)

    # -- scheduling ------------------------------------------------------------------------------
    def resume(self, report: CycleReport) -> list[SampleRow]:
        """This instance's unfinished samples, and those of instances whose lease expired."""
        mine = []
        for s in self.store.active_samples():
            if s.owner == self.config.instance or self.store.take_over(
                s.sample_id, self.config.instance, self.policy.lease_s
            ):
                s.owner = self.config.instance
                mine.append(s)
                report.resumed.append(s.sample_id)
        return mine

    def plan(self, report: CycleReport, down: set[str]) -> list[SampleRow]:
        """Claim due jobs within the fleet-wide and per-host limits (one transaction); returns their
        new samples. A job another autopilot claimed first is skipped (its slot stays free this cycle)."""
        p = self.policy
        active = self.store.active_samples()
        per_host = Tally(h for s in active for h in s.hosts)
        room = p.max_in_flight - len(active)
        due = self.store.due_jobs(p.min_age_s)
        claims: list[Claim] = []
        paces = self.store.step_times_ms(j["job_key"] for j in due if len(j["ranks"]) > 1)
        for job in due:
            hosts = list(job["hosts"])
            if len(claims) >= room:
                report.waiting[job["job_key"]] = f"due, waiting for a slot (max_in_flight={p.max_in_flight})"
                continue
            if set(hosts) & down:
                report.waiting[job["job_key"]] = f"due, but host {sorted(set(hosts) & down)[0]} is down"
                continue
            if any(per_host[h] >= p.per_host for h in hosts):
                report.waiting[job["job_key"]] = f"due, waiting for a host slot (per_host={p.per_host})"
                continue
            per_host.update(hosts)
            request = self._request(job, paces.get(job["job_key"]))
            claims.append(Claim(job["job_key"], new_sample_id(), hosts, request))
        won = self.store.claim_many(self.config.instance, claims, p.lease_s, p.interval_s)
        now = utcnow()
        planned = [
            SampleRow(
                sample_id=c.sample_id,
                job_key=c.job_key,
                owner=self.config.instance,
                state="planned",
                created=now,
                updated_at=now,
                hosts=c.hosts,
                request=c.request,
            )
            for c in claims
            if c.sample_id in won
        ]
        for c in claims:
            if c.sample_id not in won:
                report.waiting[c.job_key] = (
                    "due, but another autopilot holds its lease or a sample is in flight"
                )
        for s in planned:
            self._fresh.add(s.sample_id)
            self._anomalies.pop(s.job_key, None)
            report.started.append(s.sample_id)
        self.metrics.queue_depth.set(max(0, len(due) - len(planned)))
        self.metrics.in_flight.set(len(active) + len(planned))
        return planned

    def explain(self, result: SweepResult, report: CycleReport) -> None:
        """``report.waiting``: why each job this sweep saw was not planned (``waiting.why_waiting``)."""
        planned = set(self._planned_keys(report))
        seen = {j.job_key for j in result.jobs}
        in_flight = {s.job_key: s.sample_id for s in self.store.active_samples()}
        sampled = self.store.sampled_jobs()
        now = utcnow()
        for job in self.store.jobs():
            key = job["job_key"]
            if key in planned or key in report.waiting or key not in seen:
                continue
            report.waiting[key] = why_waiting(
                job, self.policy, now=now, sampled=key in sampled, in_flight=in_flight.get(key)
            )

    def _planned_keys(self, report: CycleReport) -> list[str]:
        ids = set(report.started) | set(report.resumed)
        return [s.job_key for s in self.store.active_samples() if s.sample_id in ids]

    def _request(self, job: dict[str, Any], step_ms: float | None = None) -> dict[str, Any]:
        """What a sample of ``job`` asks the daemons for (kept in ``fleet_samples.request``);
        ``step_ms``: the job's step time in its latest analysed sample (None: not known yet)."""
        request: dict[str, Any] = {
            "pids": sorted({r["pid"] for r in job["ranks"]}),
            "iterations": self.policy.iterations,
            "devices": job["devices"],
            "iteration_roundup": roundup_for(job["ranks"], step_ms),
            "trigger": "schedule",
        }
        if job["job_key"] in self._anomalies:
            kind, util = self._anomalies[job["job_key"]]
            request.update(trigger=f"anomaly:{kind}", gpu_utilisation=round(util, 3))
        return request

    def execute(self, samples: list[SampleRow], report: CycleReport) -> None:
        """Trigger every new sample at once (the fan-out), record them ``triggered`` in one
        transaction, then wait for, store and analyse each in its own thread."""
        if not samples:
            return
        workers = max(1, min(len(samples), max(self.policy.max_in_flight, self.policy.workers)))
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="kscope-sample") as pool:
            fresh = [s for s in samples if s.sample_id in self._fresh]
            triggered = dict(zip([s.sample_id for s in fresh], pool.map(self._trigger, fresh)))
            self.store.mark_triggered(
                {
                    sid: self._request_of(s, triggered[s.sample_id])
                    for s in fresh
                    if (sid := s.sample_id) and triggered[sid].files
                }
            )
            self._triggered.update(triggered)
            for sample_id, state in pool.map(self.run_sample, samples):
                report.finished[sample_id] = state

    @staticmethod
    def _request_of(sample: SampleRow, res: TraceResult) -> dict[str, Any]:
        files = [{"host": f.host, "pid": f.pid, "rank": f.rank, "path": f.path} for f in res.files]
        return {**sample.request, "files": files, "options": res.options.rpc_fields()}

    # -- one sample ------------------------------------------------------------------------------
    def run_sample(self, sample: SampleRow) -> tuple[str, str]:
        """Trigger (or find) the trace, wait, store, analyse, record; never raises. The job's lease
        is renewed while the sample runs; a sample whose lease another instance took (this one
        stopped renewing, e.g. cut off from the catalog) is left to that instance to record."""
        keeper = LeaseKeeper(self.store, sample.job_key, self.config.instance, self.policy.lease_s)
        try:
            with keeper:
                state, reason, error, summary, analysis_id = self._sample_pipeline(sample)
        except Exception as exc:
            log.exception("sample %s failed", sample.sample_id)
            state, reason, error, summary, analysis_id = (
                "failed",
                "error",
                f"{type(exc).__name__}: {exc}",
                None,
                None,
            )
        if keeper.lost.is_set():
            log.warning(
                "sample %s of %s: lease lost, left to its new owner", sample.sample_id, sample.job_key
            )
            return sample.sample_id, "handed_over"
        self.store.finish(
            sample.sample_id, state, summary=summary, analysis_id=analysis_id, reason=reason, error=error
        )
        self.metrics.samples.labels(state, reason or "").inc()
        log.info(
            "sample %s of %s: %s%s",
            sample.sample_id,
            sample.job_key,
            state,
            f" ({reason})" if reason else "",
            extra={
                "event": "sample",
                "sample_id": sample.sample_id,
                "job_key": sample.job_key,
                "state": state,
                "reason": reason,
            },
        )
        if state == "failed":
            self._hang_after_trace(sample, reason)
        if state == "recorded" and summary is not None:  # unusable samples never alert
            alerting.evaluate(self.store, sample.job_key, sample.sample_id, summary, self.policy.alerts)
        return sample.sample_id, state

    def _options(self, sample: SampleRow) -> tuple[Target, TraceOptions]:
        pids = tuple(int(p) for p in sample.request.get("pids") or [])
        roundup = sample.request.get("iteration_roundup")
        return Target(pids=pids), TraceOptions(
            iterations=int(sample.request.get("iterations") or self.policy.iterations),
            iteration_roundup=int(roundup) if roundup else None,
        )

    def _sample_pipeline(
        self, sample: SampleRow
    ) -> tuple[str, str | None, str | None, dict[str, Any] | None, int | None]:
        res = self._triggered.pop(sample.sample_id, None)
        if res is None:
            res = self._find_trace(sample) or self._trigger(sample)
        if not res.files:
            kind = res.errors[0].kind if res.errors else "no_match"
            return "failed", kind, "; ".join(e.message for e in res.errors)[:4000] or None, None, None
        res = TraceWorkflow(self._delivery()).run(res)  # wait, then store and record a usable trace
        if any(e.kind == "exited" for e in res.errors):
            return (
                "job_ended",
                "exited",
                "; ".join(e.message for e in res.errors if e.kind == "exited")[:4000],
                None,
                None,
            )
        if not any(f.complete for f in res.files):
            kind = res.errors[0].kind if res.errors else "incomplete"
            return "failed", kind, "; ".join(e.message for e in res.errors)[:4000] or None, None, None
        bad = [e for e in res.errors if e.kind == "store"]
        if bad:
            return "failed", "store", bad[0].message, None, None
        return self._analyse(sample, res)

    def _delivery(self) -> Delivery:
        """The trace workflow's steps for a sample: wait, store (when configured) and record in
        the fleet's catalog, only a usable trace (``strict``); catalog failures raise."""
        return Delivery(
            wait=True,
            timeout_s=self.policy.trace_timeout_s,
            token=self.config.token,
            rpc_timeout_s=self.policy.rpc_timeout_s,
            manifest_on_trigger=False,
            store=self.config.store_url or None,
            record=True,
            catalog=self.catalog.url,
            raise_errors=True,
            strict=True,
        )

    def _trigger(self, sample: SampleRow) -> TraceResult:
        target, options = self._options(sample)
        try:
            request = TraceRequest(
                hosts=tuple(parse_host(h) for h in sample.hosts),
                target=target,
                options=options,
                output_dir=self.config.output_dir,
                trace_id=sample.sample_id,
            )
            return TraceWorkflow(self._delivery()).trigger(request)
        except KinetoscopeError as exc:  # e.g. a trace id a daemon has seen: reported, not raised
            res = TraceResult(trace_id=sample.sample_id, hosts=[], target=target, options=options)
            res.errors.append(TraceProblem(kind="failed", message=str(exc)))
            return res

    def _find_trace(self, sample: SampleRow) -> TraceResult | None:
        """The sample's trace rebuilt from its daemons' ``kscopeTraceStatus`` (None: no daemon knows it)."""
        target, options = self._options(sample)
        hosts = [parse_host(h) for h in sample.hosts]
        res = TraceResult(
            trace_id=sample.sample_id,
            hosts=hosts,
            target=target,
            options=options,
            created=sample.created.strftime("%Y-%m-%dT%H:%M:%SZ"),
            requested_by=requested_by(),
        )
        for addr in hosts:
            try:
                reply = DaemonClient(
                    addr, token=self.config.token, timeout=self.policy.rpc_timeout_s
                ).trace_status(sample.sample_id)
            except DaemonError:
                continue
            if not reply.known:
                continue
            hostname = reply.hostname or addr.host
            if reply.trace_dir and reply.trace_dir not in res.output_dirs:
                res.output_dirs.append(reply.trace_dir)
            for f in reply.files:
                res.files.append(TraceFile(host=str(addr), pid=f.pid, rank=f.rank, path=f.path))
                res.matched.append(
                    MatchedProcess(
                        host=str(addr),
                        hostname=hostname,
                        pid=f.pid,
                        rank=f.rank,
                        local_rank=None,
                        world_size=None,
                        job_id=None,
                        cmdline="",
                        path=f.path,
                        triggered=True,
                        busy=False,
                    )
                )
        return res if res.files else None

    def _analyse(
        self, sample: SampleRow, res: TraceResult
    ) -> tuple[str, str | None, str | None, dict[str, Any] | None, int | None]:
        from kinetoscope.orchestration import ANALYSIS_NAME, analyze_inputs, record_run

        existing = self.catalog.latest_analysis(sample.sample_id, name=ANALYSIS_NAME)
        paths: list[Any] = []  # the local files, for the evidence's own timestamp check
        if existing is None:
            run = analyze_inputs(
                [sample.sample_id],
                catalog=self.catalog,
                backend=self.config.analyze.backend,
                ray_address=self.config.analyze.ray_address,
            )
            rec = record_run(self.catalog, run)
            doc, analysis_id, paths = run.document, rec.id, list(run.paths)
        else:  # analysed before a crash: never twice
            doc, analysis_id = existing.document, existing.id
        devices = int(sample.request.get("devices") or len(res.files))
        state, reason, detail, summary = sample_outcome(doc, paths, devices, self.policy)
        return state, reason, detail, summary, analysis_id


def sample_outcome(
    doc: dict[str, Any], paths: list[Any], devices: int, policy: Policy
) -> tuple[str, str | None, str | None, dict[str, Any]]:
    """A sample's final state (``recorded`` or ``unusable``), reason, detail and summary columns
    from its analysis document and local files (``autopilot.evidence.judge``)."""
    summary = summarize(doc, devices, float(policy.interval_s))
    ev = judge(doc, paths, max_timestamp_anomalies=policy.max_timestamp_anomalies)
    summary.update(evidence=ev.to_dict(), timestamp_anomalies=ev.timestamp_anomalies)
    if not ev.usable:
        return "unusable", ev.reason, ev.detail, summary
    return "recorded", None, None, summary


def roundup_for(ranks: list[dict[str, Any]], step_ms: float | None = None) -> int | None:
    """The ``--iteration-roundup`` that aligns the ranks' windows (``trigger.align_roundup``) from
    the poll intervals discovery saw, so the trigger needs no listing of its own; None for one rank.

    ``step_ms``, the job's measured step time, replaces the assumed pace (``ALIGN_STEPS_PER_S``):
    the roundup is then the same number of *seconds* of the job for a fast job and a slow one.
    With the assumed 10 steps/s a job doing one step every 2 s would wait up to 400 s for its
    first traced step, past the policy's ``trace_timeout_s``, and a job doing 30 steps/s would
    miss alignment three times as often as the roundup intends."""
    if len(ranks) < 2:
        return None
    polls = [float(r["poll_s"]) for r in ranks if isinstance(r.get("poll_s"), (int, float))]
    pace = 1000.0 / step_ms if step_ms is not None and step_ms > 0 else ALIGN_STEPS_PER_S
    return align_roundup(max(polls, default=DEFAULT_POLL_INTERVAL_S), pace)


def new_sample_id() -> str:
    """``kst-YYYYmmdd-HHMMSS-<12 hex>``: a trace id (``kscope trace``'s shape) with 48 random bits,
    since the autopilot starts hundreds of samples in the same second (``new_trace_id``'s 16 bits
    would collide)."""
    import secrets
    from datetime import datetime, timezone

    return f"kst-{datetime.now(timezone.utc):%Y%m%d-%H%M%S}-{secrets.token_hex(6)}"


def default_instance() -> str:
    import socket

    return f"autopilot@{socket.gethostname()}"


Factory = Callable[[AutopilotConfig], Autopilot]
