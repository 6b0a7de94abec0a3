"""The process registry: Dynolog's LibkinetoConfigManager/JobRegistry semantics (docs/protocol.md §2).

Why it exists: every traced process polls with ``(job id, pid chain, type)``; the daemon must
remember it, hand it a pending config exactly once (only when the ACTIVITIES bit is set), and
forget it when it stops polling. Trace requests (dyno's ``setKinetOnDemandRequest`` and
``kscopeTrace``) match registered processes by job and ancestor pids, in Dynolog's map order,
with its limit/busy rules - except that launchers (a registered process that is the ancestor
of another registered process, e.g. torchrun's agent) are not trace targets by default, so a
limit of 3 means three ranks, not two launchers and a rank (Dynolog issue #430).

Thread safety: one lock; the IPC thread polls, RPC threads trigger and list. /proc is read
outside the lock, once per new process.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import msgspec

from kinetoscope.daemon import procinfo
from kinetoscope.daemon.logsetup import RateLimitedLogger
from kinetoscope.daemon.procinfo import ProcInfo
from kinetoscope.protocol import jobident
from kinetoscope.protocol.jobident import JobIdentity
from kinetoscope.protocol.wire import CONFIG_ACTIVITIES

log = logging.getLogger("kinetoscope.daemon.registry")

ProcessKey = tuple[str, frozenset[int]]
ContextKey = tuple[str, int, int]  # (job, gpu, pid) of one "ctxt" registration

# Memory bounds against clients that invent keys (issue 16): a real host has a few hundred
# polling processes and a few contexts per GPU. Beyond these, the least recently seen goes.
MAX_PROCESSES = 16384
MAX_CONTEXTS = 4096
# Per user (the sender's uid, from the kernel): one local user must not fill the registry and
# slow every other job's polls (issue 32: 16,384 fake processes x 64 pids in seconds). Beyond
# it, that user's *new* keys are not registered (its registered processes keep being served).
MAX_PROCESSES_PER_UID = 1024
# Kineto sends its own pid and at most 10 ancestors (docs/protocol.md §1.3).
MAX_PIDS_PER_PROCESS = 16
# "registered process" lines per minute before they are counted instead of logged.
REGISTER_LOG_BURST = 200

# Outcomes of matching one process against a trace request.
TRIGGERED = "triggered"
BUSY = "busy"  # a previous config has not been picked up yet (Dynolog's meaning)
LAUNCHER = "launcher"  # ancestor of another registered process; not a target by default
LIMIT = "limit"  # matched after the process limit was reached
UNREACHABLE = "unreachable"  # refused by the caller's check (e.g. cannot write the trace root)
# How long a queued config is held back from a process whose previous iteration trace (from this
# daemon) has not written its file yet; after that it is delivered anyway (Kineto may have dropped
# the earlier config when it got it, and then nothing else would ever end the wait).
HOLD_BEHIND_UNFINISHED_S = 300.0


@dataclass(eq=False)
class PendingConfig:
    """A config waiting for (or handed to) one process; shared with the trace book.

    ``text`` is the wrapped config (``wrap_with_trace_id``), without the ``"\\n"`` appended on
    delivery. ``delivered_at`` (wall clock) is set by the poll that hands it out.
    """

    text: str
    trace_id: str
    created_at: float = field(default_factory=time.time)
    delivered_at: float | None = None
    # An iteration trace's final file: until it exists the trace has not finished in the process
    # (it may still wait for its start iteration), and Kineto ignores any new config meanwhile
    # ("another profile request is pending"). None for duration traces and dyno configs.
    ends_with: str | None = None
    written: bool = False  # ``ends_with`` was seen on disk: the trace has finished
    # The trace id of the unfinished trace this config is held back behind (not delivered yet)
    held_by: str | None = None


def _unfinished(delivered: PendingConfig | None, wall: float) -> PendingConfig | None:
    """``delivered`` when it is an iteration trace the process has not finished: delivered less
    than ``HOLD_BEHIND_UNFINISHED_S`` ago and its final file not seen yet."""
    if delivered is None or delivered.ends_with is None or delivered.delivered_at is None:
        return None
    if delivered.written or wall - delivered.delivered_at >= HOLD_BEHIND_UNFINISHED_S:
        return None
    return delivered


def _look_for_file(proc: Process | None, config_type: int) -> None:
    """Before a poll takes the lock: when a queued config waits behind ``proc``'s unfinished
    iteration trace, look for that trace's file (outside the lock: a trace root on a network
    filesystem can be slow to answer, and every rank's poll waits for the lock)."""
    if proc is None or proc.pending is None or not config_type & CONFIG_ACTIVITIES:
        return
    earlier = _unfinished(proc.delivered, time.time())
    if earlier is not None and earlier.ends_with is not None and os.path.exists(earlier.ends_with):
        earlier.written = True


