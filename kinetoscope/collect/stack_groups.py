"""Where is every rank? Group ranks by the shape of their stacks, name the outliers, and tell a
stuck rank from a progressing one (docs/stacks.md).

Terms:

* **main stack** of a rank: the Python stack of its main thread (the thread whose OS id is the
  process id, else the one py-spy names ``MainThread``, else the first with frames) in its
  latest snapshot. Training loops, collectives and data loading run there; the other threads of
  a PyTorch process (Kineto, gloo/NCCL, pin-memory) carry no Python frames or only waiting ones.
* **shape**: the main stack's functions and files, outermost first, line numbers dropped, so
  ranks at different lines of the same function share a shape (``same functions, line numbers
  normalised``).
* **group**: the ranks of one shape. A rank seen **progressing** over several snapshots is
  grouped by its **loop**: the job's own frames (library frames dropped) that it stayed in
  through every snapshot, outermost first, down to the first whose line or locals changed (the
  frame that iterates). Where a busy rank happens to be below it is noise, so a healthy job
  reads as one group. Groups print smallest first: a hang is usually one rank
  (or a few) somewhere the others are not.
* **outliers**: the ranks of every group but the largest, when one group is larger than every
  other (with two equal largest groups nobody is the odd one out).
* **state** of a rank over several snapshots (``--samples N``): ``stuck`` when its main stack,
  line numbers and short locals included, is the same in every snapshot; ``progressing`` when
  it changed; ``unknown`` from a single snapshot; ``error`` when no snapshot could be taken.
  Locals matter: a healthy training loop can be in the same line twice (a long backward), but
  its step counter moved.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import msgspec

from kinetoscope.protocol import rpc
from kinetoscope.protocol.structinfo import prime_structs

SCHEMA = "kscope.stacks/1"
STUCK = "stuck"
PROGRESSING = "progressing"
UNKNOWN = "unknown"
ERROR = "error"
_LIBRARY = re.compile(r"(site-packages|dist-packages|/lib/python\d|<frozen |^<)")


class RankStacks(msgspec.Struct, kw_only=True):
    """One process of the job and its snapshots, oldest first (``snapshots``: the daemon's
    ``ProcessStacks`` of each sample; a failed sample keeps its ``error``)."""

    host: str  # the daemon's address, host:port
    hostname: str
    pid: int
    host_pid: int | None
    rank: int | None
    snapshots: list[rpc.ProcessStacks]
    state: str = UNKNOWN
    group: int | None = None
    cpu_pct: float | None = None  # CPU use over the samples (100 = one core), None from one sample
    error: str | None = None
    error_kind: str | None = None


class FrameRef(msgspec.Struct, kw_only=True):
    name: str
    file: str
    line: int


class StackGroup(msgspec.Struct, kw_only=True):
    """Ranks sharing one shape. ``frame``: the innermost Python frame of the shape; ``caller``:
    the innermost frame of the job's own code above it (not a library's), where the job called
    what it waits in; ``summary`` the line the CLI prints; ``shape``: ``function (file)``
    outermost first; ``active``: how many of the ranks' main threads py-spy saw running."""

    id: int
    size: int
    ranks: list[int | None]
    members: list[str]  # host:pid of every member, for ranks without a rank number
    summary: str
    frame: FrameRef | None
    caller: FrameRef | None
    shape: list[str]
    active: int
    outlier: bool
    states: dict[str, int]


class StacksReport(msgspec.Struct, kw_only=True):
    """The ``kscope stacks --json`` document (docs/stacks.md, "JSON contract")."""

    schema: str = SCHEMA
    target: dict[str, object]
    samples: int
    interval_s: float
    hosts: list[dict[str, object]]
    ranks: list[RankStacks]
    groups: list[StackGroup]
    outliers: list[int | None]
    outlier_members: list[str]
    states: dict[str, int]
    verdict: str
    errors: list[dict[str, object]]

    def to_json(self) -> dict[str, object]:
        out: dict[str, object] = msgspec.to_builtins(self)
        return out


def main_thread(snap: rpc.ProcessStacks) -> rpc.ThreadStack | None:
    """The main thread of a snapshot (module docstring), None without threads."""
    pid = snap.host_pid if snap.host_pid is not None else snap.pid
    for t in snap.threads:
        if t.os_thread_id == pid:
            return t
    for t in snap.threads:
        if t.name == "MainThread":
            return t
    return next((t for t in snap.threads if t.frames), snap.threads[0] if snap.threads else None)


def _python_frames(thread: rpc.ThreadStack) -> list[rpc.StackFrame]:
    """Innermost first, C/C++ frames left out (``--native`` adds them; they do not make a shape)."""
    return [f for f in thread.frames if not f.native]


def shape_of(thread: rpc.ThreadStack | None) -> tuple[str, ...]:
    """``function (file)`` outermost first: the grouping key (line numbers normalised away)."""
    if thread is None:
        return ()
    return tuple(f"{f.name} ({_base(f)})" for f in reversed(_python_frames(thread)))


