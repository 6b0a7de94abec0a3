"""Typed requests and responses of kscope's RPC extensions (docs/protocol.md §9).

Why structs: the trigger (``kinetoscope.collect``), the daemon (``kinetoscope.daemon.handlers``)
and the web app (through the trigger) exchange these objects; with their fields written once here,
a field added on one side is a field the other side can see. Requests omit the fields left at
their defaults (``omit_defaults``), so a request carries only what the caller asked for, as
before; responses keep every field (``null`` where unknown), and the daemon sends them as JSON
with sorted keys (``wire.encode_rpc_json``). Field names are contracts: add, never rename.

The daemon decodes requests into these structs (``trace_options.decode_as``): a malformed
request is answered with one line naming the field. The options of ``kscopeTrace`` are defined
once, in :mod:`kinetoscope.protocol.trace_options`, and inherited here.
"""

from __future__ import annotations

from typing import Annotated, Any, TypeVar

import msgspec

from kinetoscope.protocol.structinfo import prime_structs
from kinetoscope.protocol.trace_options import OPTION_FIELDS, TraceOptions, field_error

LIST_PROCESSES = "kscopeListProcesses"
TRACE = "kscopeTrace"
TRACE_STATUS = "kscopeTraceStatus"
STACKS = "kscopeStacks"
# A kscopeStacks request's whole budget on the daemon (processes not read by then answer
# "timeout"); the client waits this long plus a margin.
STACKS_MAX_REQUEST_S = 120.0
STATUS_OK = "ok"
# kscopeListProcesses answers at most this many processes per call (page with offset/limit)
MAX_LIST_PROCESSES = 1000


# ---------------------------------------------------------------------------------------
# Requests
# ---------------------------------------------------------------------------------------
class KscopeListProcessesRequest(msgspec.Struct, omit_defaults=True, kw_only=True):
    """§9.1: the registered processes, of one job when ``job_id`` is given; one page of at most
    ``MAX_LIST_PROCESSES`` from ``offset`` (the answer's ``next_offset`` asks for the next)."""

    job_id: int | str | None = None
    offset: Annotated[int, msgspec.Meta(ge=0)] | None = None
    limit: Annotated[int, msgspec.Meta(ge=1)] | None = None


class KscopeTraceRequest(TraceOptions, omit_defaults=True, kw_only=True, frozen=True):
    """§9.2: trace the matching processes of one daemon.

    Which processes: ``job_id``, ``pids`` (a pid also matches its descendants) or ``all``. What
    to record: the :class:`~kinetoscope.protocol.trace_options.TraceOptions` fields, inherited
    and sent flat under their own names (``duration_ms``, ``iterations``, ...) as Dynolog-style
    clients send them. ``output_dir`` must lie under the daemon's trace root."""

    trace_id: str
    job_id: int | str | None = None
    pids: list[int] | None = None
    all: bool = False
    output_dir: str | None = None

    @property
    def options(self) -> TraceOptions:
        """What to record, without the request's who and where."""
        return TraceOptions(**{name: getattr(self, name) for name in OPTION_FIELDS})


class KscopeTraceStatusRequest(msgspec.Struct, omit_defaults=True, kw_only=True):
    """§9.3: the state of every file of one trace request."""

    trace_id: str


class KscopeStacksRequest(msgspec.Struct, omit_defaults=True, kw_only=True):
    """§9.4: a Python stack snapshot (py-spy) of every matching process of one daemon.

    Which processes: ``job_id``, ``pids`` (a pid also matches its descendants) or ``all``, as
    ``kscopeTrace``. ``native`` adds C/C++ frames; ``locals`` adds the short ``repr`` of each
    frame's local variables (what tells a stuck rank from a progressing one, docs/stacks.md);
    ``timeout_ms`` bounds each process's snapshot (the daemon caps it)."""

    job_id: int | str | None = None
    pids: list[int] | None = None
    all: bool = False
    native: bool = False
    locals: bool = False
    timeout_ms: Annotated[int, msgspec.Meta(ge=1)] | None = None
    include_launchers: bool = False