@dataclass(eq=False)
class Process:
    """One registered libkineto client, keyed like Dynolog by (job id, set of its pids)."""

    job_id: str
    pids: tuple[int, ...]  # as received: leaf first, then ancestors (client's pid namespace)
    info: ProcInfo | None  # /proc view, read once; None if not visible from the daemon
    first_seen: float  # monotonic
    last_poll: float  # monotonic
    polls: int = 0
    last_type: int = 0
    pending: PendingConfig | None = None
    delivered: PendingConfig | None = None  # the last config handed to the process
    uid: int | None = None  # the sender's uid as the kernel reported it (SO_PASSCRED)

    @property
    def pid(self) -> int:
        return self.pids[0]

    @property
    def key(self) -> ProcessKey:
        return (self.job_id, frozenset(self.pids))

    @property
    def map_order(self) -> tuple[str, tuple[int, ...]]:
        """Dynolog iterates ``map<string, map<set<int32>, ...>>``: job string, then sorted pids."""
        return (self.job_id, tuple(sorted(set(self.pids))))

    @property
    def identity(self) -> JobIdentity:
        """The job this process belongs to (kinetoscope.protocol.jobident); never Kineto's ``0``."""
        ident = self.info.job if self.info is not None else None
        if ident is None:
            return jobident.fallback_identity(self.job_id, self.pid)
        if self.job_id not in ("0", "") and ident.source != jobident.SLURM:
            # libkineto's job id is SLURM_JOB_ID's number: Slurm precedence, even when the
            # environment could not be read
            return msgspec.structs.replace(ident, id=self.job_id, source=jobident.SLURM, owner=None)
        return ident

    def in_job(self, job: str) -> bool:
        """Whether ``job`` names this process's job: its identity or Kineto's job id."""
        return job == self.job_id or job == self.identity.id

    def matches_pids(self, wanted: set[int]) -> bool:
        """Whether one of ``wanted`` is this process or an ancestor. A process in another pid
        namespace (a container) is matched by its host pids (the ones ``ps`` shows on the host):
        its own small pids would collide with unrelated host processes."""
        info = self.info
        if info is not None and info.in_other_pid_ns:
            return info.pid in wanted or not wanted.isdisjoint(info.host_ancestors)
        return not wanted.isdisjoint(self.pids)

    def alive(self) -> bool | None:
        """Whether the process still runs (pid + start time); None when /proc cannot tell."""
        if self.info is None:
            return None
        return procinfo.is_alive(self.info.pid, self.info.start_time)


@dataclass
class Match:
    """A process matched by a trace request and what happened to it."""

    process: Process
    outcome: str  # TRIGGERED | BUSY | LAUNCHER | LIMIT | UNREACHABLE
    pending: PendingConfig | None = None
    is_launcher: bool = False
    reason: str | None = None  # UNREACHABLE: why (from the caller's check)


InfoReader = Callable[[int, int | None], ProcInfo | None]


def default_info_reader(leaf_pid: int, sender_pid: int | None) -> ProcInfo | None:
    """Read /proc for the sender as the kernel identified it (SO_PASSCRED), else the leaf pid.

    A client in another pid namespace (a container) reports pids of *its* namespace; the
    kernel-supplied sender pid is translated into ours, so /proc describes the right process.
    """
    return procinfo.read_proc_info(sender_pid if sender_pid else leaf_pid)


def _launcher_keys(procs: Iterable[Process]) -> set[ProcessKey]:
    """Keys of processes whose leaf pid is an ancestor of another registered process.

    Pids are only comparable within one job and one pid namespace (the namespace is known
    when the daemon can see the process; unknown counts as one namespace).
    """
    procs = list(procs)
    ancestors: set[tuple[str, str | None, int]] = set()
    for p in procs:
        ns = p.info.pid_ns if p.info else None
        for a in p.pids[1:]:
            ancestors.add((p.job_id, ns, a))
    out: set[ProcessKey] = set()
    for p in procs:
        ns = p.info.pid_ns if p.info else None
        if (p.job_id, ns, p.pid) in ancestors:
            out.add(p.key)
    return out


