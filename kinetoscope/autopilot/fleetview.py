"""The job listing shared by ``kscope jobs``, the web app's Jobs page and its Fleet page: every
job with its samples, its latest figures, and its total wasted GPU-hours.

**One list**: a job appears once whether ``kscope trace`` (by hand) or the autopilot traced it.
Autopilot jobs are keyed by their job key (``fleet_models``); a catalog job whose Kineto job id
is a Slurm job the autopilot watches (``slurm:<id>``) is merged into it, its hand-made traces
counted in ``traces_manual``. Any other catalog job is listed on its own (``source`` ``manual``),
except a Kineto job id (``0`` outside Slurm) that only autopilot samples carry. ``traces`` counts
every trace of the job (samples that produced one, plus traces by hand); ``samples_*`` count the
autopilot's samples by outcome. Figures come from ``recorded`` samples only: an ``unusable``
sample (its evidence cannot carry a verdict) never enters the ranking.

Filters (``--where``, the page's query string) are clauses ``FIELD OP VALUE`` joined by ``and``,
over the fields of :data:`FILTER_FIELDS` (the job's latest recorded sample), e.g.
``gpu_util < 30 and lost > 0.1``. Anything else is a one-line error naming the clause.
"""

from __future__ import annotations

import operator
import re
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timezone
from statistics import fmean
from typing import Any

import msgspec

from kinetoscope.errors import UsageError
from kinetoscope.protocol.structinfo import prime_structs
from kinetoscope.store.fleet import FleetStore, SampleRow

#: filter name -> (job row key, meaning)
FILTER_FIELDS: dict[str, tuple[str, str]] = {
    "gpu_util": ("gpu_busy_pct", "GPU busy %, latest sample"),
    "mfu": ("mfu", "model FLOPs utilisation (0-1), latest sample"),
    "lost": ("lost_fraction", "step time lost to stragglers (0-1), latest sample"),
    "launch_bound": ("launch_bound_pct", "launch-bound %, latest sample"),
    "exposed_comm": ("exposed_comm_pct", "exposed communication %, latest sample"),
    "waste_h": ("wasted_gpu_hours", "wasted GPU-hours, all samples"),
    "samples": ("samples_recorded", "recorded samples"),
}
SORTS = ("recent", "waste")
STALE_AFTER_S = 3600.0  # the policy's default stale_after_s: a watched job unseen for longer reads "not seen"
_AUTOPILOT_KEYS = (
    "kineto_job_id",
    "ended",
    "devices",
    "next_due",
    "gpu_busy_pct",
    "mfu",
    "straggler_kind",
    "straggler_ranks",
    "lost_fraction",
    "exposed_comm_pct",
    "launch_bound_pct",
    "top_recommendation",
    "top_recommendation_title",
)
_OPS: dict[str, Callable[[Any, Any], bool]] = {
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
    "==": operator.eq,
    "!=": operator.ne,
}
_CLAUSE = re.compile(r"^\s*([a-z_]+)\s*(<=|>=|==|!=|<|>)\s*(-?\d+(?:\.\d+)?)\s*$")

Clause = tuple[str, Callable[[Any, Any], bool], float]


def parse_where(text: str | None) -> list[Clause]:
    """``gpu_util < 30 and lost > 0.1`` -> clauses; a bad clause is a :class:`UsageError`."""
    if not text or not text.strip():
        return []
    out: list[Clause] = []
    for part in re.split(r"\s+and\s+", text.strip(), flags=re.IGNORECASE):
        m = _CLAUSE.match(part)
        if not m or m.group(1) not in FILTER_FIELDS:
            raise UsageError(
                f"--where {part.strip()!r}: expected FIELD OP NUMBER with FIELD one of "
                f"{', '.join(FILTER_FIELDS)} and OP one of {' '.join(_OPS)}"
            )
        out.append((FILTER_FIELDS[m.group(1)][0], _OPS[m.group(2)], float(m.group(3))))
    return out


def _iso(dt: datetime | None) -> str | None:
    return dt.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ") if dt else None


def _aware(dt: datetime | None) -> datetime | None:
    if dt is None:
        return None
    return dt if dt.tzinfo else dt.replace(tzinfo=timezone.utc)


def job_state(job: Mapping[str, Any], now: datetime | None = None) -> str:
    """``opted out``, ``ended`` (exited, or not seen for the policy's ``stale_after_s``),
    ``not seen`` (unseen for over :data:`STALE_AFTER_S` while no autopilot ended it: none is
    running, or its hosts are down), else ``running``."""
    now = now or datetime.now(timezone.utc)
    last = _aware(job.get("last_seen"))
    if job.get("ended_at"):
        return "ended"
    if job.get("opted_out"):
        return "opted out"
    if last is not None and (now - last).total_seconds() > STALE_AFTER_S:
        return "not seen"
    return "running"


def _anomalous(s: SampleRow) -> bool:
    n = s.summary.get("timestamp_anomalies")
    return isinstance(n, int) and n > 0


