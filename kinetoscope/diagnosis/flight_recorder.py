"""Read PyTorch Flight Recorder dumps and name the ranks that never joined the collective the
others wait in (docs/stacks.md, "Flight Recorder").

The Flight Recorder is a ring buffer of the last collectives each rank's process groups issued
(``TORCH_FR_BUFFER_SIZE``, or ``TORCH_NCCL_TRACE_BUFFER_SIZE`` for NCCL, entries each). PyTorch
dumps it per rank; kscope reads the **JSON form only** (``_dump_fr_trace_json()`` /
``_dump_nccl_trace_json()``): ``{"version", "pg_config": {pg: {"name", "desc", "ranks"}},
"pg_status", "entries": [{"collective_seq_id", "p2p_seq_id", "is_p2p", "profiling_name",
"process_group": [pg, desc], "state", "retired", ...}]}``. The default dump files of
``TORCH_NCCL_DUMP_ON_TIMEOUT`` are Python pickles: they are refused, never unpickled (a pickle
runs code when loaded, and a dump is untrusted input).

Terms: a rank's **last collective** in a group is its entry with the highest
``collective_seq_id`` (point-to-point entries aside). The **frontier** of a group is the highest
last collective of its members. Members at the frontier whose entry is not finished (not
``completed``, not ``retired``) **wait** there; members whose last collective is below it
**never entered** it - the ranks to look at. The rank of a dump is its ``rank`` field when it
has one, else the number that ends its file name (``fr_trace_rank_3.json``, PyTorch's
``<prefix><rank>`` naming).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import msgspec

from kinetoscope.errors import KinetoscopeError
from kinetoscope.protocol.structinfo import prime_structs

MAX_DUMP_BYTES = 512 << 20
_PICKLE_MAGIC = (b"\x80",)  # protocol 2+ pickles start with PROTO
_RANK_AT_END = re.compile(r"(\d+)(?:\.json)?$")


class FlightRecorderError(KinetoscopeError):
    """A dump that cannot be read (names the file and why)."""


class RankDump(msgspec.Struct, kw_only=True):
    """One rank's dump: per group, its last collective (seq, name, finished)."""

    rank: int
    file: str
    version: str | None
    last: dict[str, tuple[int, str, bool]]  # group -> (seq, profiling name, finished)
    group_ranks: dict[str, list[int]]
    group_desc: dict[str, str]


class Missing(msgspec.Struct, kw_only=True):
    rank: int
    last_seq: int | None  # None: no collective of this group in its buffer
    last_collective: str | None


class GroupVerdict(msgspec.Struct, kw_only=True):
    """One process group: where its frontier is, who waits there, who never arrived."""

    process_group: str
    desc: str
    ranks: list[int]
    seq: int
    collective: str
    waiting: list[int]
    never_entered: list[Missing]
    no_dump: list[int]
    mismatched: dict[str, list[int]]  # profiling name -> ranks, when the frontier's names differ
    summary: str


class FlightRecorderReport(msgspec.Struct, kw_only=True):
    """``kscope analyze --flight-recorder`` (the ``flight_recorder`` key of ``--json``)."""

    files: list[str]
    ranks: list[int]
    groups: list[GroupVerdict]
    culprits: list[int]  # every rank that never entered a frontier collective
    verdict: str

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = msgspec.to_builtins(self)
        return out


def dump_files(paths: Iterable[str | os.PathLike[str]]) -> list[Path]:
    """The dump files named or inside the folders named (sorted), at least one."""
    out: list[Path] = []
    for raw in paths:
        p = Path(raw)
        if p.is_dir():
            out += sorted(q for q in p.iterdir() if q.is_file() and not q.name.startswith("."))
        elif p.is_file():
            out.append(p)
        else:
            raise FlightRecorderError(f"flight recorder: {p}: no such file or folder")
    if not out:
        raise FlightRecorderError("flight recorder: no dump file found in " + ", ".join(map(str, paths)))
    return out


def _load(path: Path) -> dict[str, Any]:
    try:
        size = path.stat().st_size
        if size > MAX_DUMP_BYTES:
            raise FlightRecorderError(
                f"flight recorder dump {path}: {size} bytes, over the {MAX_DUMP_BYTES}-byte limit"
            )
        data = path.read_bytes()
    except OSError as exc:
        raise FlightRecorderError(f"cannot read flight recorder dump {path}: {exc.strerror or exc}") from exc
    if data[:1] in _PICKLE_MAGIC:
        raise FlightRecorderError(
            f"flight recorder dump {path} is a Python pickle; kscope never unpickles (it would run code from the "
            "file): dump the JSON form (torch._C._distributed_c10d._dump_fr_trace_json())"
        )
    try:
        doc = json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise FlightRecorderError(f"flight recorder dump {path} is not JSON: {exc}") from exc
    if not isinstance(doc, dict) or not isinstance(doc.get("pg_config", {}), dict):
        raise FlightRecorderError(
            f"flight recorder dump {path}: not a Flight Recorder document (no 'pg_config')"
        )
    return doc


def _rank_of(path: Path, doc: Mapping[str, Any]) -> int:
    rank = doc.get("rank")
    if isinstance(rank, int) and not isinstance(rank, bool):
        return rank
    m = _RANK_AT_END.search(path.name)
    if m is None:
        raise FlightRecorderError(
            f"flight recorder dump {path}: no 'rank' field and no rank number at the end of the file name"
        )
    return int(m.group(1))