def request_fields(request: msgspec.Struct) -> dict[str, Any]:
    """The JSON fields of ``request`` (those left at their defaults omitted), without ``fn``."""
    fields: dict[str, Any] = msgspec.to_builtins(request)
    return fields


# ---------------------------------------------------------------------------------------
# Responses
# ---------------------------------------------------------------------------------------
# The daemon builds these and sends every field (``response_fields``: ``null`` where unknown);
# the client decodes each answer into its struct (``decode_response``), so callers read typed
# attributes. A field an older daemon (or Dynolog, for ``getStatus``/``getVersion``) may leave
# out has a default here; what a real daemon always sends (a process's ``pid``) is required, and
# an answer without it is refused with one line naming the field.
class StatusResponse(msgspec.Struct, kw_only=True):
    """dyno ``getStatus``: ``{"status": 1}`` from a daemon that is up."""

    status: int | str = 1


class VersionResponse(msgspec.Struct, kw_only=True):
    """dyno ``getVersion``: the daemon's version string."""

    version: str = ""


class ProcessInfo(msgspec.Struct, kw_only=True):
    """One registered process (§9.1): what libkineto reported and what /proc says about it."""

    pid: int
    pids: list[int] = msgspec.field(default_factory=list)
    job_id: str | None = None
    cmdline: str | None = None
    rank: int | None = None
    local_rank: int | None = None
    world_size: int | None = None
    group_rank: int | None = None
    torchelastic_run_id: str | None = None
    master_addr: str | None = None
    master_port: str | int | None = None
    slurm_job_id: str | None = None
    is_launcher: bool = False
    last_poll_s_ago: float | None = None
    pending: bool = False
    pending_trace_id: str | None = None
    host_pid: int | None = None
    uid: int | None = None
    alive: bool | None = None
    polls: int | None = None
    registered_s_ago: float | None = None
    tracing: bool = False
    # the job's KSCOPE_AUTOPILOT environment value ("off" opts the job out of the fleet autopilot)
    autopilot: str | None = None
    # user + system CPU seconds of the process (/proc), what the autopilot's hang check compares
    cpu_s: float | None = None
    # Job identity and namespaces (docs/deploy.md): ``job_id`` is the job identity
    # (kinetoscope.protocol.jobident), ``kineto_job_id`` what libkineto reported (SLURM_JOB_ID or
    # "0"); ``pid`` is the process's own pid, ``container_pid`` set when it is in another pid
    # namespace than the daemon (then ``host_pid`` differs from ``pid``).
    kineto_job_id: str | None = None
    job_source: str | None = None
    container_pid: int | None = None
    pod: str | None = None
    namespace: str | None = None
    pod_uid: str | None = None
    job_owner: str | None = None


class MatchedProcess(ProcessInfo, kw_only=True):
    """A process a ``kscopeTrace`` matched (§9.2): where its file will be, and whether it was
    triggered (else ``reason``: busy, launcher ..., limit)."""

    path: str | None = None
    log_file: str | None = None
    triggered: bool = False
    busy: bool = False
    reason: str | None = None


class KscopeListProcessesResponse(msgspec.Struct, kw_only=True):
    status: str = STATUS_OK
    hostname: str = ""
    processes: list[ProcessInfo] = msgspec.field(default_factory=list)
    total: int | None = None  # processes registered (of the job); older daemons: null
    next_offset: int | None = None  # the ``offset`` of the next page; null on the last


class KscopeTraceResponse(msgspec.Struct, kw_only=True):
    status: str = STATUS_OK
    hostname: str = ""
    trace_id: str = ""
    output_dir: str = ""
    trace_dir: str = ""
    manifest: str | None = None
    config: str = ""
    matched: list[MatchedProcess] = msgspec.field(default_factory=list)
    triggered: int = 0
    registered: str = ""


