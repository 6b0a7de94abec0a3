"""Which files are traces, and whether a set of traces has a consistent set of ranks.

A directory expands to its ``*.json`` / ``*.json.gz`` files (not recursive, sorted by name),
skipping kscope manifests (``manifest.json``, ``manifest.<host>.json``) and hidden files.
Rank problems are reported, never resolved by overwriting: a trace with no known rank and two
traces claiming one rank both keep their data, get a warning in ``meta.warnings``, and appear
in the structured list returned by :func:`check_ranks`.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kinetoscope.protocol.defaults import TRACE_SUFFIXES
from kinetoscope.trace.errors import TraceError
from kinetoscope.trace.metadata import is_manifest_name


def is_trace_file_name(name: str) -> bool:
    return not name.startswith(".") and name.endswith(TRACE_SUFFIXES) and not is_manifest_name(name)


def expand_paths(paths: str | os.PathLike[str] | Iterable[str | os.PathLike[str]]) -> list[str]:
    """Files and directories -> trace file paths (directories expanded, order kept, no
    duplicates). A missing path is a :class:`TraceError`."""
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    out: list[str] = []
    seen: set[str] = set()
    for item in paths:
        p = Path(item)
        if p.is_dir():
            files = sorted(c for c in p.iterdir() if c.is_file() and is_trace_file_name(c.name))
            if not files:
                raise TraceError(str(p), "directory holds no *.json or *.json.gz trace files")
            found = [str(f) for f in files]
        elif p.exists():
            found = [str(p)]
        else:
            raise TraceError(str(p), "no such file or directory")
        for f in found:
            key = os.path.realpath(f)
            if key not in seen:
                seen.add(key)
                out.append(f)
    return out


@dataclass
class RankProblem:
    """``kind`` is ``"unknown"`` (no rank could be determined) or ``"duplicate"`` (several
    files claim ``rank``)."""

    kind: str
    rank: int | None
    paths: list[str]
    message: str
    sources: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "rank": self.rank, "paths": list(self.paths), "message": self.message}


class TraceList(list):
    """A list of traces plus ``problems``: the rank problems found when they were loaded."""

    problems: list[RankProblem]

    def __init__(self, traces: Iterable[Any] = (), problems: list[RankProblem] | None = None) -> None:
        super().__init__(traces)
        self.problems = problems or []


def check_ranks(traces: Iterable[Any]) -> list[RankProblem]:
    """Find unknown and colliding ranks; warn on the affected traces (once each)."""
    traces = list(traces)
    problems: list[RankProblem] = []
    by_rank: dict[int, list[Any]] = {}
    for t in traces:
        if t.meta.rank is None:
            msg = f"rank unknown for {t.meta.path}: it is kept as a trace without rank"
            problems.append(RankProblem("unknown", None, [t.meta.path], msg, [t.meta.rank_source]))
        else:
            by_rank.setdefault(t.meta.rank, []).append(t)
    for rank, group in sorted(by_rank.items()):
        if len(group) < 2:
            continue
        paths = [t.meta.path for t in group]
        msg = f"{len(group)} traces claim rank {rank}: " + ", ".join(
            f"{t.meta.path} ({t.meta.rank_source})" for t in group
        )
        problems.append(RankProblem("duplicate", rank, paths, msg, [t.meta.rank_source for t in group]))
        for t in group:
            others = [p for p in paths if p != t.meta.path]
            note = f"rank {rank} (from {t.meta.rank_source}) is also claimed by " + ", ".join(others)
            if note not in t.meta.warnings:
                t.meta.warnings.append(note)
    return problems