def _own_frames(thread: rpc.ThreadStack | None) -> list[rpc.StackFrame]:
    """The job's own Python frames (no library's), outermost first."""
    if thread is None:
        return []
    return [f for f in reversed(_python_frames(thread)) if not is_library(f.file)]


def loop_of(snapshots: Sequence[rpc.ProcessStacks]) -> tuple[str, ...]:
    """The loop a progressing rank runs: the job's own frames it stayed in through every
    snapshot, outermost first, down to the outermost one whose line or locals changed between
    snapshots. That frame is the one iterating (a training loop's step counter moves); where
    the rank happened to be below it is noise, even when every snapshot caught it in the same
    helper. When none of them changed (the change is in a library frame below), every common
    frame."""
    stacks = [_own_frames(main_thread(s)) for s in snapshots]
    common: list[str] = []
    for frames in zip(*stacks):
        names = {f"{f.name} ({_base(f)})" for f in frames}
        if len(names) > 1:
            break
        common.append(names.pop())
        if len({(f.line, tuple(sorted((f.locals or {}).items()))) for f in frames}) > 1:
            break
    return tuple(common)


def exact_of(thread: rpc.ThreadStack | None) -> tuple[object, ...]:
    """The stack with line numbers and locals: what must not change for a rank to be stuck."""
    if thread is None:
        return ()
    return tuple(
        (f.name, f.file, f.line, tuple(sorted((f.locals or {}).items()))) for f in _python_frames(thread)
    )


def _base(f: rpc.StackFrame) -> str:
    """The file's last part: what a person reads (``data.py``), and the same on every host
    whatever its ``sys.path`` (py-spy's short name depends on it)."""
    return f.short_file.rsplit("/", 1)[-1] or f.file.rsplit("/", 1)[-1]


def is_library(file: str) -> bool:
    return bool(_LIBRARY.search(file))


def _ref(f: rpc.StackFrame) -> FrameRef:
    return FrameRef(name=f.name, file=_base(f), line=f.line)


def frame_and_caller(thread: rpc.ThreadStack | None) -> tuple[FrameRef | None, FrameRef | None]:
    """The innermost Python frame and the innermost frame of the job's own code above it."""
    frames = _python_frames(thread) if thread else []
    if not frames:
        return None, None
    caller = next((f for f in frames[1:] if not is_library(f.file)), frames[-1] if len(frames) > 1 else None)
    return _ref(frames[0]), _ref(caller) if caller else None


def rank_label(ranks: Sequence[int | None], members: Sequence[str]) -> str:
    """``rank 3``, ``7 ranks (0-2,4-7)``, or ``pid 4242@node1`` for a process without a rank."""
    known = sorted(r for r in ranks if r is not None)
    if len(ranks) == 1:
        return f"rank {known[0]}" if known else f"pid {members[0]}"
    shown = compress(known)
    extra = len(ranks) - len(known)
    if extra:
        shown = (shown + ", " if shown else "") + f"{extra} without rank"
    return f"{len(ranks)} ranks ({shown})"


def compress(values: Sequence[int]) -> str:
    """``0,1,2,4,6,7`` -> ``0-2,4,6-7``."""
    out: list[str] = []
    vals = sorted(set(values))
    i = 0
    while i < len(vals):
        j = i
        while j + 1 < len(vals) and vals[j + 1] == vals[j] + 1:
            j += 1
        out.append(str(vals[i]) if i == j else f"{vals[i]}-{vals[j]}")
        i = j + 1
    return ",".join(out)


def _loop_frame(loop: tuple[str, ...]) -> FrameRef | None:
    """``name (file)`` of the innermost frame of a loop shape, as a FrameRef without a line."""
    if not loop:
        return None
    name, _, file = loop[-1].rpartition(" (")
    return FrameRef(name=name, file=file.rstrip(")"), line=0)


def _summary(
    label: str, frame: FrameRef | None, caller: FrameRef | None, active: int, size: int, progressing: bool
) -> str:
    if progressing:
        return f"{label} — progressing" + (f", in {frame.name} ({frame.file})" if frame else "")
    if frame is None:
        return f"{label} — no Python frames"
    where = f"{frame.name} ({frame.file}:{frame.line})"
    if active == 0:
        where += ", waiting"
    elif active == size:
        where += ", running"
    if caller is not None:
        where += f" ← {caller.file}:{caller.line}"
    return f"{label} — {where}"


def rank_state(rank: RankStacks) -> str:
    """``stuck`` / ``progressing`` / ``unknown`` / ``error`` (module docstring)."""
    good = [s for s in rank.snapshots if s.error is None]
    if not good:
        return ERROR
    if len(good) < 2:
        return UNKNOWN
    first = exact_of(main_thread(good[0]))
    return STUCK if all(exact_of(main_thread(s)) == first for s in good[1:]) else PROGRESSING


def cpu_pct(rank: RankStacks) -> float | None:
    good = [s for s in rank.snapshots if s.error is None and s.cpu_s is not None and s.taken_at is not None]
    if len(good) < 2:
        return None
    wall = float(good[-1].taken_at or 0) - float(good[0].taken_at or 0)
    if wall <= 0:
        return None
    return round(100.0 * (float(good[-1].cpu_s or 0) - float(good[0].cpu_s or 0)) / wall, 1)


