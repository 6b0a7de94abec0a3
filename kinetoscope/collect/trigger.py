"""Trigger an on-demand trace on many hosts, wait for the files, write the manifest.

The library behind ``kscope trace``. Every host's daemon is asked concurrently (threads) with the
kscope RPC extension ``kscopeTrace``; the daemon matches its registered processes, gives each a
per-rank ``ACTIVITIES_LOG_FILE`` under ``<output_dir>/<trace_id>/`` and queues the Kineto config.
``wait_for_trace`` then polls ``kscopeTraceStatus`` until every triggered process's file is
complete JSON, or the deadline passes, in which case each missing file gets its likely cause.

Nothing here raises for a per-host problem: results carry :class:`TraceProblem` entries whose
``kind`` is stable (``--json``), and ``TraceResult.ok`` says whether everything worked.
"""

from __future__ import annotations

import contextlib
import getpass
import os
import re
import secrets
import socket
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import msgspec

from kinetoscope.collect.client import DEFAULT_TIMEOUT_S, DaemonClient, DaemonError, HostAddress, parse_hosts
from kinetoscope.collect.window_fit import fit_roundup
from kinetoscope.errors import UsageError
from kinetoscope.protocol import jobident, rpc
from kinetoscope.protocol.kineto_config import build_config
from kinetoscope.protocol.manifest import Manifest, ManifestFile, dumps_manifest, utc_now_iso, write_manifest
from kinetoscope.protocol.structinfo import prime_structs
from kinetoscope.protocol.trace_options import OPTION_FIELDS, options_fields
from kinetoscope.protocol.trace_options import TraceOptions as WireOptions
from kinetoscope.protocol.tracefile import check_file

if TYPE_CHECKING:
    from kinetoscope.store.storage import StoredObject

TRACE_ID_RE = re.compile(r"\A[A-Za-z0-9][A-Za-z0-9-]{0,63}\Z")
_JOB_ID_RE = re.compile(r"^\s*([+-]?\d+)(.*)$")
_LOCAL_NAMES = {"localhost", "127.0.0.1", "::1", "ip6-localhost"}


# ---------------------------------------------------------------------------------------
# Request
# ---------------------------------------------------------------------------------------
class TraceOptions(WireOptions, omit_defaults=True, kw_only=True, frozen=True):
    """What to record (:class:`kinetoscope.protocol.trace_options.TraceOptions`, the one
    definition), plus what only the trigger uses and never sends: ``align``, ``steps_per_s``,
    ``wait_s``. ``include_launchers`` is False here ("not asked"): the daemon's own default."""

    include_launchers: bool = False
    # Iteration traces of several processes: pick an --iteration-roundup that starts every rank at
    # the same iteration (align_roundup) unless one is given; False = each rank's next step.
    align: bool = True
    # The job's step rate when known (e.g. from an earlier analysis in the catalog): a tighter
    # alignment roundup than the assumed ALIGN_STEPS_PER_S. Not sent to the daemons.
    steps_per_s: float | None = None
    # How long the caller will wait for the files (--wait --timeout): the alignment roundup is
    # chosen so the trace is expected to end well inside it (collect.window_fit). Not sent.
    wait_s: float | None = None

    def validate(self) -> None:
        """Raise UsageError, in the CLI's words (its flag names), for a request to refuse."""
        problem = _option_problem(self)
        if problem:
            raise UsageError(problem)

    def wire(self) -> WireOptions:
        """The options as sent (``kscopeTrace``): iteration mode names its roundup (1 unless
        given); the trigger-only fields are left out."""
        fields = {name: getattr(self, name) for name in OPTION_FIELDS}
        if self.iterations is not None:
            fields["iteration_roundup"] = self.iteration_roundup or 1
        else:
            fields["iteration_roundup"] = None
        fields["include_launchers"] = True if self.include_launchers else None
        return WireOptions(**fields)

    def config_text(self, log_file: str | None) -> str:
        """The Kineto config ``dyno gputrace`` would send for these options (docs/protocol.md §4.2), built by the
        daemon's own builder so trigger and daemon cannot disagree. ``log_file=None`` leaves out the
        per-process ``ACTIVITIES_LOG_FILE`` line (the part every process of a request shares)."""
        self.validate()
        return build_config(self.wire(), log_file=log_file)

    def rpc_fields(self) -> dict[str, Any]:
        """The JSON fields these options add to a ``kscopeTrace`` request."""
        return options_fields(self.wire())

    def replace(self, **changes: Any) -> TraceOptions:
        """A copy with ``changes`` (the options are frozen)."""
        return msgspec.structs.replace(self, **changes)


def _positive(flag: str, value: int | None, what: str) -> str | None:
    return f"{flag} must be {what}, got {value}" if value is not None and value <= 0 else None


def _option_problem(o: TraceOptions) -> str | None:
    """Why ``o`` cannot be sent (in the CLI's words), or None."""
    if (o.duration_ms is None) == (o.iterations is None):
        return "choose what to record: either --duration-ms N or --iterations N"
    if o.iteration_roundup is not None and o.iterations is None:
        return "--iteration-roundup only applies to --iterations"
    if o.iteration_roundup is not None and o.iteration_roundup > 0 and not o.align:
        return "--no-align and --iteration-roundup contradict each other; give one"
    if not o.align and o.iterations is None:
        return "--no-align only applies to --iterations (duration traces start by time)"
    if o.profile_memory and o.iterations is not None:
        return (
            "--profile-memory needs --duration-ms: Kineto's memory profiling is time-based "
            "(PROFILE_MEMORY_DURATION_MSECS), and dyno rejects it with --iterations too"
        )
    return (
        _positive("--duration-ms", o.duration_ms, "a positive number of milliseconds")
        or _positive("--iterations", o.iterations, "a positive number")
        or _positive("--iteration-roundup", o.iteration_roundup, "at least 1")
        or _positive("--process-limit", o.process_limit, "at least 1")
    )


@dataclass(frozen=True)
class Target:
    """Which processes: a job id, pids (a pid also matches its descendants), or all."""

    job_id: int | str | None = None  # Kineto/Slurm job id, or a job identity (protocol/jobident.py)
    job_id_text: str | None = None  # as the user typed it (e.g. a Slurm array id "36199_0")
    pids: tuple[int, ...] = ()
    all: bool = False

    def validate(self) -> None:
        chosen = sum([self.job_id is not None, bool(self.pids), self.all])
        if chosen != 1:
            raise UsageError(
                "choose which processes to trace: exactly one of --job-id ID, --pids P[,P...] or --all"
            )

    def rpc_fields(self) -> dict[str, Any]:
        if self.all:
            return {"all": True}
        if self.pids:
            return {"pids": list(self.pids)}
        return {"job_id": self.job_id}

    def describe(self) -> str:
        if self.all:
            return "is registered"
        if self.pids:
            word = "pid" if len(self.pids) == 1 else "pids"
            return f"has {word} {','.join(map(str, self.pids))} (or descends from it)"
        shown = self.job_id_text if self.job_id_text is not None else str(self.job_id)
        if self.job_id_text is not None and self.job_id_text.strip() != str(self.job_id):
            shown = f"{self.job_id} (from {self.job_id_text!r})"
        return f"has job id {shown}"


