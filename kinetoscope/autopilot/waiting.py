"""Why a job the sweep saw was not traced this cycle: one line per job for ``kscope autopilot
--once`` (and ``--json``'s ``waiting``), e.g. ``slurm:8080: first due 12:49:05 UTC, in 290 s
(warmup_s=300)``. Reasons are computed from the same catalog rows and policy the plan used.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timedelta, timezone
from typing import Any

from kinetoscope.autopilot.policy import Policy


def _aware(dt: datetime | None) -> datetime | None:
    if dt is None:
        return None
    return dt if dt.tzinfo else dt.replace(tzinfo=timezone.utc)


def when(at: datetime, now: datetime) -> str:
    """``12:49:05 UTC, in 290 s`` (``in 4.8 min``, ``in 2.0 h`` for longer waits)."""
    wait = max(0.0, (at - now).total_seconds())
    if wait < 120:
        rel = f"in {wait:.0f} s"
    elif wait < 7200:
        rel = f"in {wait / 60:.1f} min"
    else:
        rel = f"in {wait / 3600:.1f} h"
    return f"{at.astimezone(timezone.utc):%H:%M:%S} UTC, {rel}"


def why_waiting(
    job: Mapping[str, Any],
    policy: Policy,
    *,
    now: datetime,
    sampled: bool,
    in_flight: str | None = None,
) -> str:
    """Why ``job`` (a ``fleet_jobs`` row) was not planned, when the plan itself gave no reason:
    opted out, a sample in flight, or not yet due: the later of "old enough" (``min_age_s``) and
    its next due time (``warmup_s`` before its first sample, ``interval_s`` after), naming the
    policy key that sets it."""
    if job.get("opted_out"):
        return "opted out (KSCOPE_AUTOPILOT)"
    if in_flight:
        return f"sample {in_flight} still in flight"
    waits: list[tuple[datetime, str]] = []
    age = job.get("age_s")
    if isinstance(age, (int, float)) and age < policy.min_age_s:
        waits.append((now + timedelta(seconds=policy.min_age_s - age), f"min_age_s={policy.min_age_s:g}"))
    due = _aware(job.get("next_due"))
    if due is not None and due > now:
        knob = f"interval_s={policy.interval_s:g}" if sampled else f"warmup_s={policy.warmup_s:g}"
        waits.append((due, knob))
    if waits:
        at, knob = max(waits)
        return f"{'next' if sampled else 'first'} due {when(at, now)} ({knob})"
    return "due, but not planned this cycle"