SUMMARY_ITEMS = 20  # jobs, and pids per job, named in a "nothing matched" answer


def _some(pids: list[int]) -> str:
    shown = ", ".join(map(str, pids[:SUMMARY_ITEMS]))
    return shown + (f" and {len(pids) - SUMMARY_ITEMS} more" if len(pids) > SUMMARY_ITEMS else "")


class Registry:
    """Registered processes, pending configs and per-GPU contexts. See module docstring."""

    def __init__(
        self,
        gc_timeout_s: float = 60.0,
        info_reader: InfoReader = default_info_reader,
        clock: Callable[[], float] = time.monotonic,
        max_processes: int = MAX_PROCESSES,
        max_contexts: int = MAX_CONTEXTS,
        max_per_uid: int = MAX_PROCESSES_PER_UID,
    ) -> None:
        self.gc_timeout_s = gc_timeout_s
        self._read_info = info_reader
        self._clock = clock
        self._lock = threading.Lock()
        self.max_processes = max_processes
        self.max_contexts = max_contexts
        self.max_per_uid = max_per_uid
        self._per_uid: dict[int | None, int] = {}
        self.refused = 0  # new registrations refused by the per-uid limit
        # Least recently polled first (every poll moves its process to the end).
        self._procs: OrderedDict[ProcessKey, Process] = OrderedDict()
        # "ctxt" registrations, least recently touched first -> when; and per (job, gpu) counts.
        self._contexts: OrderedDict[ContextKey, float] = OrderedDict()
        self._context_counts: dict[tuple[str, int], int] = {}
        self._rl = RateLimitedLogger(log, burst=REGISTER_LOG_BURST)
        self._rl_limit = RateLimitedLogger(log)  # per-uid refusals: 5 lines a minute
        self.evicted = 0
        self.polls = 0
        self.delivered = 0

    # ----------------------------------------------------------------- IPC side
    def poll(
        self,
        job_id: int,
        pids: tuple[int, ...],
        config_type: int,
        sender_pid: int | None = None,
        sender_uid: int | None = None,
    ) -> str:
        """Handle one "req": register or refresh, return the reply text ("" = nothing pending).

        Spec §2.2: the pending config is released only if ``config_type`` has the ACTIVITIES
        bit (2); any other bits are ignored (torch 2.13 sends 3 idle / 1 busy, kineto HEAD 2/0).
        The returned text already carries Dynolog's trailing ``"\\n"``.
        """
        key: ProcessKey = (str(job_id), frozenset(pids))
        now = self._clock()
        _look_for_file(self._procs.get(key), config_type)  # an unlocked look-up: only a hint
        with self._lock:
            proc = self._procs.get(key)
            if proc is not None:
                return self._serve(proc, config_type, now)
            over = self._per_uid.get(sender_uid, 0) >= self.max_per_uid
            self.refused += over
        if over:
            self._rl_limit.warning(
                "uid_limit", "uid %s has %d registered processes (the per-user limit, --max-processes-per-uid): "
                "not registering pid %d (job %s)", sender_uid, self.max_per_uid, pids[0], job_id,
            )  # fmt: skip
            return ""
        # New process: read /proc without holding the lock (the only slow step, done once).
        info = self._read_info(pids[0], sender_pid)
        with self._lock:
            proc = self._procs.get(key)
            if proc is None:
                if self._per_uid.get(sender_uid, 0) >= self.max_per_uid:
                    self.refused += 1
                    return ""
                proc = Process(
                    job_id=key[0], pids=tuple(pids), info=info, first_seen=now, last_poll=now, uid=sender_uid
                )
                self._procs[key] = proc
                self._per_uid[sender_uid] = self._per_uid.get(sender_uid, 0) + 1
                new = True
                evicted = self._evict_processes()
            else:
                new = False
                evicted = None
            reply = self._serve(proc, config_type, now)
        if evicted is not None:
            self._rl.warning(
                "evict", "more than %d registered processes: forgot process %d (job %s), the least recently polled",
                self.max_processes, evicted.pid, evicted.job_id,
            )  # fmt: skip
        if new:
            self._rl.info(
                "registered",
                "registered process %d (job %s, ancestors %s, rank %s): %s",
                proc.pid,
                proc.identity.id,
                list(proc.pids[1:]),
                info.rank if info else None,
                (info.cmdline or "")[:200] if info else "<not visible in /proc>",
            )
        return reply

    def _evict_processes(self) -> Process | None:
        """Keep at most ``max_processes`` (caller holds the lock); returns the one dropped."""
        if len(self._procs) <= self.max_processes:
            return None
        _key, oldest = self._procs.popitem(last=False)
        self._forget_uid(oldest)
        self.evicted += 1
        return oldest

    def _forget_uid(self, proc: Process) -> None:
        left = self._per_uid.get(proc.uid, 0) - 1
        if left > 0:
            self._per_uid[proc.uid] = left
        else:
            self._per_uid.pop(proc.uid, None)

    def _serve(self, proc: Process, config_type: int, now: float) -> str:
        self._procs.move_to_end(proc.key)
        proc.last_poll = now
        proc.polls += 1
        proc.last_type = config_type
        self.polls += 1
        pending = proc.pending
        if pending is None or not config_type & CONFIG_ACTIVITIES:
            return ""
        wall = time.time()
        unfinished = _unfinished(proc.delivered, wall)
        if unfinished is not None:
            if pending.held_by is None:
                log.info(
                    "holding trace %s for pid %d: its iteration trace %s has not finished (Kineto would ignore "
                    "a new config until it does)",
                    pending.trace_id,
                    proc.pid,
                    unfinished.trace_id,
                )
            pending.held_by = unfinished.trace_id
            return ""
        proc.pending = None
        proc.delivered = pending
        pending.delivered_at = wall
        pending.held_by = None
        self.delivered += 1
        return pending.text + "\n"

    def register_context(self, job_id: int, gpu: int, pid: int) -> int:
        """A "ctxt" message: number of distinct pids registered for (job, gpu) (docs/protocol.md §2.5).

        At most ``max_contexts`` registrations are kept; beyond, the least recently touched
        one is dropped (Dynolog keeps them all, forever).
        """
        job = str(job_id)
        key = (job, gpu, pid)
        with self._lock:
            if key in self._contexts:
                self._contexts.move_to_end(key)
            else:
                self._context_counts[(job, gpu)] = self._context_counts.get((job, gpu), 0) + 1
            self._contexts[key] = self._clock()
            while len(self._contexts) > self.max_contexts:
                self._drop_context(next(iter(self._contexts)))
            return self._context_counts.get((job, gpu), 0)

    def _drop_context(self, key: ContextKey) -> None:
        del self._contexts[key]
        count_key = (key[0], key[1])
        left = self._context_counts[count_key] - 1
        if left:
            self._context_counts[count_key] = left
        else:
            del self._context_counts[count_key]

    def context_count(self) -> int:
        """How many "ctxt" registrations are kept (for tests and metrics)."""
        with self._lock:
            return len(self._contexts)

    def gc(self) -> list[Process]:
        """Drop processes that have not polled for ``gc_timeout_s`` (their pending config too).

        A context registration goes after the same timeout unless its pid belongs to a
        registered process of its job (Dynolog would keep them all forever).
        """
        now = self._clock()
        cutoff = now - self.gc_timeout_s
        with self._lock:
            dead = [p for p in self._procs.values() if p.last_poll < cutoff]
            for p in dead:
                del self._procs[p.key]
                self._forget_uid(p)
            live = {(p.job_id, pid) for p in self._procs.values() for pid in p.pids}
            stale = [
                k for k, touched in self._contexts.items() if touched < cutoff and (k[0], k[2]) not in live
            ]
            for k in stale:
                self._drop_context(k)
        return dead

    # ----------------------------------------------------------------- RPC side
    def snapshot(self, job_id: str | None = None) -> list[tuple[Process, bool]]:
        """(process, is_launcher) in Dynolog's map order, optionally for one job only.

        The lock is held only to copy the list: sorting and finding launchers happen outside
        it, so a listing never makes the IPC thread (every rank's poll) wait for them."""
        with self._lock:
            everyone = list(self._procs.values())
        launchers = _launcher_keys(everyone)
        procs = [p for p in everyone if job_id is None or p.in_job(job_id)]
        procs.sort(key=lambda p: p.map_order)
        return [(p, p.key in launchers) for p in procs]

    def __len__(self) -> int:
        with self._lock:
            return len(self._procs)

    def _launcher_keys(self) -> set[ProcessKey]:
        return _launcher_keys(self._procs.values())

    def trigger(
        self,
        *,
        job_id: str | None,
        pids: Iterable[int],
        limit: int | None,
        include_launchers: bool,
        make_config: Callable[[Process], PendingConfig],
        refuse: Callable[[Process], str | None] | None = None,
    ) -> list[Match]:
        """Match and queue configs atomically (docs/protocol.md §2.3), returning every match in map order.

        * ``job_id`` None matches every job (kscope); a string matches that job only (dyno).
        * ``pids`` empty or ``{0}`` matches all processes; otherwise a process matches if any of
          its pids (leaf or ancestor) is in ``pids``.
        * ``limit`` counts newly triggered processes only; None or negative = unlimited.
        * A process with a config still pending is BUSY (does not consume the limit).
        * Launchers are LAUNCHER (neither triggered nor busy, no limit slot) unless
          ``include_launchers``, in which case they are ordinary targets, as in Dynolog.
        * ``refuse(p)``, when given, returns why a target cannot be traced (UNREACHABLE), or None.
        """
        wanted = set(pids)
        trace_all = not wanted or wanted == {0}
        unlimited = limit is None or limit < 0
        out: list[Match] = []
        triggered = 0
        with self._lock:
            launchers = self._launcher_keys()
            procs = sorted(
                (p for p in self._procs.values() if job_id is None or p.in_job(job_id)),
                key=lambda p: p.map_order,
            )
            for p in procs:
                if not trace_all and not p.matches_pids(wanted):
                    continue
                is_launcher = p.key in launchers
                refused = refuse(p) if refuse is not None else None
                if is_launcher and not include_launchers:
                    out.append(Match(p, LAUNCHER, is_launcher=True))
                elif refused is not None:
                    out.append(Match(p, UNREACHABLE, is_launcher=is_launcher, reason=refused))
                elif not unlimited and triggered >= limit:  # type: ignore[operator]
                    out.append(Match(p, LIMIT, is_launcher=is_launcher))
                elif p.pending is not None:
                    out.append(Match(p, BUSY, is_launcher=is_launcher))
                else:
                    p.pending = make_config(p)
                    triggered += 1
                    out.append(Match(p, TRIGGERED, pending=p.pending, is_launcher=is_launcher))
        return out

    def requeue(self, proc: Process, make_config: Callable[[], PendingConfig]) -> PendingConfig | None:
        """Queue a config for ``proc`` again (a trace its Kineto dropped: handlers), unless one is
        already pending or the process is no longer registered. Returns the new pending config."""
        with self._lock:
            if proc.pending is not None or self._procs.get(proc.key) is not proc:
                return None
            proc.pending = make_config()
            return proc.pending

    def candidates(
        self, *, job_id: str | None, pids: Iterable[int], include_launchers: bool
    ) -> list[Process]:
        """The processes ``trigger`` would consider targets (for preparing directories first)."""
        wanted = set(pids)
        trace_all = not wanted or wanted == {0}
        with self._lock:
            launchers = self._launcher_keys()
            return [
                p
                for p in self._procs.values()
                if (job_id is None or p.in_job(job_id))
                and (trace_all or p.matches_pids(wanted))
                and (include_launchers or p.key not in launchers)
            ]

    def summary(self) -> str:
        """One line for "nothing matched" answers: what *is* registered (Dynolog issue #265)."""
        snap = self.snapshot()
        if not snap:
            return "no processes registered (are they started with KINETO_USE_DAEMON=1 and polling?)"
        jobs: dict[str, list[int]] = {}
        n_launchers = 0
        for p, is_launcher in snap:
            jobs.setdefault(p.identity.id, []).append(p.pid)
            n_launchers += is_launcher
        parts = [f"job {j}: pids {_some(sorted(ps))}" for j, ps in sorted(jobs.items())[:SUMMARY_ITEMS]]
        if len(jobs) > SUMMARY_ITEMS:
            parts.append(f"and {len(jobs) - SUMMARY_ITEMS} more jobs")
        return f"{len(snap)} processes registered ({n_launchers} launchers); " + "; ".join(parts)
