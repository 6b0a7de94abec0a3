"""Which files are traces, from what the user names to local files, and whether a set of
traces has a consistent set of ranks.

**Trace files.** A directory expands to its ``*.json`` / ``*.json.gz`` files (not recursive,
sorted by name), skipping kscope manifests (``manifest.json``, ``manifest.<host>.json``) and
hidden files. ``TRACE_SUFFIXES`` (``kinetoscope.protocol.defaults``) is the one definition of a trace file name.

**Discovery** (:func:`discover`): each input the user names (a path, a storage URL, a catalog
trace id...) is offered to a list of *resolvers* in order; the first that claims it returns its
local trace files. Only :class:`PathResolver` lives here (this layer reads files, nothing
more); the storage-URL and trace-id resolvers live with the store (``kinetoscope.orchestration``
adds them), in the spirit of Perfetto's ``trace_uri_resolver``.

Rank problems are reported, never resolved by overwriting: a trace with no known rank and two
traces claiming one rank both keep their data, get a warning in ``meta.warnings``, and appear
in the structured list returned by :func:`check_ranks`.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from kinetoscope.errors import KinetoscopeError
from kinetoscope.protocol.defaults import TRACE_SUFFIXES
from kinetoscope.trace.errors import TraceError
from kinetoscope.trace.metadata import is_manifest_name


class InputError(KinetoscopeError):
    """An input names nothing that can be analysed (message says which and why)."""


def is_trace_file_name(name: str) -> bool:
    return not name.startswith(".") and name.endswith(TRACE_SUFFIXES) and not is_manifest_name(name)


def trace_files_in(folder: str | os.PathLike[str]) -> list[Path]:
    """The trace files directly in ``folder`` (sorted by name; manifests and hidden files skipped)."""
    return sorted(c for c in Path(folder).iterdir() if c.is_file() and is_trace_file_name(c.name))


class Resolver(Protocol):
    """Turns one user input into local trace files, or declines it (``None``) for the next
    resolver. Raises :class:`InputError` when the input is its kind but names nothing usable."""

    def resolve(self, raw: str) -> list[Path] | None: ...


class PathResolver:
    """A local file (``file://`` accepted) or folder of trace files. Claims anything that
    exists, and anything that looks like a path (has a ``/`` or a trace suffix) so that a
    typo is "no such file" rather than a catalog lookup."""

    def resolve(self, raw: str) -> list[Path] | None:
        p = Path(os.path.expanduser(raw.removeprefix("file://")))
        if p.is_dir():
            found = trace_files_in(p)
            if not found:
                raise InputError(f"{raw}: no trace files (*.json, *.json.gz) in this folder")
            return found
        if p.is_file():
            return [p]
        if p.exists():  # a FIFO, socket or device: say what it is (reading it could block)
            from kinetoscope.trace.reader import check_trace_file

            check_trace_file(str(p))
        if raw.startswith("file://") or "/" in raw or raw.endswith(TRACE_SUFFIXES):
            raise InputError(f"{raw}: no such file or folder")
        return None


def unique_files(paths: Iterable[Path]) -> list[Path]:
    """``paths`` without repeats of one file (a folder and a file in it): first one kept."""
    seen: set[Path] = set()
    out = []
    for p in paths:
        key = p.resolve()
        if key not in seen:
            seen.add(key)
            out.append(p)
    return out


def discover(
    inputs: Sequence[str | os.PathLike[str]], resolvers: Sequence[Resolver] | None = None
) -> list[Path]:
    """Local trace files of ``inputs`` (each offered to ``resolvers`` in order; default: paths
    only), order kept, each file once. An input no resolver claims is an :class:`InputError`."""
    chain: Sequence[Resolver] = resolvers if resolvers is not None else (PathResolver(),)
    out: list[Path] = []
    for item in inputs:
        raw = os.fspath(item)
        for res in chain:
            found = res.resolve(raw)
            if found is not None:
                out.extend(found)
                break
        else:
            raise InputError(f"{raw}: no such file or folder")
    return unique_files(out)


def expand_paths(paths: str | os.PathLike[str] | Iterable[str | os.PathLike[str]]) -> list[str]:
    """Files and directories -> trace file paths (directories expanded, order kept, no
    duplicates). A missing path or a folder without traces is a :class:`TraceError`."""
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    out: list[str] = []
    for item in paths:
        p = Path(item)
        if p.is_dir():
            files = trace_files_in(p)
            if not files:
                raise TraceError(str(p), "directory holds no *.json or *.json.gz trace files")
            out.extend(str(f) for f in files)
        elif p.exists():
            out.append(str(p))
        else:
            raise TraceError(str(p), "no such file or directory")
    return [str(p) for p in unique_files(Path(f) for f in out)]


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


class TraceList(list[Any]):
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