class FileStatus(msgspec.Struct, kw_only=True):
    """One triggered file of a request (§9.3). ``delivered``, ``alive`` and ``writing`` are null
    when not known (the client then keeps what it knew)."""

    pid: int
    rank: int | None = None
    path: str = ""
    exists: bool = False
    bytes: int | None = None
    complete: bool = False
    delivered: bool | None = None
    alive: bool | None = None
    writing: bool | None = None
    host_pid: int | None = None
    log_file: str = ""
    delivered_s_ago: float | None = None
    last_poll_s_ago: float | None = None
    tmp_bytes: int | None = None
    retries: int = 0
    # why a file that is at the path was not read ("symlink refused", "not a regular file:
    # fifo", "hard link refused ..."): the traced process controls what it leaves there
    reason: str | None = None
    # not delivered yet because the process's earlier iteration trace (this trace id) has not
    # finished: Kineto would ignore the config until it does (docs/protocol.md §9.3)
    held_by: str | None = None


class KscopeTraceStatusResponse(msgspec.Struct, kw_only=True):
    """``known``: false when the daemon has no record of the request (restarted since)."""

    status: str = STATUS_OK
    hostname: str = ""
    trace_id: str = ""
    known: bool = True
    trace_dir: str | None = None
    manifest: str | None = None
    files: list[FileStatus] = msgspec.field(default_factory=list)
    all_complete: bool = False


class StackFrame(msgspec.Struct, kw_only=True):
    """One frame, innermost first in :class:`ThreadStack.frames` (py-spy's order). ``file`` is the
    full path as the process sees it, ``short_file`` its last part; ``native``: a C/C++ frame
    (``native`` requests only); ``locals``: ``name -> repr`` (``locals`` requests only, short
    values only)."""

    name: str
    file: str
    short_file: str
    line: int
    native: bool = False
    locals: dict[str, str] | None = None


class ThreadStack(msgspec.Struct, kw_only=True):
    """One thread of a process as py-spy saw it: ``active`` = running (not idle/waiting, py-spy's
    judgement from the OS thread state), ``owns_gil`` = it held the GIL. ``frames_dropped`` frames
    were left out of the middle of a deeper stack (the bound)."""

    thread_id: int
    os_thread_id: int | None
    name: str | None
    active: bool
    owns_gil: bool
    frames: list[StackFrame]
    frames_dropped: int = 0


class ProcessStacks(msgspec.Struct, kw_only=True):
    """The snapshot of one process (§9.4). ``error`` (with ``error_kind``: ``permission``,
    ``timeout``, ``gone``, ``not_visible``, ``no_py_spy``, ``failed``) when it could not be
    taken; ``pause_ms``: how long py-spy took (the target is paused for part of it);
    ``cpu_s``: the process's user+system CPU seconds at the snapshot (``/proc``)."""

    pid: int
    host_pid: int | None = None
    rank: int | None = None
    local_rank: int | None = None
    world_size: int | None = None
    job_id: str | None = None
    cmdline: str | None = None
    threads: list[ThreadStack] = msgspec.field(default_factory=list)
    threads_dropped: int = 0
    error: str | None = None
    error_kind: str | None = None
    pause_ms: float | None = None
    cpu_s: float | None = None
    taken_at: float | None = None  # wall clock, seconds since the epoch


class KscopeStacksResponse(msgspec.Struct, kw_only=True):
    status: str = STATUS_OK
    hostname: str = ""
    processes: list[ProcessStacks] = msgspec.field(default_factory=list)
    registered: str = ""
    py_spy: str | None = None  # py-spy version used, None when it is missing


def response_fields(response: msgspec.Struct) -> dict[str, Any]:
    """The JSON object of ``response`` (every field, ``None`` as null)."""
    fields: dict[str, Any] = msgspec.to_builtins(response)
    return fields


R = TypeVar("R", bound=msgspec.Struct)


class ResponseError(ValueError):
    """An answer that is not the struct it should be; the message names the field."""


def decode_response(reply: Any, kind: type[R]) -> R:
    """A JSON object already parsed as the response struct ``kind``; unknown keys are ignored
    (a newer daemon may add fields). Raises :class:`ResponseError` naming the field."""
    try:
        return msgspec.convert(reply, kind)
    except msgspec.ValidationError as exc:
        raise ResponseError(field_error(exc)) from None


prime_structs(globals())