def parse_job_id(text: str) -> tuple[int | str, str | None]:
    """A job id as Kineto sees it, and a note when it differs from what the user typed.

    Kineto reads ``SLURM_JOB_ID`` with ``strtoll``: only the leading number counts, so a Slurm
    array id ``36199_0`` is registered as job 36199 (docs/protocol.md §1.3). A job identity of
    another launcher (``torchrun:...``, ``k8s:ns:name``, ``launcher:...``: docs/deploy.md) is
    passed as it is."""
    if ":" in text and jobident.valid_identity(text.strip()):
        return text.strip(), None
    match = _JOB_ID_RE.match(text)
    if not match:
        raise UsageError(
            f"--job-id {text!r}: must start with a number (Kineto registers the numeric prefix of "
            "SLURM_JOB_ID, e.g. 36199 for the Slurm array id 36199_0) or be a job identity as "
            "`kscope jobs` shows it (torchrun:..., k8s:..., launcher:...)"
        )
    value = int(match.group(1))
    if value < 0:
        raise UsageError(f"--job-id {text!r}: job ids are not negative")
    if value >= 2**63:
        raise UsageError(f"--job-id {text!r}: larger than Kineto's 64-bit job id")
    rest = match.group(2).strip()
    if not rest:
        return value, None
    if re.fullmatch(r"_\d+", rest) or re.fullmatch(r"_\[.*\]", rest):
        note = (
            f"job id {text.strip()} looks like a Slurm array task; Kineto registers the numeric prefix of "
            f"SLURM_JOB_ID, so this traces job {value} (every process whose SLURM_JOB_ID starts with "
            f"{value}_ also matches)"
        )
    else:
        note = (
            f"job id {text.strip()!r}: Kineto registers only its numeric prefix, so this traces job {value}"
        )
    return value, note


def parse_pids(text: str) -> tuple[int, ...]:
    pids: list[int] = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        if not part.isdigit() or int(part) <= 0 or int(part) >= 2**31:
            raise UsageError(f"--pids {text!r}: {part!r} is not a process id")
        if int(part) not in pids:
            pids.append(int(part))
    if not pids:
        raise UsageError("--pids needs at least one process id")
    return tuple(pids)


def new_trace_id(now: datetime | None = None) -> str:
    """``kst-YYYYmmdd-HHMMSS-xxxx`` (UTC; letters, digits and '-' only)."""
    now = now or datetime.now(timezone.utc)
    return f"kst-{now:%Y%m%d-%H%M%S}-{secrets.token_hex(2)}"


def validate_trace_id(trace_id: str) -> str:
    if not TRACE_ID_RE.match(trace_id):
        raise UsageError(
            f"trace id {trace_id!r}: use 1-64 letters, digits and '-' (it becomes a folder name), "
            "starting with a letter or digit"
        )
    return trace_id


@dataclass(frozen=True)
class TraceRequest:
    """One trace request, whole: which daemons, which processes, what to record, where, and its
    name. Built once by whoever asks (``kscope trace``, the web app, the demo; usually with
    :func:`parse_trace_request`) and passed whole to :func:`trigger_trace`.

    ``output_dir`` None lets each daemon use its own trace root; ``trace_id`` None gets a
    generated ``kst-...`` id. How long to wait, where to store and whether to analyse are the
    caller's business after the trigger (``wait_for_trace``, ``kinetoscope.collect.deliver``)."""

    hosts: tuple[HostAddress, ...]
    target: Target
    options: TraceOptions
    output_dir: str | None = None
    trace_id: str | None = None

    def validate(self) -> None:
        """Raise UsageError for a request no daemon should see (the same rules as the CLI)."""
        self.target.validate()
        self.options.validate()
        if self.trace_id:
            validate_trace_id(self.trace_id)


def parse_trace_request(
    *,
    hosts: list[str] | None,
    job_id: str | None = None,
    pids: str | None = None,
    all: bool = False,
    options: TraceOptions,
    output_dir: str | None = None,
    trace_id: str | None = None,
) -> tuple[TraceRequest, list[str]]:
    """A validated :class:`TraceRequest` from what a person typed (``--host``, ``--job-id``,
    ``--pids``, ``--all``; a form's fields), and the notes to show (e.g. a Slurm array id traced
    by its numeric prefix). Raises UsageError with the reason otherwise."""
    addresses = parse_hosts(hosts or None)
    notes: list[str] = []
    jid: int | str | None = None
    if job_id is not None:
        jid, note = parse_job_id(job_id)
        if note:
            notes.append(note)
    target = Target(
        job_id=jid, job_id_text=job_id, pids=parse_pids(pids) if pids is not None else (), all=all
    )
    request = TraceRequest(tuple(addresses), target, options, output_dir=output_dir, trace_id=trace_id)
    request.validate()
    return request, notes


# ---------------------------------------------------------------------------------------
# Results
# ---------------------------------------------------------------------------------------
@dataclass
class MatchedProcess:
    host: str  # daemon address as given (host:port)
    hostname: str  # the daemon's own host name
    pid: int
    rank: int | None
    local_rank: int | None
    world_size: int | None
    job_id: str | None
    cmdline: str
    path: str | None  # where Kineto will write (pid inserted); None if not triggered
    triggered: bool
    busy: bool
    is_launcher: bool = False
    reason: str | None = None  # why not triggered: busy | launcher | limit (daemon's words)
    host_pid: int | None = None  # the daemon's view of ``pid`` (differs in a container)
    container_pid: int | None = None  # set when the process is in another pid namespace
    job_source: str | None = None  # where the job identity came from (protocol/jobident.py)
    kineto_job_id: str | None = None
    pod: str | None = None
    namespace: str | None = None

    @property
    def state(self) -> str:
        """triggered | busy | launcher | limit | unreachable | not-triggered."""
        if self.triggered:
            return "triggered"
        if self.busy:
            return "busy"
        word = self.reason.split()[0].rstrip(":") if self.reason and self.reason.split() else ""
        if word in ("launcher", "limit", "unreachable"):
            return word
        return "not-triggered"

    def to_json(self) -> dict[str, Any]:
        return {
            "host": self.host,
            "pid": self.pid,
            "rank": self.rank,
            "job_id": self.job_id,
            "cmdline": self.cmdline,
            "hostname": self.hostname,
            "local_rank": self.local_rank,
            "world_size": self.world_size,
            "path": self.path,
            "triggered": self.triggered,
            "busy": self.busy,
            "state": self.state,
            "is_launcher": self.is_launcher,
            "host_pid": self.host_pid,
            "container_pid": self.container_pid,
            "job_source": self.job_source,
            "kineto_job_id": self.kineto_job_id,
            "pod": self.pod,
            "namespace": self.namespace,
        }


