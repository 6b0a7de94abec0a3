"""The fleet listing shared by ``kscope jobs`` (autopilot columns) and the web app's Fleet page:
every autopilot job with its samples, its latest figures, and its total wasted GPU-hours.

Filters (``--where``, the page's query string) are clauses ``FIELD OP VALUE`` joined by ``and``,
over the fields of :data:`FILTER_FIELDS` (the job's latest recorded sample), e.g.
``gpu_util < 30 and lost > 0.1``. Anything else is a one-line error naming the clause.
"""

from __future__ import annotations

import operator
import re
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from typing import Any

from kinetoscope.errors import UsageError
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


def job_row(job: dict[str, Any], samples: Sequence[SampleRow]) -> dict[str, Any]:
    """One job of the listing (keys documented in docs/autopilot.md, "kscope jobs --json")."""
    recorded = [s for s in samples if s.state == "recorded"]
    latest = recorded[-1].summary if recorded else {}
    wasted = sum(float(s.summary.get("wasted_gpu_s") or 0.0) for s in recorded)
    return {
        "job_id": job["job_key"],
        "job_key": job["job_key"],
        "kineto_job_id": job.get("job_id"),
        "hosts": list(job.get("hosts") or []),
        "world_size": job.get("world_size"),
        "first_seen": _iso(job.get("first_seen")),
        "last_seen": _iso(job.get("last_seen")),
        "cmdline": job.get("cmdline"),
        "traces": len(samples),
        "ended": _iso(job.get("ended_at")),
        "opted_out": bool(job.get("opted_out")),
        "devices": job.get("devices"),
        "next_due": _iso(job.get("next_due")),
        "samples_recorded": len(recorded),
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
        "samples": [s.to_dict() for s in samples],
    }


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
) -> list[dict[str, Any]]:
    """Every autopilot job as a :func:`job_row`, filtered and sorted (``waste``: most wasted
    GPU-hours first; ``recent``: most recently seen first)."""
    if sort not in SORTS:
        raise UsageError(f"--sort {sort!r}: choose one of {', '.join(SORTS)}")
    clauses = parse_where(where)
    by_job: dict[str, list[SampleRow]] = {}
    for s in store.samples():
        by_job.setdefault(s.job_key, []).append(s)
    rows = [job_row(j, by_job.get(j["job_key"], [])) for j in store.jobs()]
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
