"""Job assembly: which traces belong to one job, which ranks are there, missing or duplicated.

Identity of a trace (``TraceMeta``, filled by the loader): ``rank`` from ``distributedInfo``,
else the kscope ``manifest.json`` beside the file, else the file name (``rank-3``, ``worker3``);
``world_size`` from ``distributedInfo`` or the manifest; ``job_id`` from the manifest;
``hostname`` from the trace (``host_name``) or the manifest.

Grouping key, first that applies:

1. the manifest's ``job_id`` (on-demand traces collected by kscope);
2. otherwise ``(world size, backend, name pattern)``, where the name pattern is the file name
   with every digit run replaced by ``#`` (``rank-3_4242.pt.trace.json`` ->
   ``rank-#_#.pt.trace.json``). Traces from two folders with the same pattern and world size are
   one job (e.g. two sampled ranks copied apart); if that merges two runs, their ranks collide
   and are reported as duplicates. Traces without any rank group on ``(world size, backend)``
   alone (their names usually differ by host name).

Within a job:

* **duplicates**: several traces with one rank; the one with the most events is kept (it is
  the most complete window), the others are listed;
* **missing**: with a known world size, every rank in ``0..world_size-1`` without a trace;
  without one, the gaps below the highest rank seen (``world_size_source = "inferred"``);
* **unranked** traces (no rank from any source): if the whole job is unranked they get ranks
  0..n-1 in path order (``rank_source = "file order"``, noted), otherwise they are listed and
  left out.
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kinetoscope.trace.model import Trace


@dataclass
class Job:
    """The traces of one job, one per rank, plus what is wrong with the set."""

    key: str
    traces: dict[int, Trace] = field(default_factory=dict)  # rank -> trace (kept)
    world_size: int | None = None
    world_size_source: str = "unknown"  # distributedInfo | manifest | inferred | unknown
    job_id: str | None = None
    missing_ranks: list[int] = field(default_factory=list)
    duplicates: dict[int, list[str]] = field(default_factory=dict)  # rank -> paths left out
    unranked: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    # rank -> what the diagnosis reads of its trace (``extract.RankFigures``), set by ``diagnose``
    figures: dict[int, Any] = field(default_factory=dict)

    @property
    def ranks(self) -> list[int]:
        return sorted(self.traces)

    def hosts(self) -> dict[int, str | None]:
        return {r: t.meta.hostname for r, t in self.traces.items()}

    def ordered(self) -> list[Trace]:
        return [self.traces[r] for r in self.ranks]

    def to_dict(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "job_id": self.job_id,
            "world_size": self.world_size,
            "world_size_source": self.world_size_source,
            "ranks_found": self.ranks,
            "num_ranks_found": len(self.traces),
            "missing_ranks": self.missing_ranks,
            "num_missing_ranks": len(self.missing_ranks),
            "duplicate_ranks": {str(r): p for r, p in sorted(self.duplicates.items())},
            "unranked_files": list(self.unranked),
            "hosts": {str(r): self.traces[r].meta.hostname for r in self.ranks},
            "rank_sources": {str(r): self.traces[r].meta.rank_source for r in self.ranks},
            "notes": list(self.notes),
        }


def event_count(t: Trace) -> int:
    """Rows of the trace's events table (a ``extract.DigestTrace`` carries its source's count)."""
    return int(getattr(t, "event_count", t.events.height))


def name_pattern(path: str) -> str:
    """File name with digit runs replaced by ``#`` (rank, pid and timestamps vary per rank)."""
    return re.sub(r"\d+", "#", Path(path).name)


def _backend(t: Trace) -> str:
    return str(t.meta.distributed_info.get("backend") or "")


def job_key(t: Trace) -> str:
    if t.meta.job_id:
        return f"job:{t.meta.job_id}"
    ws = t.meta.world_size if t.meta.world_size is not None else "?"
    if t.meta.rank is None:  # names of unranked files carry host names, not a shared pattern
        return f"ws={ws};backend={_backend(t)};unranked"
    return f"ws={ws};backend={_backend(t)};name={name_pattern(t.meta.path)}"


def _build(key: str, members: list[Trace]) -> Job:
    job = Job(key=key)
    ids = {t.meta.job_id for t in members if t.meta.job_id}
    job.job_id = sorted(ids)[0] if ids else None
    ranked = [t for t in members if t.meta.rank is not None]
    unranked = sorted((t for t in members if t.meta.rank is None), key=lambda t: t.meta.path)
    if unranked and not ranked:
        for i, t in enumerate(unranked):
            t.meta.rank = i
            t.meta.rank_source = "file order"
        ranked = unranked
        job.notes.append("no rank metadata in any file: ranks assigned in file-name order")
    else:
        job.unranked = [t.meta.path for t in unranked]
        if unranked:
            job.notes.append(f"{len(unranked)} file(s) without a rank left out")
    by_rank: dict[int, list[Trace]] = defaultdict(list)
    for t in ranked:
        by_rank[int(t.meta.rank)].append(t)  # type: ignore[arg-type]
    for r, ts in by_rank.items():
        ts = sorted(ts, key=lambda t: (-event_count(t), t.meta.path))
        job.traces[r] = ts[0]
        if len(ts) > 1:
            job.duplicates[r] = [t.meta.path for t in ts[1:]]
    if job.duplicates:
        job.notes.append(
            "duplicate ranks: "
            + ", ".join(f"{r} ({len(p) + 1} files)" for r, p in sorted(job.duplicates.items()))
            + "; kept the file with the most events"
        )
    sizes = [t.meta.world_size for t in ranked if t.meta.world_size]
    if sizes:
        job.world_size = max(sizes)
        srcs = {
            "distributedInfo" if t.meta.distributed_info.get("world_size") else "manifest"
            for t in ranked
            if t.meta.world_size
        }
        job.world_size_source = "distributedInfo" if "distributedInfo" in srcs else "manifest"
        if len(set(sizes)) > 1:
            job.notes.append(
                f"traces disagree on the world size ({sorted(set(sizes))}); using {job.world_size}"
            )
        job.missing_ranks = [r for r in range(job.world_size) if r not in job.traces]
        extra = [r for r in job.traces if r >= job.world_size]
        if extra:
            job.notes.append(f"ranks {extra} are outside world size {job.world_size}")
    elif job.traces:
        job.world_size = max(job.traces) + 1
        job.world_size_source = "inferred"
        job.missing_ranks = [r for r in range(job.world_size) if r not in job.traces]
        if job.missing_ranks:
            job.notes.append("world size unknown: missing ranks inferred from gaps below the highest rank")
    return job


def assemble_jobs(traces: list[Trace]) -> list[Job]:
    """Group traces into jobs (module docstring); largest job first."""
    groups: dict[str, list[Trace]] = defaultdict(list)
    for t in traces:
        groups[job_key(t)].append(t)
    jobs = [_build(k, v) for k, v in groups.items()]
    jobs.sort(key=lambda j: (-len(j.traces), j.key))
    return jobs