@dataclass
class TraceFile:
    host: str
    pid: int
    rank: int | None
    path: str
    bytes: int | None = None
    complete: bool = False
    exists: bool = False
    delivered: bool | None = None  # the process picked up the config
    alive: bool | None = None
    partial: bool = False  # Kineto's "<path>.tmp" exists (writing, or a failed trace)
    tmp_bytes: int | None = None  # size of that "<path>.tmp"
    last_poll_s_ago: float | None = None  # when the process last polled its daemon
    retries: int = 0  # times the daemon re-sent the config after Kineto dropped it
    # why what is at the path is not read ("symlink refused", "not a regular file: fifo", ...):
    # the daemon's or this machine's check; a refused file is never complete nor uploaded
    refused: str | None = None
    # not picked up yet because the process has not finished its earlier iteration trace (that
    # trace's id): the daemon holds the config back, as Kineto would ignore it meanwhile
    held_by: str | None = None
    # time.monotonic() at which the process picked up the config (from the daemon's
    # delivered_s_ago, else when this trigger first saw it delivered); None until then
    delivered_mono: float | None = field(default=None, repr=False)

    def to_json(self) -> dict[str, Any]:
        return {
            "host": self.host,
            "pid": self.pid,
            "rank": self.rank,
            "path": self.path,
            "bytes": self.bytes,
            "complete": self.complete,
            **({"refused": self.refused} if self.refused else {}),
        }


@dataclass
class TraceProblem:
    """Why something did not work. ``kind``: unreachable | no_answer | failed | no_match | busy |
    timeout | exited | stalled | refused | manifest (docs/collect.md)."""

    kind: str
    message: str
    host: str | None = None
    pid: int | None = None
    path: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v is not None}


R = TypeVar("R", bound=msgspec.Struct)


@dataclass
class HostAnswer(Generic[R]):
    """One host's typed answer (``reply``, a response struct of protocol/rpc.py) or its
    ``error``: exactly one is set."""

    address: HostAddress
    reply: R | None = None
    error: DaemonError | None = None


# Any function's answer: what progress displays (``OnAnswer``) see.
HostReply = HostAnswer[Any]


@dataclass
class FanoutTiming:
    """How the hosts of one request answered its ``kscopeTrace`` (``--json``: ``timing`` and
    ``hosts``). Seconds from the start of that fan-out (``time.monotonic``): ``first_answer_s``
    when the first daemon answered (None if none did), ``all_answered_s`` when the last host had
    answered or failed. ``listing_s``: the ``kscopeListProcesses`` fan-out that chose the aligned
    iteration roundup before it (None when none was needed)."""

    hosts: int = 0
    answered: int = 0
    failed: int = 0
    first_answer_s: float | None = None
    all_answered_s: float | None = None
    listing_s: float | None = None

    def timing_json(self) -> dict[str, float | None]:
        return {
            "first_answer_s": _round_s(self.first_answer_s),
            "all_answered_s": _round_s(self.all_answered_s),
            "listing_s": _round_s(self.listing_s),
        }

    def hosts_json(self) -> dict[str, int]:
        return {"total": self.hosts, "answered": self.answered, "failed": self.failed}


def _round_s(value: float | None) -> float | None:
    return None if value is None else round(value, 4)


# Called from the fan-out's worker threads as each host answers or fails: (phase, reply), phase
# "list" (the alignment listing) or "trace". Keep it cheap: it runs once per host.
OnAnswer = Callable[[str, "HostReply"], None]


@dataclass
class TraceResult:
    trace_id: str
    hosts: list[HostAddress]
    target: Target
    options: TraceOptions
    config: str = ""
    output_dirs: list[str] = field(default_factory=list)
    matched: list[MatchedProcess] = field(default_factory=list)
    files: list[TraceFile] = field(default_factory=list)
    errors: list[TraceProblem] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    manifest_paths: list[str] = field(default_factory=list)
    created: str = ""
    waited: bool = False
    requested_by: str | None = None  # user@host that triggered
    # Filled by kinetoscope.collect.deliver (kscope trace --store / catalog recording).
    stored: list[StoredObject] = field(default_factory=list)
    store_url: str | None = None
    # Set when the upload stopped part-way ("2 of 5 files stored: <reason>"): the catalog then
    # records the request as "partial" with this reason (``stored`` holds what did arrive).
    store_error: str | None = None
    catalog: str | None = None
    # Who waits for the files (deliver.waiter_info: host, pid, process start time), recorded with
    # the "requested" catalog row so a later run can tell the waiter was killed (status "abandoned").
    waiter: dict[str, Any] | None = None
    fanout: FanoutTiming = field(default_factory=FanoutTiming)
    # What the files hold, read back after --wait (``collect.captured.Captured.to_json``)
    captured: dict[str, Any] | None = None

    @property
    def ok(self) -> bool:
        return not self.errors

    @property
    def triggered(self) -> list[MatchedProcess]:
        return [m for m in self.matched if m.triggered]

    @property
    def output_dir(self) -> str | None:
        return self.output_dirs[0] if self.output_dirs else None

    def to_json(self) -> dict[str, Any]:
        """The ``kscope trace --json`` document (names are a contract: docs/collect.md)."""
        return {
            "trace_id": self.trace_id,
            "output_dir": self.output_dir,
            "config": self.config,
            "matched": [m.to_json() for m in self.matched],
            "files": [f.to_json() for f in self.files],
            "errors": [e.to_json() for e in self.errors],
            "notes": list(self.notes),
            "manifest": self.manifest_paths[0] if self.manifest_paths else None,
            "waited": self.waited,
            "store_url": self.store_url,
            "stored": [
                {
                    "url": o.url,
                    "key": o.key,
                    "bytes": o.bytes,
                    "sha256": o.sha256,
                    "verified": o.verified,
                    "uploaded": o.uploaded,
                }
                for o in self.stored
            ],
            "catalog": self.catalog,
            "timing": self.fanout.timing_json(),
            "hosts": self.fanout.hosts_json(),
            "captured": self.captured,
        }