def _ranks_list(value: Any) -> list[int]:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return []
    return [int(v) for v in value if isinstance(v, int)] if isinstance(value, list) else []


def read_dump(path: Path) -> RankDump:
    """One dump -> its rank's last collective per group. Raises FlightRecorderError."""
    doc = _load(path)
    entries = doc.get("entries") or []
    if not isinstance(entries, list):
        raise FlightRecorderError(f"flight recorder dump {path}: 'entries' is not a list")
    last: dict[str, tuple[int, str, bool]] = {}
    descs: dict[str, str] = {}
    for e in entries:
        if not isinstance(e, dict) or e.get("is_p2p"):
            continue
        seq = e.get("collective_seq_id")
        pg = e.get("process_group")
        if not isinstance(seq, int) or not isinstance(pg, list) or not pg:
            continue
        name = str(pg[0])
        if len(pg) > 1:
            descs[name] = str(pg[1])
        finished = e.get("state") == "completed" or bool(e.get("retired"))
        if name not in last or seq >= last[name][0]:
            last[name] = (seq, str(e.get("profiling_name") or "?"), finished)
    config = doc.get("pg_config") or {}
    group_ranks = {str(k): _ranks_list(v.get("ranks")) for k, v in config.items() if isinstance(v, dict)}
    for k, v in config.items():
        if isinstance(v, dict) and v.get("desc"):
            descs.setdefault(str(k), str(v["desc"]))
    version = doc.get("version")
    return RankDump(
        rank=_rank_of(path, doc),
        file=str(path),
        version=str(version) if version is not None else None,
        last=last,
        group_ranks=group_ranks,
        group_desc=descs,
    )


def _label(ranks: list[int]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + ",".join(map(str, sorted(ranks)))


def judge_group(name: str, dumps: Mapping[int, RankDump]) -> GroupVerdict | None:
    """The frontier of group ``name`` and who is missing from it; None when nobody is stuck there."""
    members = next((d.group_ranks[name] for d in dumps.values() if d.group_ranks.get(name)), [])
    if not members:
        members = sorted(r for r, d in dumps.items() if name in d.last)
    if not any(name in d.last for d in dumps.values()):
        return None
    desc = next((d.group_desc[name] for d in dumps.values() if name in d.group_desc), "")
    present = [r for r in members if r in dumps]
    seq = max(dumps[r].last[name][0] for r in present if name in dumps[r].last)
    at_frontier = [r for r in present if name in dumps[r].last and dumps[r].last[name][0] == seq]
    waiting = [r for r in at_frontier if not dumps[r].last[name][2]]
    behind = [r for r in present if r not in at_frontier]
    if not waiting and not behind:
        return None
    names: dict[str, list[int]] = {}
    for r in at_frontier:
        names.setdefault(dumps[r].last[name][1], []).append(r)
    collective = max(names, key=lambda n: len(names[n]))
    never = [
        Missing(
            rank=r,
            last_seq=dumps[r].last[name][0] if name in dumps[r].last else None,
            last_collective=dumps[r].last[name][1] if name in dumps[r].last else None,
        )
        for r in behind
    ]
    no_dump = [r for r in members if r not in dumps]
    label = f"process group {name or '0'}" + (f" ({desc})" if desc else "")
    summary = f"{label}: {_label(waiting or at_frontier)} wait in collective #{seq} ({collective})"
    if never:
        lasts = "; ".join(
            f"rank {m.rank}: #{m.last_seq} {m.last_collective}"
            if m.last_seq is not None
            else f"rank {m.rank}: none"
            for m in never
        )
        summary += f"; {_label([m.rank for m in never])} never entered it (last: {lasts})"
    if no_dump:
        summary += f"; no dump from {_label(no_dump)}"
    return GroupVerdict(
        process_group=name,
        desc=desc,
        ranks=members,
        seq=seq,
        collective=collective,
        waiting=waiting,
        never_entered=never,
        no_dump=no_dump,
        mismatched=names if len(names) > 1 else {},
        summary=summary,
    )


def analyse(paths: Iterable[str | os.PathLike[str]]) -> FlightRecorderReport:
    """Read every dump under ``paths`` and judge every process group."""
    files = dump_files(paths)
    dumps: dict[int, RankDump] = {}
    for f in files:
        d = read_dump(f)
        if d.rank in dumps:
            raise FlightRecorderError(f"flight recorder: {f} and {dumps[d.rank].file} are both rank {d.rank}")
        dumps[d.rank] = d
    groups_seen = sorted({g for d in dumps.values() for g in (*d.last, *d.group_ranks)})
    verdicts = [v for g in groups_seen if (v := judge_group(g, dumps)) is not None]
    culprits = sorted({m.rank for v in verdicts for m in v.never_entered})
    if verdicts:
        text = " | ".join(v.summary for v in verdicts)
    else:
        text = f"{len(dumps)} dumps: every rank reached the same last collective in every process group"
    return FlightRecorderReport(
        files=[str(f) for f in files], ranks=sorted(dumps), groups=verdicts, culprits=culprits, verdict=text
    )


prime_structs(globals())
