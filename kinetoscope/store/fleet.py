"""Reading and writing the autopilot's catalog tables (``fleet_models``): every state change of the
autopilot is one short transaction here, so a ``kill -9`` at any point leaves a state the next
run can resume from (docs/autopilot.md, "Crash safety").

* **Lease**: a job is sampled only by the autopilot instance holding its lease
  (``fleet_jobs.lease_owner`` until ``lease_expires``); :meth:`FleetStore.claim` takes it with one
  conditional ``UPDATE`` (atomic on SQLite and PostgreSQL) and inserts the ``planned`` sample in
  the same transaction.
* **Sample states**: ``planned`` (trace id chosen, trigger not confirmed), ``triggered`` (the
  daemons took the request; ``request`` holds what is needed to wait for it), then one of
  ``recorded`` (stored, analysed, summary written, evidence usable), ``unusable`` (stored and
  analysed, but its evidence cannot carry a verdict: ``reason`` and ``evidence`` say why; never
  ranked), ``job_ended`` (the job exited before its trace was written), ``failed`` (``reason``
  says why).
* **Schedule**: a job is due ``warmup_s`` after it was first seen, then ``interval_s`` after its
  latest sample; both are applied again at every sweep (:meth:`FleetStore.upsert_jobs`), so a
  changed policy holds for jobs already known.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any

import sqlalchemy as sa

from kinetoscope.protocol.announce import AnnounceSink, HostAnnouncement
from kinetoscope.store.catalog import Catalog
from kinetoscope.store.fleet_models import fleet_alerts, fleet_hosts, fleet_jobs, fleet_samples

ACTIVE_STATES = ("planned", "triggered")
IN_BATCH = 500  # keys per SQL IN list: bounded whatever the fleet's size (SQLite caps bound parameters)
FINAL_STATES = ("recorded", "unusable", "job_ended", "failed")
SUMMARY_COLUMNS = (
    "interval_s",
    "devices",
    "gpu_busy_pct",
    "mfu",
    "straggler_kind",
    "straggler_ranks",
    "lost_fraction",
    "exposed_comm_pct",
    "launch_bound_pct",
    "top_recommendation",
    "wasted_gpu_s",
    "top_recommendation_title",
    "timestamp_anomalies",
    "evidence",
)


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


@dataclass
class SeenJob:
    """A job as one discovery sweep saw it (all its registered, non-launcher processes)."""

    job_key: str
    job_id: str | None
    cmdline: str | None
    hosts: list[str]  # daemon addresses host:port
    ranks: list[dict[str, Any]]  # {"host", "hostname", "pid", "rank"}
    world_size: int | None
    devices: int
    opted_out: bool
    age_s: float


@dataclass
class Claim:
    """A sample to plan: the job, the chosen trace id, its hosts and its request."""

    job_key: str
    sample_id: str
    hosts: list[str]
    request: dict[str, Any]


@dataclass
class SampleRow:
    """A ``fleet_samples`` row as a plain record (columns as attributes)."""

    sample_id: str
    job_key: str
    owner: str
    state: str
    created: datetime
    updated_at: datetime
    hosts: list[str]
    request: dict[str, Any]
    reason: str | None = None
    error: str | None = None
    analysis_id: int | None = None
    summary: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "sample_id": self.sample_id,
            "trace_id": self.sample_id,
            "job_key": self.job_key,
            "state": self.state,
            "reason": self.reason,
            "error": self.error,
            "created": _iso(self.created),
            "owner": self.owner,
            "analysis_id": self.analysis_id,
            **self.summary,
        }


def _aware(dt: datetime | None) -> datetime | None:
    """A database time as an aware UTC datetime (SQLite may hand back naive ones)."""
    if dt is None:
        return None
    return dt if dt.tzinfo else dt.replace(tzinfo=timezone.utc)


def due_time(
    first_seen: datetime | None, last_sample: datetime | None, warmup_s: float, interval_s: float
) -> datetime:
    """When a job is next due under a policy: ``interval_s`` after its latest sample, else
    ``warmup_s`` after it was first seen (now when neither is known)."""
    if last_sample is not None:
        return last_sample + timedelta(seconds=interval_s)
    if first_seen is not None:
        return first_seen + timedelta(seconds=warmup_s)
    return utcnow()


def _iso(dt: datetime | None) -> str | None:
    return dt.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ") if dt else None


def _sample(r: Any) -> SampleRow:
    m = r._mapping
    return SampleRow(
        sample_id=m["sample_id"],
        job_key=m["job_key"],
        owner=m["owner"],
        state=m["state"],
        created=m["created"],
        updated_at=m["updated_at"],
        hosts=list(m["hosts"] or []),
        request=dict(m["request"] or {}),
        reason=m["reason"],
        error=m["error"],
        analysis_id=m["analysis_id"],
        summary={k: m[k] for k in SUMMARY_COLUMNS},
    )


class FleetStore:
    """The autopilot's view of an open :class:`Catalog`."""

    def __init__(self, catalog: Catalog) -> None:
        self.cat = catalog

    # -- hosts -----------------------------------------------------------------------------------
    def host_ok(self, address: str, hostname: str | None) -> None:
        now = utcnow()
        with self.cat._write() as conn:
            self._upsert(
                conn,
                fleet_hosts,
                ["address"],
                {
                    "address": address,
                    "hostname": hostname,
                    "status": "up",
                    "failures": 0,
                    "last_ok": now,
                    "last_error": None,
                    "next_retry": None,
                    "updated_at": now,
                },
            )

    def host_failed(self, address: str, error: str, base_s: float, max_s: float) -> datetime:
        """Mark a daemon down; its next retry waits ``base_s`` doubling per failure, at most ``max_s``."""
        now = utcnow()
        with self.cat._write() as conn:
            row = conn.execute(
                sa.select(fleet_hosts.c.failures).where(fleet_hosts.c.address == address)
            ).first()
            failures = (row[0] if row else 0) + 1
            retry = now + timedelta(seconds=min(max_s, base_s * 2 ** (failures - 1)))
            self._upsert(
                conn,
                fleet_hosts,
                ["address"],
                {
                    "address": address,
                    "status": "down",
                    "failures": failures,
                    "last_error": error[:2000],
                    "next_retry": retry,
                    "updated_at": now,
                },
            )
        return retry

    def announce(self, address: str, hostname: str, devices: int | None, version: str) -> None:
        """A daemon's heartbeat (``kscope daemon --catalog``): insert or refresh its row."""
        now = utcnow()
        with self.cat._write() as conn:
            ins = self.cat._insert(conn, fleet_hosts).values(
                address=address,
                hostname=hostname,
                status="up",
                failures=0,
                updated_at=now,
                announced=now,
                devices=devices,
                version=version,
            )
            conn.execute(
                ins.on_conflict_do_update(
                    index_elements=["address"],
                    set_={"hostname": hostname, "announced": now, "devices": devices, "version": version},
                )
            )

    def announced_hosts(self, max_age_s: float, now: datetime | None = None) -> list[str]:
        """Addresses of daemons whose last heartbeat is at most ``max_age_s`` old."""
        since = (now or utcnow()) - timedelta(seconds=max_age_s)
        with self.cat._read() as conn:
            rows = conn.execute(
                sa.select(fleet_hosts.c.address)
                .where(fleet_hosts.c.announced >= since)
                .order_by(fleet_hosts.c.address)
            )
            return [r[0] for r in rows]

    def hosts_in_backoff(self, now: datetime | None = None) -> set[str]:
        now = now or utcnow()
        with self.cat._read() as conn:
            rows = conn.execute(
                sa.select(fleet_hosts.c.address).where(
                    fleet_hosts.c.status == "down", fleet_hosts.c.next_retry > now
                )
            )
            return {r[0] for r in rows}

    def hosts(self) -> list[dict[str, Any]]:
        with self.cat._read() as conn:
            return [
                dict(r._mapping) for r in conn.execute(sa.select(fleet_hosts).order_by(fleet_hosts.c.address))
            ]

    # -- jobs ------------------------------------------------------------------------------------
    def upsert_jobs(
        self,
        seen: Sequence[SeenJob],
        warmup_s: float,
        now: datetime | None = None,
        interval_s: float | None = None,
    ) -> int:
        """Insert new jobs (first due after ``warmup_s``), refresh known ones; returns how many are new.

        With ``interval_s``, a known job's next due time is computed again from this policy
        (``first seen + warmup_s`` before its first sample, ``latest sample + interval_s`` after),
        so a changed ``--policy`` applies to it at once."""
        now = now or utcnow()
        new = 0
        with self.cat._write() as conn:
            known = {
                r[0]: r[1] for r in conn.execute(sa.select(fleet_jobs.c.job_key, fleet_jobs.c.first_seen))
            }
            last = dict(
                conn.execute(
                    sa.select(fleet_samples.c.job_key, sa.func.max(fleet_samples.c.created)).group_by(
                        fleet_samples.c.job_key
                    )
                ).all()
            )
            for j in seen:
                values: dict[str, Any] = {
                    "job_id": j.job_id,
                    "cmdline": j.cmdline,
                    "hosts": j.hosts,
                    "ranks": j.ranks,
                    "world_size": j.world_size,
                    "devices": j.devices,
                    "opted_out": j.opted_out,
                    "last_seen": now,
                    "age_s": j.age_s,
                    "ended_at": None,
                }
                if j.job_key in known:
                    if interval_s is not None:
                        values["next_due"] = due_time(
                            _aware(known[j.job_key]), _aware(last.get(j.job_key)), warmup_s, interval_s
                        )
                    conn.execute(
                        fleet_jobs.update().where(fleet_jobs.c.job_key == j.job_key).values(**values)
                    )
                    continue
                first = now - timedelta(seconds=max(0.0, j.age_s))
                # another autopilot may insert the same job at the same moment: first one wins
                ins = self.cat._insert(conn, fleet_jobs).values(
                    job_key=j.job_key,
                    first_seen=first,
                    next_due=first + timedelta(seconds=warmup_s),
                    **values,
                )
                res = conn.execute(ins.on_conflict_do_nothing(index_elements=["job_key"]))
                new += max(0, res.rowcount or 0)
        return new

    def mark_ended(
        self,
        answered_hosts: Iterable[str],
        seen_keys: Iterable[str],
        now: datetime | None = None,
        stale_after_s: float | None = None,
    ) -> list[str]:
        """Jobs not seen in this sweep although every one of their hosts answered: ended. With
        ``stale_after_s``, also jobs not seen for that long whatever their hosts did (a host that
        stays down, a job that was never seen again): they end instead of reading "running"."""
        now = now or utcnow()
        answered, seen = set(answered_hosts), set(seen_keys)
        stale_before = now - timedelta(seconds=stale_after_s) if stale_after_s is not None else None
        ended: list[str] = []
        with self.cat._write() as conn:
            rows = conn.execute(
                sa.select(fleet_jobs.c.job_key, fleet_jobs.c.hosts, fleet_jobs.c.last_seen).where(
                    fleet_jobs.c.ended_at.is_(None)
                )
            )
            for key, hosts, last_seen in rows.all():
                if key in seen:
                    continue
                if set(hosts or []) <= answered or (
                    stale_before is not None and (_aware(last_seen) or now) < stale_before
                ):
                    ended.append(key)
            if ended:
                conn.execute(fleet_jobs.update().where(fleet_jobs.c.job_key.in_(ended)).values(ended_at=now))
        return ended

    def trace_ids_by_job(self) -> dict[str, set[str]]:
        """The catalog's job ids (Kineto's, as ``kscope trace`` recorded them) and their trace ids."""
        from kinetoscope.store.models import trace_files

        with self.cat._read() as conn:
            rows = conn.execute(
                sa.select(trace_files.c.job_id, trace_files.c.trace_id)
                .where(trace_files.c.job_id.is_not(None))
                .distinct()
            )
            out: dict[str, set[str]] = {}
            for job_id, trace_id in rows:
                out.setdefault(str(job_id), set()).add(str(trace_id))
            return out

    def job(self, job_key: str) -> dict[str, Any] | None:
        with self.cat._read() as conn:
            r = conn.execute(sa.select(fleet_jobs).where(fleet_jobs.c.job_key == job_key)).first()
            return dict(r._mapping) if r else None

    def jobs(self) -> list[dict[str, Any]]:
        with self.cat._read() as conn:
            return [
                dict(r._mapping)
                for r in conn.execute(sa.select(fleet_jobs).order_by(fleet_jobs.c.first_seen))
            ]

    def due_jobs(self, min_age_s: float, now: datetime | None = None) -> list[dict[str, Any]]:
        """Running, not opted-out jobs at least ``min_age_s`` old whose next sample is due, oldest due first."""
        now = now or utcnow()
        c = fleet_jobs.c
        with self.cat._read() as conn:
            rows = conn.execute(
                sa.select(fleet_jobs)
                .where(
                    c.ended_at.is_(None),
                    c.opted_out.is_(False),
                    c.next_due <= now,
                    sa.or_(c.age_s.is_(None), c.age_s >= min_age_s),
                )
                .order_by(c.next_due, c.job_key)
            )
            return [dict(r._mapping) for r in rows]

    def make_due(self, job_key: str, min_gap_s: float, now: datetime | None = None) -> bool:
        """Make a running job due now (an anomaly) unless it was sampled within ``min_gap_s`` or has a
        sample in flight; True when it was made due."""
        now = now or utcnow()
        with self.cat._write() as conn:
            last = conn.execute(
                sa.select(sa.func.max(fleet_samples.c.created)).where(fleet_samples.c.job_key == job_key)
            ).scalar()
            if last is not None:
                last = last if last.tzinfo else last.replace(tzinfo=timezone.utc)
                if last > now - timedelta(seconds=min_gap_s):
                    return False
            res = conn.execute(
                fleet_jobs.update()
                .where(
                    fleet_jobs.c.job_key == job_key,
                    fleet_jobs.c.ended_at.is_(None),
                    fleet_jobs.c.opted_out.is_(False),
                )
                .values(next_due=now)
            )
            return bool(res.rowcount)

    # -- samples ---------------------------------------------------------------------------------
    def claim(
        self,
        job_key: str,
        owner: str,
        sample_id: str,
        hosts: list[str],
        lease_s: float,
        interval_s: float,
        request: Mapping[str, Any],
        now: datetime | None = None,
    ) -> bool:
        """Take the job's lease and plan its sample in one transaction; False if another owner holds it
        or the job already has an active sample."""
        claim = Claim(job_key, sample_id, hosts, dict(request))
        return bool(self.claim_many(owner, [claim], lease_s, interval_s, now))

    def claim_many(
        self,
        owner: str,
        claims: Sequence[Claim],
        lease_s: float,
        interval_s: float,
        now: datetime | None = None,
    ) -> set[str]:
        """:meth:`claim` for many jobs in one transaction (one commit for a fan-out of hundreds);
        returns the sample ids that were planned."""
        now = now or utcnow()
        done: set[str] = set()
        with self.cat._write() as conn:
            for cl in sorted(
                claims, key=lambda c: c.job_key
            ):  # a fixed lock order: no deadlock on PostgreSQL
                if self._claim(conn, owner, cl, lease_s, interval_s, now):
                    done.add(cl.sample_id)
        return done

    def _claim(
        self, conn: sa.Connection, owner: str, cl: Claim, lease_s: float, interval_s: float, now: datetime
    ) -> bool:
        c = fleet_jobs.c
        active = conn.execute(
            sa.select(fleet_samples.c.sample_id).where(
                fleet_samples.c.job_key == cl.job_key, fleet_samples.c.state.in_(ACTIVE_STATES)
            )
        ).first()
        if active is not None:
            return False
        res = conn.execute(
            fleet_jobs.update()
            .where(
                c.job_key == cl.job_key,
                sa.or_(c.lease_owner.is_(None), c.lease_owner == owner, c.lease_expires < now),
            )
            .values(
                lease_owner=owner,
                lease_expires=now + timedelta(seconds=lease_s),
                next_due=now + timedelta(seconds=interval_s),
            )
        )
        if res.rowcount != 1:
            return False
        conn.execute(
            fleet_samples.insert().values(
                sample_id=cl.sample_id,
                job_key=cl.job_key,
                owner=owner,
                state="planned",
                created=now,
                updated_at=now,
                hosts=cl.hosts,
                request=cl.request,
                interval_s=interval_s,
            )
        )
        return True

    def take_over(self, sample_id: str, owner: str, lease_s: float, now: datetime | None = None) -> bool:
        """Adopt another instance's unfinished sample once its lease on the job has expired."""
        now = now or utcnow()
        c = fleet_jobs.c
        with self.cat._write() as conn:
            row = conn.execute(
                sa.select(fleet_samples.c.job_key).where(
                    fleet_samples.c.sample_id == sample_id, fleet_samples.c.state.in_(ACTIVE_STATES)
                )
            ).first()
            if row is None:
                return False
            res = conn.execute(
                fleet_jobs.update()
                .where(
                    c.job_key == row[0],
                    sa.or_(c.lease_owner.is_(None), c.lease_owner == owner, c.lease_expires < now),
                )
                .values(lease_owner=owner, lease_expires=now + timedelta(seconds=lease_s))
            )
            if res.rowcount != 1:
                return False
            conn.execute(
                fleet_samples.update()
                .where(fleet_samples.c.sample_id == sample_id)
                .values(owner=owner, updated_at=now)
            )
        return True

    def renew_lease(self, job_key: str, owner: str, lease_s: float, now: datetime | None = None) -> bool:
        """Extend ``owner``'s lease on the job to ``lease_s`` from now; False when it no longer holds
        it (another instance took the job over after the lease expired)."""
        now = now or utcnow()
        with self.cat._write() as conn:
            res = conn.execute(
                fleet_jobs.update()
                .where(fleet_jobs.c.job_key == job_key, fleet_jobs.c.lease_owner == owner)
                .values(lease_expires=now + timedelta(seconds=lease_s))
            )
        return res.rowcount == 1

    def mark_triggered(self, requests: Mapping[str, Mapping[str, Any]]) -> None:
        """Samples the daemons took (sample id -> request with its files), in one transaction."""
        if not requests:
            return
        now = utcnow()
        with self.cat._write() as conn:
            for sample_id, request in requests.items():
                conn.execute(
                    fleet_samples.update()
                    .where(fleet_samples.c.sample_id == sample_id, fleet_samples.c.state == "planned")
                    .values(state="triggered", request=dict(request), updated_at=now)
                )

    def set_state(
        self,
        sample_id: str,
        state: str,
        *,
        request: Mapping[str, Any] | None = None,
        reason: str | None = None,
        error: str | None = None,
    ) -> None:
        values: dict[str, Any] = {"state": state, "updated_at": utcnow()}
        if request is not None:
            values["request"] = dict(request)
        if reason is not None:
            values["reason"] = reason
        if error is not None:
            values["error"] = error[:4000]
        with self.cat._write() as conn:
            conn.execute(
                fleet_samples.update().where(fleet_samples.c.sample_id == sample_id).values(**values)
            )

    def finish(
        self,
        sample_id: str,
        state: str,
        *,
        summary: Mapping[str, Any] | None = None,
        analysis_id: int | None = None,
        reason: str | None = None,
        error: str | None = None,
    ) -> None:
        """Final state and summary of a sample, and its job's lease released, in one transaction."""
        now = utcnow()
        values: dict[str, Any] = {
            "state": state,
            "updated_at": now,
            "reason": reason,
            "analysis_id": analysis_id,
        }
        if error is not None:
            values["error"] = error[:4000]
        for k in SUMMARY_COLUMNS:
            if summary and k in summary:
                values[k] = summary[k]
        with self.cat._write() as conn:
            row = conn.execute(
                sa.select(fleet_samples.c.job_key, fleet_samples.c.owner).where(
                    fleet_samples.c.sample_id == sample_id
                )
            ).first()
            conn.execute(
                fleet_samples.update().where(fleet_samples.c.sample_id == sample_id).values(**values)
            )
            if row is not None:
                conn.execute(
                    fleet_jobs.update()
                    .where(fleet_jobs.c.job_key == row[0], fleet_jobs.c.lease_owner == row[1])
                    .values(lease_owner=None, lease_expires=None)
                )

    def active_samples(self) -> list[SampleRow]:
        """Samples in flight (any owner): for the fleet-wide and per-host limits."""
        with self.cat._read() as conn:
            rows = conn.execute(sa.select(fleet_samples).where(fleet_samples.c.state.in_(ACTIVE_STATES)))
            return [_sample(r) for r in rows]

    def step_times_ms(self, job_keys: Iterable[str]) -> dict[str, float]:
        """Each of ``job_keys``' step time (ms) in the analysis of its latest analysed sample
        (``recorded`` or ``unusable``: windows that missed each other still time the steps). The
        job's measured pace sets its next aligned roundup; a job never analysed is left out."""
        from kinetoscope.store.models import analyses

        keys = list(dict.fromkeys(job_keys))
        s, a = fleet_samples.c, analyses.c
        out: dict[str, float] = {}
        with self.cat._read() as conn:
            for i in range(0, len(keys), IN_BATCH):
                q = (
                    sa.select(s.job_key, a.step_time_ms)
                    .join(analyses, a.id == s.analysis_id)
                    .where(s.job_key.in_(keys[i : i + IN_BATCH]), s.state.in_(["recorded", "unusable"]))
                    .where(a.step_time_ms > 0)
                    .order_by(s.created, s.sample_id)
                )
                out.update((str(k), float(ms)) for k, ms in conn.execute(q))  # the latest one wins
        return out

    def sampled_jobs(self) -> set[str]:
        """Job keys with at least one sample (any state)."""
        with self.cat._read() as conn:
            return {r[0] for r in conn.execute(sa.select(fleet_samples.c.job_key).distinct())}

    def samples(self, job_key: str | None = None, states: Sequence[str] | None = None) -> list[SampleRow]:
        q = sa.select(fleet_samples).order_by(fleet_samples.c.created, fleet_samples.c.sample_id)
        if job_key is not None:
            q = q.where(fleet_samples.c.job_key == job_key)
        if states:
            q = q.where(fleet_samples.c.state.in_(list(states)))
        with self.cat._read() as conn:
            return [_sample(r) for r in conn.execute(q)]

    # -- alerts ----------------------------------------------------------------------------------
    def open_alert(self, job_key: str, kind: str) -> dict[str, Any] | None:
        with self.cat._read() as conn:
            r = conn.execute(
                sa.select(fleet_alerts).where(
                    fleet_alerts.c.job_key == job_key,
                    fleet_alerts.c.kind == kind,
                    fleet_alerts.c.closed.is_(None),
                )
            ).first()
            return dict(r._mapping) if r else None

    def start_episode(
        self, job_key: str, kind: str, sample_id: str, value: float | None, threshold: float
    ) -> int | None:
        """Open an episode unless one is open (checked in the same transaction); returns its id or None."""
        with self.cat._write() as conn:
            open_ = conn.execute(
                sa.select(fleet_alerts.c.id).where(
                    fleet_alerts.c.job_key == job_key,
                    fleet_alerts.c.kind == kind,
                    fleet_alerts.c.closed.is_(None),
                )
            ).first()
            if open_ is not None:
                return None
            res = conn.execute(
                fleet_alerts.insert().values(
                    job_key=job_key,
                    kind=kind,
                    sample_id=sample_id,
                    value=value,
                    threshold=threshold,
                    opened=utcnow(),
                    attempts=0,
                )
            )
            pk = res.inserted_primary_key
            return int(pk[0]) if pk else None

    def end_episode(self, job_key: str, kind: str) -> None:
        with self.cat._write() as conn:
            conn.execute(
                fleet_alerts.update()
                .where(
                    fleet_alerts.c.job_key == job_key,
                    fleet_alerts.c.kind == kind,
                    fleet_alerts.c.closed.is_(None),
                )
                .values(closed=utcnow())
            )

    def unsent_alerts(self, max_attempts: int) -> list[dict[str, Any]]:
        with self.cat._read() as conn:
            rows = conn.execute(
                sa.select(fleet_alerts)
                .where(fleet_alerts.c.sent.is_(None), fleet_alerts.c.attempts < max_attempts)
                .order_by(fleet_alerts.c.id)
            )
            return [dict(r._mapping) for r in rows]

    def alert_attempt(self, alert_id: int, sent: bool) -> None:
        with self.cat._write() as conn:
            conn.execute(
                fleet_alerts.update()
                .where(fleet_alerts.c.id == alert_id)
                .values(attempts=fleet_alerts.c.attempts + 1, sent=utcnow() if sent else None)
            )

    def alerts(self) -> list[dict[str, Any]]:
        with self.cat._read() as conn:
            return [
                dict(r._mapping) for r in conn.execute(sa.select(fleet_alerts).order_by(fleet_alerts.c.id))
            ]

    # -- helpers ---------------------------------------------------------------------------------
    def _upsert(
        self, conn: sa.Connection, table: sa.Table, keys: list[str], values: Mapping[str, Any]
    ) -> None:
        ins = self.cat._insert(conn, table).values(**values)
        conn.execute(
            ins.on_conflict_do_update(
                index_elements=keys, set_={k: v for k, v in values.items() if k not in keys}
            )
        )


def catalog_sink(catalog_url: str) -> AnnounceSink:
    """An ``AnnounceSink`` that records each heartbeat of a daemon in the catalog at
    ``catalog_url`` (:meth:`FleetStore.announce`); ``kscope daemon --catalog`` plugs it in.
    The catalog is opened for each beat (one short transaction every ``announce_interval_s``)."""

    def announce(beat: HostAnnouncement) -> None:
        with Catalog.open(catalog_url) as cat:
            FleetStore(cat).announce(beat.address, beat.hostname, beat.devices, beat.version)

    return announce