def wasted_gpu_s(recorded: Sequence[SampleRow], traced: int) -> float:
    """A job's wasted GPU-seconds: the mean over its usable samples × every sample that traced it
    (usable or not). Each sample stands for one interval of the job's life; an unusable one's
    interval is counted at the job's usable mean, so excluding a bad sample never moves the job
    in the ranking just by leaving its time out."""
    per = [float(v) for s in recorded if isinstance(v := s.summary.get("wasted_gpu_s"), (int, float))]
    return fmean(per) * traced if per else 0.0


def job_row(
    job: dict[str, Any], samples: Sequence[SampleRow], manual_traces: int = 0, now: datetime | None = None
) -> dict[str, Any]:
    """One job of the listing (keys documented in docs/autopilot.md, "kscope jobs --json").
    Only ``recorded`` samples (usable evidence) give figures (:func:`wasted_gpu_s`); ``unusable``
    ones are counted apart, with how many of them had timestamp anomalies (repeated profiling)."""
    recorded = [s for s in samples if s.state == "recorded"]
    latest = recorded[-1].summary if recorded else {}
    traced = [s for s in samples if s.state in ("recorded", "unusable")]
    wasted = wasted_gpu_s(recorded, len(traced))
    return {
        "job_id": job["job_key"],
        "job_key": job["job_key"],
        "kineto_job_id": job.get("job_id"),
        "hosts": list(job.get("hosts") or []),
        "world_size": job.get("world_size"),
        "first_seen": _iso(job.get("first_seen")),
        "last_seen": _iso(job.get("last_seen")),
        "cmdline": job.get("cmdline"),
        "traces": len(traced) + manual_traces,
        "traces_manual": manual_traces,
        "source": "both" if manual_traces else "autopilot",
        "state": job_state(job, now),
        "ended": _iso(job.get("ended_at")),
        "opted_out": bool(job.get("opted_out")),
        "devices": job.get("devices"),
        "next_due": _iso(job.get("next_due")),
        "samples_total": len(samples),
        "samples_recorded": len(recorded),
        "samples_unusable": sum(1 for s in samples if s.state == "unusable"),
        "samples_failed": sum(1 for s in samples if s.state in ("failed", "job_ended")),
        "timestamp_anomaly_samples": sum(1 for s in samples if _anomalous(s)),
        "wasted_gpu_s": round(wasted, 3),
        "wasted_gpu_hours": round(wasted / 3600.0, 6),
        "gpu_busy_pct": latest.get("gpu_busy_pct"),
        "mfu": latest.get("mfu"),
        "straggler_kind": latest.get("straggler_kind"),
        "straggler_ranks": latest.get("straggler_ranks"),
        "lost_fraction": latest.get("lost_fraction"),
        "exposed_comm_pct": latest.get("exposed_comm_pct"),
        "launch_bound_pct": latest.get("launch_bound_pct"),
        "top_recommendation": latest.get("top_recommendation"),
        "top_recommendation_title": latest.get("top_recommendation_title"),
        "samples": [s.to_dict() for s in samples],
    }


def manual_row(job: Any, manual_traces: int) -> dict[str, Any]:
    """A job only ``kscope trace`` (or the web form) traced: the catalog's keys, the autopilot's
    keys empty, state ``traced by hand`` (nothing watches it)."""
    row: dict[str, Any] = dict.fromkeys(_AUTOPILOT_KEYS)
    row.update(job.to_dict())
    row.update(
        job_key=job.job_id,
        traces=manual_traces,
        traces_manual=manual_traces,
        source="manual",
        state="traced by hand",
        opted_out=False,
        samples_total=0,
        samples_recorded=0,
        samples_unusable=0,
        samples_failed=0,
        timestamp_anomaly_samples=0,
        wasted_gpu_s=0.0,
        wasted_gpu_hours=0.0,
        samples=[],
    )
    return row


def _merge_key(catalog_job_id: str, fleet_keys: set[str]) -> str | None:
    """The autopilot job a catalog job is: ``slurm:<id>`` for a Slurm job id, or its own key."""
    for key in (catalog_job_id, f"slurm:{catalog_job_id}"):
        if key in fleet_keys:
            return key
    return None


def all_job_rows(store: FleetStore, samples: Sequence[SampleRow] | None = None) -> list[dict[str, Any]]:
    """Every job the catalog knows, traced by hand or by the autopilot, once each (module
    docstring, "One list"), most recently seen first."""
    now = datetime.now(timezone.utc)
    samples = store.samples() if samples is None else samples
    by_job: dict[str, list[SampleRow]] = {}
    for s in samples:
        by_job.setdefault(s.job_key, []).append(s)
    sample_ids = {s.sample_id for s in samples}
    fleet = {j["job_key"]: j for j in store.jobs()}
    manual: dict[str, int] = {}
    others = []
    traces = store.trace_ids_by_job()
    for cj in store.cat.jobs():
        ids = traces.get(cj.job_id, set())
        by_hand = len(ids - sample_ids)
        key = _merge_key(cj.job_id, set(fleet))
        if key is not None:
            manual[key] = manual.get(key, 0) + by_hand
        elif by_hand or not ids:  # a Kineto job id only autopilot samples carry is not a job of its own
            others.append(manual_row(cj, by_hand))
    rows = [job_row(j, by_job.get(k, []), manual.get(k, 0), now) for k, j in fleet.items()] + others
    rows.sort(key=lambda r: (r["last_seen"] or "", r["job_key"]), reverse=True)
    return rows