def group_ranks(ranks: list[RankStacks]) -> list[StackGroup]:
    """Groups of ``ranks`` by shape, smallest first; sets each rank's ``state``, ``group`` and
    ``cpu_pct``, and marks the outlier groups (module docstring)."""
    by_shape: dict[tuple[str, ...], list[RankStacks]] = {}
    for r in ranks:
        r.state = rank_state(r)
        r.cpu_pct = cpu_pct(r)
        good = [s for s in r.snapshots if s.error is None]
        if not good:
            last = r.snapshots[-1] if r.snapshots else None
            r.error = last.error if last else "no snapshot"
            r.error_kind = last.error_kind if last else None
            continue
        main = main_thread(good[-1])
        key = (PROGRESSING, *loop_of(good)) if r.state == PROGRESSING else shape_of(main)
        by_shape.setdefault(key, []).append(r)
    ordered = sorted(
        by_shape.items(),
        key=lambda kv: (len(kv[1]), min((m.rank if m.rank is not None else 1 << 30) for m in kv[1])),
    )
    sizes = sorted((len(m) for _s, m in ordered), reverse=True)
    unique_largest = len(sizes) > 1 and sizes[0] > sizes[1]
    groups = []
    for gid, (shape, members) in enumerate(ordered):
        mains = [main_thread([s for s in m.snapshots if s.error is None][-1]) for m in members]
        frame, caller = frame_and_caller(mains[0])
        active = sum(1 for t in mains if t is not None and t.active)
        labels = [f"{m.pid}@{m.hostname}" for m in members]
        rank_numbers = [m.rank for m in members]
        if shape[:1] == (PROGRESSING,):
            frame, caller = _loop_frame(shape[1:]), None
        states: dict[str, int] = {}
        for m in members:
            m.group = gid
            states[m.state] = states.get(m.state, 0) + 1
        groups.append(
            StackGroup(
                id=gid,
                size=len(members),
                ranks=rank_numbers,
                members=[f"{m.host}:{m.pid}" for m in members],
                summary=_summary(
                    rank_label(rank_numbers, labels),
                    frame,
                    caller,
                    active,
                    len(members),
                    shape[:1] == (PROGRESSING,),
                ),
                frame=frame,
                caller=caller,
                shape=list(shape),
                active=active,
                outlier=unique_largest and len(members) < sizes[0],
                states=states,
            )
        )
    return groups


def verdict(ranks: Sequence[RankStacks], groups: Sequence[StackGroup], samples: int) -> str:
    """One sentence: the outliers (or one shape), then what the samples say."""
    seen = [r for r in ranks if r.error is None]
    parts: list[str] = []
    if not seen:
        return "no stack could be read" + (f" ({ranks[0].error})" if ranks and ranks[0].error else "")
    outliers = [g for g in groups if g.outlier]
    if len(groups) == 1:
        parts.append(f"all {len(seen)} ranks in one place")
    elif outliers:
        who = ", ".join(g.summary.split(" — ")[0] for g in outliers)
        parts.append(f"outlier: {who} (not where the other {groups[-1].size} ranks are)")
    else:
        parts.append(f"{len(groups)} equally large groups: no single outlier")
    if samples > 1:
        stuck = [r for r in seen if r.state == STUCK]
        if not stuck:
            parts.append(f"every rank is progressing over {samples} samples")
        elif len(stuck) == len(seen):
            parts.append(f"every rank is stuck (same stack in all {samples} samples)")
        else:
            known = [r.rank for r in stuck if r.rank is not None]
            parts.append(f"stuck: {rank_label([r.rank for r in stuck], [str(r.pid) for r in stuck])}")
            if known:
                parts[-1] = f"stuck: ranks {compress(known)}" if len(stuck) > 1 else f"stuck: rank {known[0]}"
    if len(seen) < len(ranks):
        parts.append(f"{len(ranks) - len(seen)} ranks could not be read")
    return "; ".join(parts)


def build_report(
    ranks: list[RankStacks],
    *,
    target: dict[str, object],
    samples: int,
    interval_s: float,
    hosts: list[dict[str, object]],
    errors: list[dict[str, object]],
) -> StacksReport:
    """Group ``ranks`` and assemble the document (sorted by rank, then host and pid)."""
    ranks.sort(key=lambda r: (r.rank if r.rank is not None else 1 << 30, r.host, r.pid))
    groups = group_ranks(ranks)
    outlier_groups = [g for g in groups if g.outlier]
    states: dict[str, int] = {}
    for r in ranks:
        states[r.state] = states.get(r.state, 0) + 1
    return StacksReport(
        target=target,
        samples=samples,
        interval_s=interval_s,
        hosts=hosts,
        ranks=ranks,
        groups=groups,
        outliers=[r for g in outlier_groups for r in g.ranks],
        outlier_members=[m for g in outlier_groups for m in g.members],
        states=states,
        verdict=verdict(ranks, groups, samples),
        errors=errors,
    )


prime_structs(globals())