# ---------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------
def requested_by() -> str:
    """``user@host`` of whoever triggers (the manifest's and the catalog's ``requested_by``)."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no passwd entry (containers)
        user = str(os.getuid()) if hasattr(os, "getuid") else "unknown"
    return f"{user}@{socket.gethostname()}"


def is_local_host(address: HostAddress) -> bool:
    name = address.host.lower()
    if name in _LOCAL_NAMES or name.startswith("127."):
        return True
    try:
        return name in {socket.gethostname().lower(), socket.getfqdn().lower()}
    except OSError:
        return False


def check_trace_file(path: str | os.PathLike[str]) -> tuple[bool, int | None, bool]:
    """(exists, bytes, complete) of a Kineto JSON trace on this machine.

    The daemon's own check (:func:`kinetoscope.protocol.tracefile.check_file`): Kineto writes
    ``<path>.tmp`` and renames it when done, so an existing final file is complete; we still check
    that it is one whole JSON object (bounded reads; gzip files: decompress to the end). A
    symlink, FIFO, device or hard link at ``path`` is never followed nor read: not complete."""
    check = check_file(os.fspath(path))
    return check.exists, check.bytes, check.complete


def _pool(n: int) -> ThreadPoolExecutor:
    return ThreadPoolExecutor(max_workers=max(1, min(32, n)), thread_name_prefix="kscope-trace")


def _ask_all(
    hosts: list[HostAddress],
    token: str | None,
    timeout: float,
    call: Callable[[DaemonClient], R],
    on_done: Callable[[HostReply], None] | None = None,
) -> list[HostAnswer[R]]:
    """``call`` every host's daemon through the bounded pool; replies in ``hosts`` order.
    ``on_done`` sees each reply (in a worker thread) as soon as it is there."""

    def one(addr: HostAddress) -> HostAnswer[R]:
        hr: HostAnswer[R]
        try:
            hr = HostAnswer(addr, reply=call(DaemonClient(addr, token=token, timeout=timeout)))
        except DaemonError as exc:
            hr = HostAnswer(addr, error=exc)
        if on_done is not None:
            on_done(hr)
        return hr

    with _pool(len(hosts)) as pool:
        return list(pool.map(one, hosts))


def _problem_from_error(exc: DaemonError) -> TraceProblem:
    return TraceProblem(kind=exc.kind, host=str(exc.address), message=str(exc))


# ---------------------------------------------------------------------------------------
# Aligned iteration windows
# ---------------------------------------------------------------------------------------
# Ranks pick the request up at their own polls, up to one poll interval apart, and Kineto starts
# each at the next multiple of PROFILE_START_ITERATION_ROUNDUP after its pickup: they start
# together unless a multiple passes while they pick it up. With R >= ALIGN_SAFETY x (steps done
# in a pickup spread) that happens at most once in ALIGN_SAFETY requests, for a job that steps at
# most ALIGN_STEPS_PER_S (unknown to kscope: Kineto reports no iteration count). docs/collect.md.
ALIGN_STEPS_PER_S = 10.0  # assumed step rate
ALIGN_SAFETY = 10.0
ALIGN_SLACK_S = 0.5  # pickup spread beyond the poll interval (RPC, a step in flight)
DEFAULT_POLL_INTERVAL_S = 1.0  # `kscope daemon`'s KINETO_CONFIG; Kineto's own default is 5 s


def nice_ceil(value: float) -> int:
    """The smallest of 1, 2, 5, 10, 20, 50, 100, ... that is >= ``value``."""
    scale = 1
    while True:
        for m in (1, 2, 5):
            if m * scale >= value:
                return m * scale
        scale *= 10


def align_roundup(poll_interval_s: float, steps_per_s: float = ALIGN_STEPS_PER_S) -> int:
    """The default ``--iteration-roundup`` for ranks that poll every ``poll_interval_s``."""
    return nice_ceil(ALIGN_SAFETY * steps_per_s * (poll_interval_s + ALIGN_SLACK_S))


def poll_interval_of(proc: rpc.ProcessInfo) -> float | None:
    """A process's poll interval (s) from the daemon's listing (time registered / polls)."""
    age, polls = proc.registered_s_ago, proc.polls
    if age is None or not polls or polls < 3:
        return None
    return min(10.0, max(1.0, age / polls))


def _listed_pids(p: rpc.ProcessInfo) -> set[int | None]:
    """The pids a listed process is matched by: its pid chain, or in another pid namespace its
    host pid (the daemon's rule, registry.Process.matches_pids; ancestors are not listed)."""
    if p.container_pid is not None:
        return {p.host_pid}
    return set(p.pids or [p.pid])


def _targets(target: Target, procs: list[rpc.ProcessInfo], include_launchers: bool) -> list[rpc.ProcessInfo]:
    """The listed processes a request for ``target`` would trace (the daemon's matching rules)."""
    out = []
    for p in procs:
        if p.is_launcher and not include_launchers:
            continue
        if target.job_id is not None and str(target.job_id) not in (str(p.job_id), str(p.kineto_job_id)):
            continue
        if target.pids and not set(target.pids) & _listed_pids(p):
            continue
        out.append(p)
    return out


def needs_alignment(options: TraceOptions) -> bool:
    """Iteration traces without ``--iteration-roundup`` or ``--no-align``: the hosts are listed first."""
    return options.iterations is not None and options.iteration_roundup is None and options.align


def aligned_options(
    hosts: list[HostAddress],
    target: Target,
    options: TraceOptions,
    token: str | None,
    rpc_timeout: float,
    on_done: Callable[[HostReply], None] | None = None,
) -> tuple[TraceOptions, str | None]:
    """``options`` with the roundup that aligns the ranks' iteration windows, and a note saying so.

    Only when :func:`needs_alignment` and more than one process matches (a listing of every host
    first; ``on_done`` sees each host's answer): one process needs no alignment."""
    if not needs_alignment(options):
        return options, None
    listing = _list_processes_by_host(hosts, token, rpc_timeout, on_done)
    procs = [p for by_pid in listing.values() for p in by_pid.values()]
    matched = _targets(target, procs, options.include_launchers)
    if len(matched) < 2:
        return options, None
    intervals = [i for p in matched if (i := poll_interval_of(p)) is not None]
    interval = max(intervals, default=DEFAULT_POLL_INTERVAL_S)
    rate = options.steps_per_s if options.steps_per_s and options.steps_per_s > 0 else None
    fit = fit_roundup(
        align_roundup(interval, rate or ALIGN_STEPS_PER_S),
        rate or ALIGN_STEPS_PER_S,
        interval,
        ALIGN_SLACK_S,
        options.iterations or 1,
        options.wait_s,
    )
    fitted = fit.note(rate or ALIGN_STEPS_PER_S, interval, options.iterations or 1)
    if not fit.fits and fitted:  # said before anything is triggered
        raise UsageError(fitted)
    roundup = fit.roundup
    basis = f"their {interval:.0f} s poll interval" + (f" and the job's {rate:.3g} steps/s" if rate else "")
    note = (
        f"aligning {len(matched)} processes: each starts at the next multiple of {roundup} iterations "
        f"(--iteration-roundup {roundup}, from {basis}), so every rank traces the "
        f"same steps; this waits up to {roundup} steps first. --no-align starts each at its next step"
    )
    if fitted:
        note += f"; {fitted}"
    return options.replace(iteration_roundup=roundup), note


# ---------------------------------------------------------------------------------------
# Trigger
# ---------------------------------------------------------------------------------------
class _FanoutClock:
    """Counts and times the answers of one fan-out as they arrive (from the pool's threads)."""

    def __init__(self, timing: FanoutTiming, phase: str, on_answer: OnAnswer | None) -> None:
        self.timing, self.phase, self.on_answer = timing, phase, on_answer
        self.lock = threading.Lock()
        self.start = time.monotonic()

    def done(self, hr: HostReply) -> None:
        if self.phase == "trace":
            with self.lock:
                if hr.error is not None:
                    self.timing.failed += 1
                else:
                    self.timing.answered += 1
                    if self.timing.first_answer_s is None:
                        self.timing.first_answer_s = time.monotonic() - self.start
        if self.on_answer is not None:
            self.on_answer(self.phase, hr)

    def elapsed(self) -> float:
        return time.monotonic() - self.start


def trigger_trace(
    request: TraceRequest,
    *,
    token: str | None = None,
    rpc_timeout: float = DEFAULT_TIMEOUT_S,
    write_manifest_file: bool = True,
    on_answer: OnAnswer | None = None,
) -> TraceResult:
    """Ask every host's daemon of ``request`` to trace its target processes; returns at once
    (no waiting).

    Hosts are asked through a bounded thread pool; ``on_answer(phase, reply)`` is called as each
    answers or fails (a progress display), and ``result.fanout`` times the fan-out. A host's
    failure is its own ``errors`` entry, never the others'. The manifest is written into each
    request folder reported by the daemons (created locally if needed)."""
    hosts = list(dict.fromkeys(request.hosts))
    target, options = request.target, request.options
    target.validate()
    options.validate()
    trace_id = validate_trace_id(request.trace_id) if request.trace_id else new_trace_id()
    output_dir = _local_output_dir(request.output_dir)
    timing = FanoutTiming(hosts=len(hosts))
    align_note = None
    if needs_alignment(options):
        listing = _FanoutClock(timing, "list", on_answer)
        options, align_note = aligned_options(hosts, target, options, token, rpc_timeout, listing.done)
        timing.listing_s = listing.elapsed()
    result = TraceResult(
        trace_id=trace_id,
        hosts=hosts,
        target=target,
        options=options,
        created=utc_now_iso(),
        requested_by=requested_by(),
        fanout=timing,
        notes=[align_note] if align_note else [],
    )
    call = rpc.KscopeTraceRequest(
        trace_id=trace_id,
        output_dir=os.path.abspath(output_dir) if output_dir is not None else None,
        **target.rpc_fields(),
        **options.rpc_fields(),
    )
    clock = _FanoutClock(timing, "trace", on_answer)
    replies = _ask_all(hosts, token, rpc_timeout, lambda c: c.trace(call), clock.done)
    timing.all_answered_s = clock.elapsed()
    no_match = [m for hr in replies if (m := _take_reply(result, hr, output_dir is not None))]
    _conclude(result, no_match)
    if write_manifest_file and result.files:
        save_manifest(result)
    return result


def _local_output_dir(output_dir: str | None) -> str | None:
    """The output folder as the daemons get it: a ``file://`` URL's path; any other URL is refused
    (Kineto writes local files only)."""
    if output_dir is None or "://" not in str(output_dir):
        return output_dir
    if not str(output_dir).startswith("file://"):
        raise UsageError(
            f"output folder {output_dir}: Kineto writes local files only; leave the output folder to the "
            "daemons' trace root (or a local/NFS folder) and upload with --store "
            "(kinetoscope.collect.deliver.store_trace_result)"
        )
    return str(output_dir)[len("file://") :]


def _take_reply(result: TraceResult, hr: HostAnswer[rpc.KscopeTraceResponse], dir_given: bool) -> str | None:
    """One host's ``kscopeTrace`` answer into ``result`` (its processes, files, folder, errors);
    the "nothing matched on this host" line when it matched nothing."""
    if hr.error is not None:
        result.errors.append(_problem_from_error(hr.error))
        return None
    reply = hr.reply or rpc.KscopeTraceResponse()
    host = str(hr.address)
    hostname = reply.hostname or hr.address.host
    if not result.config and reply.config:
        result.config = reply.config
    out = reply.trace_dir or reply.output_dir
    if out:
        trace_dir = out if Path(out).name == result.trace_id else str(Path(out) / result.trace_id)
        if trace_dir not in result.output_dirs and (reply.matched or dir_given):
            result.output_dirs.append(trace_dir)
    matched = reply.matched
    if not matched:
        registered = reply.registered or "nothing"
        if result.target.all:
            return f"nothing to trace on host {hostname} ({host}): {registered}"
        return f"no process on host {hostname} ({host}) {result.target.describe()}; registered: {registered}"
    for m in matched:
        _add_matched(result, _matched_process(host, hostname, m))
    return None


def _matched_process(host: str, hostname: str, m: rpc.MatchedProcess) -> MatchedProcess:
    """A ``matched`` entry of a ``kscopeTrace`` answer (§9.2)."""
    return MatchedProcess(
        host=host,
        hostname=hostname,
        pid=m.pid,
        rank=m.rank,
        local_rank=m.local_rank,
        world_size=m.world_size,
        job_id=m.job_id,
        cmdline=m.cmdline or "",
        path=m.path,
        triggered=m.triggered,
        busy=m.busy,
        is_launcher=m.is_launcher,
        reason=m.reason,
        host_pid=m.host_pid,
        container_pid=m.container_pid,
        job_source=m.job_source,
        kineto_job_id=m.kineto_job_id,
        pod=m.pod,
        namespace=m.namespace,
    )


def _add_matched(result: TraceResult, proc: MatchedProcess) -> None:
    """A matched process: its file when triggered, a ``busy`` problem when busy."""
    result.matched.append(proc)
    if proc.triggered and proc.path:
        result.files.append(TraceFile(host=proc.host, pid=proc.pid, rank=proc.rank, path=proc.path))
    elif proc.busy:
        result.errors.append(
            TraceProblem(
                kind="busy",
                host=proc.host,
                pid=proc.pid,
                message=(
                    f"pid {proc.pid} on {proc.hostname} was not traced: an earlier trace request for it is still "
                    "waiting to be picked up (the process has not polled since; is it stuck, or "
                    "still tracing?)"
                ),
            )
        )


def _conclude(result: TraceResult, no_match: list[str]) -> None:
    """The request's config text, and the notes and errors about what was not traced."""
    if not result.config:
        result.config = result.options.config_text(None)
    if not result.matched:
        if no_match or not result.errors:
            message = "; ".join(no_match) or f"no process {result.target.describe()}"
            result.errors.append(TraceProblem(kind="no_match", message=message))
        return
    result.notes.extend(no_match)
    limited = [m for m in result.matched if m.state == "limit"]
    if limited:
        result.notes.append(
            f"{len(limited)} matched process(es) not traced because of --process-limit "
            f"{result.options.process_limit}: " + ", ".join(f"pid {m.pid} on {m.hostname}" for m in limited)
        )
    launchers = [m for m in result.matched if m.state == "launcher"]
    if launchers:
        result.notes.append(
            "not tracing launcher process(es) "
            + ", ".join(f"pid {m.pid} on {m.hostname}" for m in launchers)
            + " (their children are the ranks; --include-launchers traces them too)"
        )
    if not result.files and not any(m.busy for m in result.matched):
        result.errors.append(
            TraceProblem(
                kind="no_match",
                message="processes matched but none was traced: "
                + "; ".join(f"pid {m.pid} on {m.hostname}: {m.reason or m.state}" for m in result.matched),
            )
        )


# ---------------------------------------------------------------------------------------
# Manifest
# ---------------------------------------------------------------------------------------
def build_manifest(result: TraceResult) -> Manifest:
    by_key = {(m.host, m.pid): m for m in result.matched}
    files = []
    for f in result.files:
        m = by_key.get((f.host, f.pid))
        files.append(
            ManifestFile(
                file=os.path.basename(f.path),
                path=f.path,
                host=m.hostname if m else f.host,
                pid=f.pid,
                rank=f.rank,
                local_rank=m.local_rank if m else None,
                world_size=m.world_size if m else None,
                job_id=m.job_id if m else None,
                cmdline=m.cmdline if m else None,
                bytes=f.bytes,
                complete=f.complete,
                refused=f.refused,
                host_pid=m.host_pid if m else None,
                container_pid=m.container_pid if m else None,
                job_source=m.job_source if m else None,
                kineto_job_id=m.kineto_job_id if m else None,
                pod=m.pod if m else None,
                namespace=m.namespace if m else None,
            )
        )
    request = {
        "target": {k: v for k, v in asdict(result.target).items() if v not in (None, (), False)},
        "options": {
            k: v
            for k, v in msgspec.structs.asdict(result.options).items()
            if v not in (None, False) and k != "align"
        },
    }
    if not result.options.align:
        request["options"]["align"] = False  # --no-align
    if "pids" in request["target"]:
        request["target"]["pids"] = list(request["target"]["pids"])
    return Manifest(
        trace_id=result.trace_id,
        created=result.created or utc_now_iso(),
        config=result.config,
        files=files,
        request=request,
        hosts=[str(h) for h in result.hosts],
        updated=utc_now_iso() if result.waited else None,
        requested_by=result.requested_by,
    )


def save_manifest(result: TraceResult) -> list[str]:
    """Write ``manifest.json`` into every request folder; a failure becomes a note (not fatal).

    The bytes are encoded once: with per-host trace roots visible from this machine there is one
    folder per host, and encoding the whole request's manifest for each was O(hosts x files)."""
    data = dumps_manifest(build_manifest(result))
    dirs = result.output_dirs or sorted({os.path.dirname(f.path) for f in result.files})
    written: list[str] = []
    for d in dirs:
        try:
            written.append(str(write_manifest(data, d)))
        except OSError as exc:
            # Not fatal: the traces exist, and each daemon writes manifest.<host>.json beside them.
            note = (
                f"could not write manifest.json into {d} ({exc.strerror or exc}); the daemon's "
                "manifest.<host>.json there still describes the files"
            )
            if note not in result.notes:
                result.notes.append(note)
    result.manifest_paths = written
    return written


# ---------------------------------------------------------------------------------------
# Wait
# ---------------------------------------------------------------------------------------
def _merge_status(
    result: TraceResult, replies: list[HostAnswer[rpc.KscopeTraceStatusResponse]], check_local: bool
) -> list[TraceProblem]:
    """Update ``result.files`` from kscopeTraceStatus answers (and local checks). Returns host errors."""
    problems: list[TraceProblem] = []
    index = {(f.host, f.pid): f for f in result.files}
    now = time.monotonic()
    for hr in replies:
        problem = _status_problem(result, hr)
        if problem is not None:
            problems.append(problem)
            continue
        for entry in hr.reply.files if hr.reply is not None else []:
            f = index.get((str(hr.address), entry.pid))
            if f is not None:
                _apply_status(f, entry, now)
    if check_local:
        _check_local_files(result)
    return problems


def _status_problem(
    result: TraceResult, hr: HostAnswer[rpc.KscopeTraceStatusResponse]
) -> TraceProblem | None:
    """A host's failed status call, or its daemon not knowing the request; None when answered."""
    if hr.error is not None:
        return _problem_from_error(hr.error)
    if hr.reply is not None and not hr.reply.known:
        return TraceProblem(
            kind="failed",
            host=str(hr.address),
            message=f"daemon {hr.address} has no record of trace {result.trace_id} "
            "(was it restarted since the request?)",
        )
    return None


def _apply_status(f: TraceFile, entry: rpc.FileStatus, now: float) -> None:
    """One file's kscopeTraceStatus entry (§9.3) into ``f``; ``now`` is ``time.monotonic()``.
    An unknown (null) ``delivered``/``alive``/``writing`` keeps what ``f`` knew."""
    f.path = entry.path or f.path
    f.exists = entry.exists
    f.bytes = entry.bytes
    f.complete = entry.complete
    f.delivered = f.delivered if entry.delivered is None else entry.delivered
    f.alive = f.alive if entry.alive is None else entry.alive
    f.partial = f.partial if entry.writing is None else entry.writing
    f.tmp_bytes = entry.tmp_bytes
    f.last_poll_s_ago = entry.last_poll_s_ago
    f.retries = entry.retries
    f.refused = entry.reason[:300] if entry.reason else None
    f.held_by = entry.held_by[:128] if entry.held_by else None
    if f.refused:
        f.complete = False
    ago = entry.delivered_s_ago
    if ago is not None:  # the daemon's clock; restarts when it re-sends the config
        f.delivered_mono = now - ago
    elif not f.delivered:
        f.delivered_mono = None
    elif f.delivered_mono is None:
        f.delivered_mono = now


def _check_local_files(result: TraceResult) -> None:
    """Files of daemons on this machine that are not complete yet: checked here too (O_NOFOLLOW,
    regular files only, bounded reads: :func:`kinetoscope.protocol.tracefile.check_file`)."""
    address_of = {str(h): h for h in result.hosts}
    for f in result.files:
        addr = address_of.get(f.host)
        if f.complete or addr is None or not is_local_host(addr):
            continue
        check = check_file(f.path)
        if check.exists:
            f.exists, f.bytes, f.complete = True, check.bytes, check.complete
            f.refused = f.refused or check.reason
        writing = not check.exists and os.path.lexists(f.path + ".tmp")
        f.partial = f.partial or writing
        if writing and f.tmp_bytes is None:
            with contextlib.suppress(OSError):
                f.tmp_bytes = os.lstat(f.path + ".tmp").st_size


KINETO_WARMUP_S = 5.0  # Kineto's ACTIVITIES_WARMUP_PERIOD_SECS default (duration traces)
STALE_POLL_S = 12.0  # no poll for this long: the process has stopped polling (Kineto's default is every 5 s)


def explain_missing(
    f: TraceFile,
    result: TraceResult,
    timeout: float,
    process: rpc.ProcessInfo | None = None,
    listed: bool = False,
) -> str:
    """The likely cause of a file that did not appear (or is incomplete) in time.

    ``process`` is the daemon's kscopeListProcesses entry for the pid (``listed``: the list was
    fetched, so a missing entry means the daemon no longer knows the process)."""
    who = f"pid {f.pid}" + (f" (rank {f.rank})" if f.rank is not None else "")
    where = f"{who} on {f.host}: {f.path}"
    opts = result.options
    if f.exists and not f.complete:
        return (
            f"{where} exists ({f.bytes} bytes) but is not complete JSON after {timeout:g} s: Kineto is still "
            "writing it, or the process died while writing"
        )
    if f.delivered is False:
        if f.alive is False:
            return f"{where} did not appear: the process exited before it picked up the trace config"
        if f.held_by:
            return (
                f"{where} did not appear within {timeout:g} s: the process has not finished its earlier trace "
                f"{f.held_by} (it waits for its start iteration, or is tracing), and Kineto ignores a new request "
                "until then, so the daemon holds this one back; it is delivered when that trace is written"
            )
        if listed and process is None:
            return (
                f"{where} did not appear: the process never picked up the trace config and is no longer "
                "registered with the daemon (it stopped polling: exited, hung, or lost its IPC socket)"
            )
        last = process.last_poll_s_ago if process else None
        if process and process.tracing:
            return (
                f"{where} did not appear within {timeout:g} s: the process is still busy with an earlier trace "
                "(Kineto takes a new config only when idle); it will pick this one up afterwards"
            )
        if last is not None and last > STALE_POLL_S:
            return (
                f"{where} did not appear: the process never picked up the trace config; its last poll was "
                f"{last:.0f} s ago, so it has stopped polling the daemon (hung, stopped, or stuck in a long "
                "Python call holding the GIL?)"
            )
        if isinstance(last, (int, float)):
            return (
                f"{where} did not appear within {timeout:g} s: the process polls the daemon (last poll "
                f"{last:.1f} s ago) but has not picked up the trace config yet; --timeout {timeout:g} s may be "
                "shorter than its poll interval (Kineto polls every 5 s unless KINETO_CONFIG sets "
                "ON_DEMAND_CONFIG_UPDATE_INTERVAL_SECS), or it is busy with another trace"
            )
        return (
            f"{where} did not appear within {timeout:g} s: the process never picked up the trace config, so it "
            "is not polling the daemon (was it started with KINETO_USE_DAEMON=1 and the daemon's "
            "KINETO_IPC_SOCKET_DIR? is it hung?), or it is busy finishing an earlier trace"
        )
    if f.alive is False:
        return f"{where} did not appear: the process picked up the config but exited before the trace was written"
    accepted = f" (Kineto accepted it: {os.path.basename(f.path)}.tmp exists)" if f.partial else ""
    if opts.iterations is not None:
        return (
            f"{where} did not appear within {timeout:g} s although the process picked up the config{accepted}: "
            f"the traced iterations were not reached (iteration traces count optimizer.step() calls; is the "
            f"job still stepping, and can it do {opts.iterations} steps, plus the wait for the "
            f"--iteration-roundup, in {timeout:g} s?), or tracing failed (KINETO_LOG_LEVEL=0 in the process's "
            "environment shows why)"
        )
    needed = KINETO_WARMUP_S + (opts.duration_ms or 0) / 1000.0 + 1.0
    if timeout < needed:
        return (
            f"{where} did not appear within {timeout:g} s: the process picked up the config{accepted}, but a "
            f"duration trace needs about {needed:.0f} s (Kineto waits {KINETO_WARMUP_S:g} s before it starts, "
            f"then records {opts.duration_ms} ms and writes the file); wait longer"
        )
    if f.partial:
        return (
            f"{where} did not appear within {timeout:g} s: Kineto created {f.path}.tmp but never finished it "
            "(tracing failed; with --profile-memory on a CPU-only build Kineto writes no JSON trace; "
            "KINETO_LOG_LEVEL=0 in the process's environment shows why)"
        )
    return (
        f"{where} did not appear within {timeout:g} s although the process picked up the config: tracing "
        "failed (see the process's stderr; KINETO_LOG_LEVEL=0 shows why) or Kineto could not write the file "
        "(folder not writable by the process?)"
    )


STALL_GRACE_S = 8.0  # a duration trace not started/written this long after its window should have ended


def _exited_message(f: TraceFile, result: TraceResult) -> str:
    """Why the file of a process the daemon reports dead will never be complete."""
    who = f"pid {f.pid}" + (f" (rank {f.rank})" if f.rank is not None else "")
    where = f"{who} on {f.host}: {f.path}"
    if f.exists:
        return f"{where} is incomplete ({f.bytes} bytes) and will stay so: the process exited while Kineto was writing it"
    return explain_missing(f, result, 0.0) + " (the daemon reports it dead, so nothing more will come)"


def _stalled_message(f: TraceFile, result: TraceResult, late: float) -> str:
    """Why a duration trace that should have been written ``late`` seconds ago is not."""
    who = f"pid {f.pid}" + (f" (rank {f.rank})" if f.rank is not None else "")
    where = f"{who} on {f.host}: {f.path}"
    dur = result.options.duration_ms
    name = os.path.basename(f.path)
    window = f"{late:.0f} s after its {dur} ms window should have ended"
    last = f.last_poll_s_ago
    if last is not None and last > STALE_POLL_S:
        return (
            f"{where} was not written {window}: the process picked up the config, then stopped polling the "
            f"daemon {last:.0f} s ago (stopped, hung, or stuck in a long call holding the GIL?); nothing will "
            "be written while it is stuck. The other processes' files are not affected."
        )
    if not f.partial:
        return (
            f"{where} was not written {window}: the process picked up the config and still polls the daemon, "
            f"but Kineto never started the trace (no {name}.tmp): it ignores a request while an earlier trace "
            "of the process is still running, or when the request's start time has passed. Trace again "
            "(--iterations N waits for optimizer steps); KINETO_LOG_LEVEL=0 in the job's environment logs why."
        )
    resent = f" (the daemon re-sent it {f.retries} time(s))" if f.retries else ""
    return (
        f"{where} was not written {window}{resent}: Kineto created {name}.tmp ({f.tmp_bytes or 0} bytes) but "
        "never wrote the trace, although the process is alive and polling: Kineto dropped the request (torch "
        "2.13 logs 'Not starting tracing - insufficient time for warmup' when its profiler thread wakes too "
        "late, e.g. on a loaded host, to start a duration trace) or stalled before writing. Trace again, "
        "preferably with --iterations N (not affected); the other processes' files are not affected."
    )


def settled_problem(f: TraceFile, result: TraceResult, now: float) -> TraceProblem | None:
    """A problem of an incomplete file that waiting longer cannot fix, or None while it may still come.

    * ``exited``: the daemon reports the process dead (it picked up the config or not) - known at
      the next status call, so ``--wait`` returns within seconds of the death;
    * ``stalled``: a duration trace that the process picked up, whose window should have ended
      ``STALL_GRACE_S`` ago (pickup + Kineto's 5 s warmup + duration), and of which nothing was
      written (no final file, Kineto's ``.tmp`` absent or empty). A ``.tmp`` with bytes is being
      written: that is waited for (up to the timeout)."""
    if f.complete:
        return None
    if f.refused:
        return TraceProblem(
            kind="refused",
            host=f.host,
            pid=f.pid,
            path=f.path,
            message=(
                f"pid {f.pid} on {f.host}: {f.path}: {f.refused}; it is not read, counted complete or "
                "stored (a trace file must be a regular file written by Kineto; see docs/security.md)"
            ),
        )
    if f.alive is False:
        return TraceProblem(
            kind="exited", host=f.host, pid=f.pid, path=f.path, message=_exited_message(f, result)
        )
    dur = result.options.duration_ms
    if dur is None or not f.delivered or f.delivered_mono is None or f.exists or (f.tmp_bytes or 0) > 0:
        return None
    late = now - (f.delivered_mono + KINETO_WARMUP_S + dur / 1000.0)
    if late < STALL_GRACE_S:
        return None
    return TraceProblem(
        kind="stalled", host=f.host, pid=f.pid, path=f.path, message=_stalled_message(f, result, late)
    )


def _list_processes_by_host(
    hosts: list[HostAddress],
    token: str | None,
    rpc_timeout: float,
    on_done: Callable[[HostReply], None] | None = None,
) -> dict[str, dict[int, rpc.ProcessInfo]]:
    """host -> pid -> kscopeListProcesses entry (hosts that did not answer are left out)."""
    out: dict[str, dict[int, rpc.ProcessInfo]] = {}
    for hr in _ask_all(hosts, token, rpc_timeout, lambda c: c.list_processes(), on_done):
        if hr.error is None and hr.reply is not None:
            out[str(hr.address)] = {p.pid: p for p in hr.reply.processes}
    return out


def _files_by_host(result: TraceResult) -> dict[str, list[TraceFile]]:
    out: dict[str, list[TraceFile]] = {}
    for f in result.files:
        out.setdefault(f.host, []).append(f)
    return out


def wait_for_trace(
    result: TraceResult,
    *,
    timeout: float = 120.0,
    token: str | None = None,
    rpc_timeout: float = DEFAULT_TIMEOUT_S,
    poll_interval: float = 0.5,
    on_progress: Callable[[TraceResult], None] | None = None,
    check_local: bool = True,
    write_manifest_file: bool = True,
) -> TraceResult:
    """Poll the daemons until every triggered process's file is complete or cannot come any more
    (:func:`settled_problem`: its process died, or its duration trace stalled), or ``timeout`` passes.

    Missing files become ``exited``/``stalled``/``timeout`` problems naming the process, the path
    and the likely cause. A host that stops answering is reported only if it still had files
    missing at the end."""
    deadline = time.monotonic() + timeout
    files_of = _files_by_host(result)  # per host, once: a scan of every file per host is O(hosts x files)
    hosts_with_files = [h for h in result.hosts if str(h) in files_of]
    last_host_problems: list[TraceProblem] = []
    settled: dict[int, TraceProblem] = {}
    while True:
        pending_hosts = [h for h in hosts_with_files if any(not f.complete for f in files_of[str(h)])]
        if pending_hosts:
            replies = _ask_all(pending_hosts, token, rpc_timeout, lambda c: c.trace_status(result.trace_id))
            last_host_problems = _merge_status(result, replies, check_local)
        now = time.monotonic()
        settled = {id(f): p for f in result.files if (p := settled_problem(f, result, now)) is not None}
        if on_progress is not None:
            on_progress(result)
        if all(f.complete or id(f) in settled for f in result.files) or now >= deadline:
            break
        time.sleep(min(poll_interval, max(0.0, deadline - time.monotonic())))
    result.waited = True
    failed_hosts = {p.host for p in last_host_problems}
    for p in last_host_problems:
        if any(not f.complete for f in files_of.get(p.host or "", ())):
            result.errors.append(p)
    undelivered_hosts = [
        h
        for h in hosts_with_files
        if str(h) not in failed_hosts
        and any(not f.complete and not f.delivered and id(f) not in settled for f in files_of[str(h)])
    ]
    listing = _list_processes_by_host(undelivered_hosts, token, rpc_timeout) if undelivered_hosts else {}
    for f in result.files:
        if f.complete:
            continue
        if id(f) in settled and f.host not in failed_hosts:
            result.errors.append(settled[id(f)])
            continue
        if f.host in failed_hosts:
            msg = f"pid {f.pid} on {f.host}: {f.path}: status unknown, the daemon did not answer (see above)"
        else:
            procs = listing.get(f.host)
            msg = explain_missing(f, result, timeout, procs.get(f.pid) if procs else None, procs is not None)
        result.errors.append(TraceProblem(kind="timeout", host=f.host, pid=f.pid, path=f.path, message=msg))
    resent = [f for f in result.files if f.retries]
    if resent:
        result.notes.append(
            "Kineto dropped the duration trace in "
            + ", ".join(
                f"pid {f.pid}" + (f" (rank {f.rank})" if f.rank is not None else "") + f" ({f.retries}x)"
                for f in resent
            )
            + " (its profiler thread woke too late to start it: 'Not starting tracing - insufficient time for "
            "warmup'); the daemon sent it again, so that window starts a few seconds after the others'"
        )
    if write_manifest_file and result.files:
        save_manifest(result)
    return result


prime_structs(globals())