def _matches(row: dict[str, Any], clauses: Sequence[Clause]) -> bool:
    for key, op, value in clauses:
        have = row.get(key)
        if not isinstance(have, (int, float)) or not op(have, value):
            return False
    return True


def fleet_rows(
    store: FleetStore,
    *,
    sort: str = "waste",
    where: str | None = None,
    straggler: bool = False,
    include_ended: bool = True,
    everything: bool = False,
    since: datetime | None = None,
) -> list[dict[str, Any]]:
    """Autopilot jobs (``everything``: every job of :func:`all_job_rows`) as :func:`job_row`,
    filtered and sorted (``waste``: most wasted GPU-hours first; ``recent``: most recently seen
    first). ``since``: only samples taken from then on count (the Fleet page's window)."""
    if sort not in SORTS:
        raise UsageError(f"--sort {sort!r}: choose one of {', '.join(SORTS)}")
    clauses = parse_where(where)
    samples = store.samples()
    if since is not None:
        samples = [s for s in samples if (_aware(s.created) or since) >= since]
    rows = all_job_rows(store, samples)
    if not everything:
        rows = [r for r in rows if r["source"] != "manual"]
    rows = [
        r
        for r in rows
        if _matches(r, clauses)
        and (include_ended or not r["ended"])
        and (not straggler or r["straggler_kind"] not in (None, "none"))
    ]
    if sort == "waste":
        rows.sort(key=lambda r: (-r["wasted_gpu_s"], r["job_key"]))
    else:
        rows.sort(key=lambda r: (r["last_seen"] or "", r["job_key"]), reverse=True)
    return rows


LOW_UTIL_PCT = 30.0  # GPU busy under this is "low utilisation" (the alerts' default threshold)


class FleetTotals(msgspec.Struct):
    """The Fleet page's totals over the jobs listed (and the window's samples).

    ``gpu_hours_wasted``: idle share × devices × interval summed over usable samples (GPU-h).
    ``jobs_sampled``: jobs with at least one usable sample; the three ``share_*`` are fractions
    (0-1) of those, judged on each job's latest usable sample: a persistent or intermittent
    straggler, GPU busy under :data:`LOW_UTIL_PCT` %, the launch-bound recommendation raised."""

    jobs_listed: int
    jobs_sampled: int
    gpu_hours_wasted: float
    samples_recorded: int
    samples_unusable: int
    timestamp_anomaly_samples: int
    jobs_with_stragglers: int
    jobs_low_utilisation: int
    jobs_launch_bound: int
    share_stragglers: float | None
    share_low_utilisation: float | None
    share_launch_bound: float | None
    first_sample: str | None
    last_sample: str | None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = msgspec.to_builtins(self)
        return out


def fleet_totals(rows: Sequence[Mapping[str, Any]]) -> FleetTotals:
    """:class:`FleetTotals` of listed job rows (:func:`job_row`)."""
    sampled = [r for r in rows if r["samples_recorded"]]
    strag = sum(1 for r in sampled if r["straggler_kind"] in ("persistent", "intermittent"))
    low = sum(
        1 for r in sampled if isinstance(r["gpu_busy_pct"], (int, float)) and r["gpu_busy_pct"] < LOW_UTIL_PCT
    )
    launch = sum(1 for r in sampled if (r["launch_bound_pct"] or 0) > 0)
    times = sorted(
        s["created"] for r in rows for s in r["samples"] if s["state"] == "recorded" and s["created"]
    )
    n = len(sampled)
    return FleetTotals(
        jobs_listed=len(rows),
        jobs_sampled=n,
        gpu_hours_wasted=round(sum(r["wasted_gpu_hours"] for r in rows), 6),
        samples_recorded=sum(r["samples_recorded"] for r in rows),
        samples_unusable=sum(r["samples_unusable"] for r in rows),
        timestamp_anomaly_samples=sum(r["timestamp_anomaly_samples"] for r in rows),
        jobs_with_stragglers=strag,
        jobs_low_utilisation=low,
        jobs_launch_bound=launch,
        share_stragglers=round(strag / n, 4) if n else None,
        share_low_utilisation=round(low / n, 4) if n else None,
        share_launch_bound=round(launch / n, 4) if n else None,
        first_sample=times[0] if times else None,
        last_sample=times[-1] if times else None,
    )


prime_structs(globals())
