"""RPC functions: dyno's (docs/protocol.md §3.3, identical shapes) and kscope's extensions (§9).

Why this is separate from the transport: every request, however broken, must turn into one
JSON response (``handle_frame`` never raises), and the function semantics are easiest to
test without sockets. Dynolog closes the connection without a word on bad input, which makes
the ``dyno`` CLI panic; here every failure is ``{"status": "failed", "error": ...}`` - for
``setKinetOnDemandRequest`` with dyno's own status strings and the (empty) result lists
added, so the real ``dyno gputrace`` prints the response instead of panicking.
"""

from __future__ import annotations

import hashlib
import hmac
import itertools
import logging
import os
import re
import stat
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

import msgspec
import orjson

from kinetoscope import __version__
from kinetoscope.daemon import stacks as stack_snapshots
from kinetoscope.daemon.auth_throttle import AuthThrottle
from kinetoscope.daemon.logsetup import RateLimitedLogger
from kinetoscope.daemon.metrics import DaemonMetrics
from kinetoscope.daemon.paths import PathRefused, TraceRoot, confine, ensure_dir_under
from kinetoscope.daemon.registry import (
    BUSY,
    LAUNCHER,
    TRIGGERED,
    UNREACHABLE,
    Match,
    PendingConfig,
    Process,
    Registry,
)
from kinetoscope.daemon.traces import (
    TraceBook,
    TraceFile,
    TraceRecord,
    file_status,
    safe_name,
    write_manifest,
)
from kinetoscope.protocol import jobident, rpc
from kinetoscope.protocol import kineto_config as kc
from kinetoscope.protocol.trace_options import OptionsError, TraceOptions, decode_as
from kinetoscope.protocol.wire import CONFIG_ACTIVITIES, encode_rpc_json

log = logging.getLogger("kinetoscope.daemon.rpc")
_Request = TypeVar("_Request", bound=msgspec.Struct)

# What `getVersion` reports: Dynolog's protocol version, with our own as semver build metadata
# (semver precedence ignores it, so tools comparing against "0.6.0" see an equal version).
DYNOLOG_COMPAT_VERSION = "0.6.0"
VERSION = f"{DYNOLOG_COMPAT_VERSION}+kscope.{__version__}"

# Answered on the RPC loop itself, never queued behind slow handlers (see RpcServer).
FAST_FUNCTIONS = frozenset({"getStatus", "getVersion"})
FAST_MAX_BYTES = 4096

DYNO_DEFAULT_PROCESS_LIMIT = 1000  # Dynolog's server-side default (the CLI sends 3)
_EMPTY_DYNO_RESULT: dict[str, Any] = {
    "activityProfilersBusy": 0,
    "activityProfilersTriggered": [],
    "eventProfilersBusy": 0,
    "eventProfilersTriggered": [],
    "processesMatched": [],
}


# What a handler returns: a response struct of protocol/rpc.py, or (the dyno functions whose
# answers have no struct yet: setKinetOnDemandRequest, dcgmProf*) a JSON object.
Answer = dict[str, Any] | msgspec.Struct


class RequestError(Exception):
    """A bad request: becomes ``{"status": <status>, "error": <message>}``."""

    def __init__(self, message: str, status: str = "failed") -> None:
        super().__init__(message)
        self.status = status


def failure(message: str, status: str = "failed", **extra: Any) -> dict[str, Any]:
    return {"status": status, "error": message, **extra}


# ----------------------------------------------------------------------- field readers
_MISSING = object()


def _int(req: dict[str, Any], name: str, default: Any = _MISSING, *, minimum: int | None = None) -> Any:
    value = req.get(name, default)
    if value is _MISSING:
        raise RequestError(f"missing '{name}'")
    if value is None and default is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise RequestError(f"'{name}' must be an integer, got {type(value).__name__}")
    if minimum is not None and value < minimum:
        raise RequestError(f"'{name}' must be >= {minimum}, got {value}")
    return value


def _pids(req: dict[str, Any], name: str = "pids") -> list[int]:
    value = req.get(name)
    if value is None:
        return []
    if not isinstance(value, list) or any(isinstance(p, bool) or not isinstance(p, int) for p in value):
        raise RequestError(f"'{name}' must be an array of integers")
    return value


# Kineto's job id is an int64 (SLURM_JOB_ID read with strtoll); a longer one is no job's id.
_JOB_ID_RE = re.compile(r"-?[0-9]{1,20}")
_JOB_ID_ERROR = (
    "'job_id' must be a 64-bit integer, a decimal string of at most 20 digits or a job identity "
    "(1-200 of A-Z a-z 0-9 . _ : -)"
)


def _job_id(value: object) -> str | None:
    """kscope job ids: absent/null = any job; an int or a decimal string = that Kineto/Slurm
    job id; another job identity (``torchrun:...``, ``k8s:...``: protocol/jobident.py) = that job."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise RequestError(_JOB_ID_ERROR)
    if isinstance(value, int) and -(2**63) <= value < 2**64:
        return str(value)
    if isinstance(value, str) and _JOB_ID_RE.fullmatch(value):
        return str(int(value))
    if isinstance(value, str) and jobident.valid_identity(value):
        return value
    raise RequestError(_JOB_ID_ERROR)


def _decode(req: dict[str, Any], kind: type[_Request]) -> _Request:
    """The request as its typed struct (protocol/rpc.py), every field's type and limit checked:
    a bad one is a one-line :class:`RequestError` naming the field."""
    try:
        return decode_as(req, kind)
    except OptionsError as exc:
        raise RequestError(str(exc)) from None


def _config(options: TraceOptions, log_file: str | None) -> str:
    try:
        return kc.build_config(options, log_file=log_file)
    except ValueError as exc:
        raise RequestError(str(exc)) from None


def _same_dir(a: str, b: str) -> bool:
    try:
        sa, sb = os.stat(a), os.stat(b)
    except OSError:
        return False
    return (sa.st_dev, sa.st_ino) == (sb.st_dev, sb.st_ino)


def trace_root_unreachable(p: Process, trace_root: str, own_mnt_ns: str | None) -> str | None:
    """Why process ``p`` cannot write under ``trace_root`` at the same path, or None.

    A process in another mount namespace (a container) writes its trace file at the path the
    daemon gives it, resolved in *its* file system: the daemon's trace root must be bind-mounted
    there at the same path (docs/deploy.md). Checked by comparing the directory the process sees
    (``/proc/<host pid>/root/<trace root>``) with the daemon's: same device and inode."""
    info = p.info
    if info is None or info.mnt_ns is None or own_mnt_ns is None or info.mnt_ns == own_mnt_ns:
        return None
    seen_by_process = f"/proc/{info.pid}/root{os.path.realpath(trace_root)}"
    if _same_dir(seen_by_process, trace_root):
        return None
    return (
        f"unreachable: pid {p.pid} (host pid {info.pid}) runs in another mount namespace that does not "
        f"see the trace root {trace_root} at the same path; bind-mount it into the container there"
    )


DROP_GRACE_S = 3.0  # Kineto activates a duration request 1-2 s after it got it (see _resend_dropped)
MAX_RESENDS = 2


def _tmp_bytes(path: str) -> int | None:
    """Size of Kineto's ``<path>.tmp`` (it writes the trace there, then renames it), or None
    (also when it is not a regular file: its size then says nothing)."""
    try:
        st = os.lstat(path + ".tmp")
    except OSError:
        return None
    return st.st_size if stat.S_ISREG(st.st_mode) else None


# ----------------------------------------------------------------------- handlers
class RpcHandlers:
    """Turns request bytes into response bytes. One instance per daemon; thread-safe."""

    def __init__(
        self,
        *,
        registry: Registry,
        book: TraceBook,
        metrics: DaemonMetrics,
        hostname: str,
        trace_root: str,
        token: str | None = None,
        include_launchers: bool = False,
    ) -> None:
        self.registry = registry
        self.book = book
        self.metrics = metrics
        self.hostname = hostname
        self.trace_root = trace_root
        # the pinned root (paths.TraceRoot) once the daemon has started; the path before that
        self.root: str | TraceRoot = trace_root
        self.token = token
        self.include_launchers = include_launchers
        self._counter = itertools.count()
        self._rl = RateLimitedLogger(log)
        self.auth_throttle = AuthThrottle()
        self._tls = threading.local()  # whether this thread's last request failed the token check
        try:
            self._mnt_ns: str | None = os.readlink("/proc/self/ns/mnt")
        except OSError:
            self._mnt_ns = None
        self._functions: dict[str, Callable[[dict[str, Any]], Answer]] = {
            "getStatus": self.get_status,
            "getVersion": self.get_version,
            "setKinetOnDemandRequest": self.set_kineto_on_demand_request,
            "dcgmProfPause": self.dcgm_prof_pause,
            "dcgmProfResume": self.dcgm_prof_resume,
            rpc.LIST_PROCESSES: self.kscope_list_processes,
            rpc.TRACE: self.kscope_trace,
            rpc.TRACE_STATUS: self.kscope_trace_status,
            rpc.STACKS: self.kscope_stacks,
        }

    # ------------------------------------------------------------------ entry points
    def handle_frame(self, body: bytes) -> bytes:
        """One request frame's JSON body -> one response body. Never raises."""
        self._tls.unauthorized = False
        try:
            response = self._handle(body)
        except Exception as exc:  # a bug: still answer, keep serving (one traceback per minute)
            self._rl.exception("internal", "RPC handler failed")
            response = failure(f"internal error: {type(exc).__name__}: {str(exc)[:200]}")
        return encode_rpc_json(response)

    def penalty(self, peer: object) -> float:
        """Seconds to hold back the answer this thread just computed for ``peer``: 0 unless it
        failed the token check (then logged and slowed per address: daemon/auth_throttle.py)."""
        if not getattr(self._tls, "unauthorized", False):
            return 0.0
        self._tls.unauthorized = False
        return self.auth_throttle.failed(peer)

    def is_fast(self, body: bytes) -> bool:
        """Whether answering ``body`` is cheap enough for the RPC loop itself: ``getStatus``,
        ``getVersion`` and every request that ends in an error before any handler runs (bad
        JSON, not an object, no string ``fn``, unknown function). Keeps status answerable when workers are busy."""
        if len(body) > FAST_MAX_BYTES:
            return False
        try:
            req = orjson.loads(body)
        except orjson.JSONDecodeError:
            return True
        if not isinstance(req, dict):
            return True
        fn = req.get("fn")
        return not isinstance(fn, str) or fn in FAST_FUNCTIONS or fn not in self._functions

    def frame_error(self, message: str) -> bytes:
        """The response to a frame that could not be read (bad length, timeout, ...)."""
        self.metrics.rpc_requests.labels("<frame>", "failed").inc()
        return encode_rpc_json(failure(message))

    def _handle(self, body: bytes) -> dict[str, Any]:
        try:
            req = orjson.loads(body)
        except orjson.JSONDecodeError as exc:
            self.metrics.rpc_requests.labels("<json>", "failed").inc()
            # dyno pastes --log-file/--pids into its JSON unescaped; answer in its shape.
            extra = _EMPTY_DYNO_RESULT if b"setKinetOnDemandRequest" in body else {}
            return failure(f"request is not valid JSON: {exc}", **extra)
        if not isinstance(req, dict):
            self.metrics.rpc_requests.labels("<json>", "failed").inc()
            return failure(f"request must be a JSON object, got {type(req).__name__}")
        fn = req.get("fn")
        if not isinstance(fn, str):
            self.metrics.rpc_requests.labels("<json>", "failed").inc()
            return failure("request has no string 'fn'")
        handler = self._functions.get(fn)
        dyno_extra = _EMPTY_DYNO_RESULT if fn == "setKinetOnDemandRequest" else {}
        if self.token is not None:  # before anything about the function is said
            given = req.get("token")
            if not isinstance(given, str) or not hmac.compare_digest(given.encode(), self.token.encode()):
                self.metrics.rpc_requests.labels(fn if handler else "<unknown>", "unauthorized").inc()
                self._tls.unauthorized = True
                reason = "missing" if given is None else "wrong"
                return failure(
                    f"unauthorized: {reason} 'token' (this daemon runs with --token)", **dyno_extra
                )
        if handler is None:
            self.metrics.rpc_requests.labels("<unknown>", "failed").inc()
            return failure(f"unknown function {fn[:100]!r}; known: {', '.join(sorted(self._functions))}")
        try:
            answer = handler(req)
        except RequestError as exc:
            self.metrics.rpc_requests.labels(fn, "failed").inc()
            return failure(str(exc), status=exc.status, **dyno_extra)
        # the kscope functions answer with their typed struct (protocol/rpc.py): every field sent
        response = rpc.response_fields(answer) if isinstance(answer, msgspec.Struct) else answer
        status = response.get("status")
        self.metrics.rpc_requests.labels(
            fn, "failed" if isinstance(status, str) and status.startswith("failed") else "ok"
        ).inc()
        return response

    # ------------------------------------------------------------------ dyno functions
    def get_status(self, req: dict[str, Any]) -> rpc.StatusResponse:
        return rpc.StatusResponse(status=1)

    def get_version(self, req: dict[str, Any]) -> rpc.VersionResponse:
        return rpc.VersionResponse(version=VERSION)

    def dcgm_prof_pause(self, req: dict[str, Any]) -> dict[str, Any]:
        if "duration_s" not in req:
            return failure("missing 'duration_s'")  # Dynolog: {"status":"failed"}
        _int(req, "duration_s")
        return {"status": False}  # no DCGM in this daemon

    def dcgm_prof_resume(self, req: dict[str, Any]) -> dict[str, Any]:
        return {"status": False}

    def set_kineto_on_demand_request(self, req: dict[str, Any]) -> dict[str, Any]:
        """Dynolog's ``setOnDemandConfig`` over RPC: same matching, limit, busy and wrapping."""
        if "config" not in req or "pids" not in req:
            raise RequestError("missing 'config' or 'pids'")  # Dynolog: {"status":"failed"}
        try:
            config = req["config"]
            if not isinstance(config, str):
                raise RequestError("'config' must be a string")
            pids = _pids(req)
            job_id = str(_int(req, "job_id", 0))
            limit = _int(req, "process_limit", DYNO_DEFAULT_PROCESS_LIMIT)
        except RequestError as exc:  # Dynolog's status for a JSON type error
            raise RequestError(str(exc), status=f"failed with exception = {exc}") from None
        log_dirs = self._check_config(config)
        candidates = self.registry.candidates(
            job_id=job_id, pids=pids, include_launchers=self.include_launchers
        )
        if candidates:
            self._prepare_dirs(log_dirs, candidates)

        def make(p: Process) -> PendingConfig:
            trace_id = self._dyno_trace_id(p.pid)
            return PendingConfig(kc.wrap_with_trace_id(config, trace_id), trace_id)

        matches = self.registry.trigger(
            job_id=job_id, pids=pids, limit=limit, include_launchers=self.include_launchers, make_config=make
        )
        triggered = [m.process.pid for m in matches if m.outcome == TRIGGERED]
        self.metrics.triggered.inc(len(triggered))
        log.info(
            "setKinetOnDemandRequest job %s pids %s limit %s: matched %s, triggered %s",
            job_id,
            pids,
            limit,
            [m.process.pid for m in matches],
            triggered,
        )
        return {
            "activityProfilersBusy": sum(m.outcome == BUSY for m in matches),
            "activityProfilersTriggered": triggered,
            "eventProfilersBusy": 0,
            "eventProfilersTriggered": [],
            "processesMatched": [m.process.pid for m in matches],
        }

    def _dyno_trace_id(self, pid: int) -> str:
        """Dynolog: decimal ``std::hash("<host>:<pid>:<unix seconds>")``; here a 64-bit BLAKE2
        of that plus a counter, so two requests in one second still get distinct ids."""
        seed = f"{self.hostname}:{pid}:{int(time.time())}:{next(self._counter)}".encode()
        return str(int.from_bytes(hashlib.blake2b(seed, digest_size=8).digest(), "little"))

    def _check_config(self, config: str) -> list[str]:
        """Refuse configs that would write outside the trace root or crash the process.

        Returns the directories of the ``ACTIVITIES_LOG_FILE`` values (to be created).
        """
        if "\0" in config:
            raise RequestError("config contains a NUL byte")
        if any((ord(c) < 32 and c not in "\n\t") or c == "\x7f" for c in config):
            # CR, vertical tab, ...: whether Kineto trims them around a key is not ours to bet on
            raise RequestError("config contains control characters other than newline and tab")
        for key, _value, well_formed in kc.iter_options(config):
            if not well_formed:  # Kineto stops parsing there and writes to its default /tmp path
                raise RequestError(
                    f"config line for {key[:100]!r} is not one KEY=VALUE (Kineto would stop parsing there)"
                )
        files = kc.option_values(config, kc.ACTIVITIES_LOG_FILE)
        if not files:
            raise RequestError(
                f"config has no {kc.ACTIVITIES_LOG_FILE}: Kineto would write to "
                f"/tmp/libkineto_activities_<pid>.json, outside the trace root {self.trace_root}"
            )
        dirs = []
        for value in files:
            try:
                path = confine(value, self.root, kc.ACTIVITIES_LOG_FILE)
            except PathRefused as exc:
                raise RequestError(str(exc)) from None
            if path == self.trace_root:
                raise RequestError(f"{kc.ACTIVITIES_LOG_FILE} must name a file under the trace root")
            dirs.append(os.path.dirname(path))
        for value in kc.option_values(config, kc.PROFILE_START_TIME):
            self._check_start_time(value)
        return dirs

    @staticmethod
    def _check_start_time(value: str | int) -> None:
        """Kineto refuses a start time in the past, and torch 2.13 then may segfault at exit
        (docs/protocol.md §5.3); refuse it here with advice instead."""
        try:
            start = int(value)
        except (TypeError, ValueError):
            raise RequestError(
                f"{kc.PROFILE_START_TIME}={value!r} is not an integer (ms since the epoch)"
            ) from None
        if start < 0:
            raise RequestError(
                f"{kc.PROFILE_START_TIME}={start} is negative; use 0 (start after the warmup) or a time "
                "in ms since the epoch at least 10 s ahead"
            )
        now_ms = int(time.time() * 1000)
        if 0 < start < now_ms:
            raise RequestError(
                f"{kc.PROFILE_START_TIME}={start} is {now_ms - start} ms in the past; Kineto refuses it "
                "(and torch 2.13 can crash). Use 0 (start after the warmup) or at least now + 10 s."
            )

    def _prepare_dirs(self, dirs: list[str], targets: list[Process]) -> None:
        uids = {p.info.uid if p.info else None for p in targets}
        for d in dict.fromkeys(dirs):
            try:
                created = ensure_dir_under(self.root, d, uids)
            except (OSError, PathRefused) as exc:
                raise RequestError(f"cannot create trace directory {d}: {exc}") from None
            if created:
                log.info("created trace directory %s", d)

    # ------------------------------------------------------------------ kscope functions
    def _process_info(self, p: Process, is_launcher: bool, now: float) -> rpc.ProcessInfo:
        info = p.info
        ident = p.identity
        return rpc.ProcessInfo(
            pid=p.pid,
            pids=list(p.pids),
            job_id=ident.id,
            cmdline=info.cmdline if info else None,
            rank=info.rank if info else None,
            local_rank=info.local_rank if info else None,
            world_size=info.world_size if info else None,
            group_rank=info.group_rank if info else None,
            torchelastic_run_id=info.torchelastic_run_id if info else None,
            master_addr=info.master_addr if info else None,
            master_port=info.master_port if info else None,
            slurm_job_id=info.slurm_job_id if info else None,
            is_launcher=is_launcher,
            last_poll_s_ago=round(now - p.last_poll, 3),
            pending=p.pending is not None,
            # additions
            pending_trace_id=p.pending.trace_id if p.pending else None,
            host_pid=info.pid if info else None,
            uid=info.uid if info else None,
            alive=p.alive(),
            polls=p.polls,
            registered_s_ago=round(now - p.first_seen, 3),
            tracing=p.polls > 0 and not (p.last_type & 2),
            autopilot=info.autopilot if info else None,
            cpu_s=stack_snapshots.cpu_seconds(info.pid) if info else None,
            kineto_job_id=p.job_id,
            job_source=ident.source,
            container_pid=info.container_pid if info and info.in_other_pid_ns else None,
            pod=ident.pod,
            namespace=ident.namespace,
            pod_uid=ident.pod_uid,
            job_owner=ident.owner,
        )

    def kscope_list_processes(self, req: dict[str, Any]) -> rpc.KscopeListProcessesResponse:
        """One page of the registered processes: ``offset`` (default 0) and ``limit`` (default
        and at most ``rpc.MAX_LIST_PROCESSES``); ``total`` and ``next_offset`` (null on the last
        page) say how to get the rest. A bounded answer however many processes registered."""
        call = _decode(req, rpc.KscopeListProcessesRequest)
        job_id = _job_id(call.job_id)
        offset = call.offset or 0
        limit = min(call.limit or rpc.MAX_LIST_PROCESSES, rpc.MAX_LIST_PROCESSES)
        now = time.monotonic()
        snap = self.registry.snapshot(job_id)
        page = snap[offset : offset + limit]
        procs = [self._process_info(p, launcher, now) for p, launcher in page]
        more = offset + len(page) < len(snap)
        response = rpc.KscopeListProcessesResponse(
            hostname=self.hostname,
            processes=procs,
            total=len(snap),
            next_offset=offset + len(page) if more else None,
        )
        return response

    def kscope_trace(self, req: dict[str, Any]) -> rpc.KscopeTraceResponse:
        """§9.2: queue a per-process Kineto config for every matching process of the request."""
        call = _decode(req, rpc.KscopeTraceRequest)
        if not kc.valid_trace_id(call.trace_id):
            raise RequestError("'trace_id' must be 1-128 letters, digits or '-'")
        job_id = _job_id(call.job_id)
        options = call.options
        self._check_start_time(options.profile_start_time_ms or 0)
        record = self._reserve(call.trace_id, call.output_dir, _config(options, None))
        launchers = self.include_launchers if options.include_launchers is None else options.include_launchers
        pids = [] if call.all else list(call.pids or [])
        candidates = self.registry.candidates(job_id=job_id, pids=pids, include_launchers=launchers)
        created = self._create_trace_dir(record, candidates)
        files: dict[int, TraceFile] = {}
        matches = self.registry.trigger(
            job_id=job_id,
            pids=pids,
            limit=options.process_limit,
            include_launchers=launchers,
            make_config=self._config_maker(record, options, files),
            refuse=lambda p: trace_root_unreachable(p, self.trace_root, self._mnt_ns),
        )
        record.files = [files[id(m.process)] for m in matches if m.outcome == TRIGGERED]
        self.metrics.triggered.inc(len(record.files))
        manifest = self._settle(record, created)
        log.info(
            "kscopeTrace %s: matched %d, triggered %d -> %s",
            record.trace_id,
            len(matches),
            len(record.files),
            record.trace_dir,
        )
        now = time.monotonic()
        response = rpc.KscopeTraceResponse(
            hostname=self.hostname,
            trace_id=record.trace_id,
            output_dir=record.output_dir,
            trace_dir=record.trace_dir,
            manifest=manifest,
            config=record.config,
            matched=[self._matched(m, files, now) for m in matches],
            triggered=len(record.files),
            registered=self.registry.summary(),
        )
        return response

    def _reserve(self, trace_id: str, output_dir: str | None, shared_config: str) -> TraceRecord:
        """The request's record, its folders confined under the trace root and its id reserved."""
        try:
            out = confine(output_dir or self.trace_root, self.root, "output_dir")
            trace_dir = confine(os.path.join(out, trace_id), self.root, "output_dir/trace_id")
        except PathRefused as exc:
            raise RequestError(str(exc)) from None
        record = TraceRecord(
            trace_id=trace_id, output_dir=out, trace_dir=trace_dir, config=shared_config, root=self.root
        )
        if not self.book.reserve(record):
            raise RequestError(f"trace_id {trace_id!r} was already used on this daemon")
        return record

    def _create_trace_dir(self, record: TraceRecord, candidates: list[Process]) -> list[str]:
        """Create the request folder (owned for the candidates' uids); the folders created."""
        if not candidates:
            return []
        try:
            return ensure_dir_under(
                self.root, record.trace_dir, {p.info.uid if p.info else None for p in candidates}
            )
        except (OSError, PathRefused) as exc:
            self.book.discard(record.trace_id)
            raise RequestError(f"cannot create trace directory {record.trace_dir}: {exc}") from None

    def _config_maker(
        self, record: TraceRecord, options: TraceOptions, files: dict[int, TraceFile]
    ) -> Callable[[Process], PendingConfig]:
        """What gives each triggered process its own config (``rank-<r>.pt.trace.json``) and
        notes its file in ``files`` (by the process's id)."""
        host = safe_name(self.hostname)

        def make(p: Process) -> PendingConfig:
            rank = p.info.rank if p.info else None
            name = f"rank-{rank}.pt.trace.json" if rank is not None else f"{host}.pt.trace.json"
            log_file = os.path.join(record.trace_dir, name)
            text = _config(options, log_file)
            path = kc.kineto_output_path(log_file, p.pid)
            ends_with = None if kc.is_duration_config(text) else path
            pending = PendingConfig(
                kc.wrap_with_trace_id(text, record.trace_id), record.trace_id, ends_with=ends_with
            )
            files[id(p)] = TraceFile(p, log_file, path, pending)
            return pending

        return make

    def _settle(self, record: TraceRecord, created: list[str]) -> str | None:
        """Write the host manifest of a request that triggered files; else forget the request
        and remove the folders it created. The manifest's path, or None."""
        if record.files:
            return write_manifest(
                record, self.hostname, [file_status(f.path, record.root) for f in record.files]
            )
        self.book.discard(record.trace_id)
        for d in reversed(created):
            try:
                os.rmdir(d)
            except OSError:
                pass
        return None

    def _matched(self, m: Match, files: dict[int, TraceFile], now: float) -> rpc.MatchedProcess:
        info = self._process_info(m.process, m.is_launcher, now)
        tf = files.get(id(m.process)) if m.outcome == TRIGGERED else None
        reason = None if m.outcome == TRIGGERED else m.outcome
        if m.outcome == LAUNCHER:
            reason = "launcher (its children are registered; pass include_launchers to trace it)"
        elif m.outcome == UNREACHABLE:
            reason = m.reason
        return rpc.MatchedProcess(
            **msgspec.structs.asdict(info),
            path=tf.path if tf else None,
            log_file=tf.log_file if tf else None,
            triggered=m.outcome == TRIGGERED,
            busy=m.outcome == BUSY,
            reason=reason,
        )

    def _resend_dropped(self, record: TraceRecord) -> None:
        """Re-send a duration trace's config to a process whose Kineto dropped it.

        Kineto (torch 2.13) activates a duration request on a 1 s profiler tick that must fall
        within one second (between 1 and 2 s after it got the config: start = receipt + 5 s
        warmup + 2 ticks, activation at most 1 s ahead of the warmup, which must not be cut
        short). A tick that comes late (a loaded host) fails "Not starting tracing -
        insufficient time for warmup" *after* Kineto created ``<file>.tmp``: a 0-byte file that
        never completes, in a live process that polls idle again (ACTIVITIES bit set). A
        healthy trace polls busy from activation until its file is renamed into place. So a
        process that polled idle ``DROP_GRACE_S`` after it got the config, with no final file,
        dropped it: queue the same config again (at most ``MAX_RESENDS`` times)."""
        if not kc.is_duration_config(record.config):
            return  # iteration requests wait idle for their iteration: nothing to judge
        now_wall, now_mono = time.time(), time.monotonic()
        for tf in record.files:
            pending, proc = tf.pending, tf.process
            if (
                tf.retries >= MAX_RESENDS
                or pending.delivered_at is None
                or not proc.last_type & CONFIG_ACTIVITIES
            ):
                continue
            polled_at = now_wall - (now_mono - proc.last_poll)
            if (
                polled_at < pending.delivered_at + DROP_GRACE_S
                or os.path.exists(tf.path)
                or proc.alive() is False
            ):
                continue

            def same_config(p: PendingConfig = pending) -> PendingConfig:
                return PendingConfig(p.text, p.trace_id)

            again = self.registry.requeue(proc, same_config)
            if again is not None:
                tf.pending = again
                tf.retries += 1
                log.warning(
                    "trace %s: pid %d dropped the duration trace (idle again %.1f s after it got the config, "
                    "no %s); sending it again (%d of %d)",
                    record.trace_id,
                    proc.pid,
                    polled_at - pending.delivered_at,
                    tf.path,
                    tf.retries,
                    MAX_RESENDS,
                )

    def kscope_trace_status(self, req: dict[str, Any]) -> rpc.KscopeTraceStatusResponse:
        trace_id = req.get("trace_id")
        if not kc.valid_trace_id(trace_id):
            raise RequestError("'trace_id' must be 1-128 letters, digits or '-'")
        assert isinstance(trace_id, str)
        record = self.book.get(trace_id)
        if record is None:
            unknown = rpc.KscopeTraceStatusResponse(
                hostname=self.hostname,
                trace_id=trace_id,
                known=False,
                trace_dir=None,
                manifest=None,
                files=[],
                all_complete=True,
            )
            return unknown
        self._resend_dropped(record)
        statuses = [file_status(f.path, record.root) for f in record.files]
        files = []
        now_wall, now_mono = time.time(), time.monotonic()
        for tf, st in zip(record.files, statuses):
            info = tf.process.info
            delivered_at = tf.pending.delivered_at
            files.append(
                rpc.FileStatus(
                    pid=tf.process.pid,
                    rank=info.rank if info else None,
                    path=tf.path,
                    exists=st["exists"],
                    bytes=st["bytes"],
                    complete=st["complete"],
                    delivered=tf.pending.delivered_at is not None,
                    alive=tf.process.alive(),
                    # additions
                    writing=st["writing"],
                    host_pid=info.pid if info else None,
                    log_file=tf.log_file,
                    # how long ago the process picked up the config / last polled, and the size of
                    # Kineto's "<path>.tmp": what the trigger needs to tell a stalled trace (issue 10)
                    delivered_s_ago=None
                    if delivered_at is None
                    else round(max(0.0, now_wall - delivered_at), 3),
                    last_poll_s_ago=round(now_mono - tf.process.last_poll, 3),
                    tmp_bytes=_tmp_bytes(tf.path) if st["writing"] else None,
                    retries=tf.retries,
                    reason=st["reason"],
                    held_by=tf.pending.held_by if delivered_at is None else None,
                )
            )
        manifest = write_manifest(record, self.hostname, statuses)
        response = rpc.KscopeTraceStatusResponse(
            hostname=self.hostname,
            trace_id=trace_id,
            known=True,
            trace_dir=record.trace_dir,
            manifest=manifest,
            files=files,
            all_complete=all(f.complete for f in files),
        )
        return response

    def kscope_stacks(self, req: dict[str, Any]) -> rpc.KscopeStacksResponse:
        """§9.4: py-spy snapshots of the matching processes (``daemon/stacks.py``, docs/stacks.md)."""
        call = _decode(req, rpc.KscopeStacksRequest)
        job_id = _job_id(call.job_id)
        pids = [] if call.all else list(call.pids or [])
        timeout_s = stack_snapshots.DEFAULT_TIMEOUT_S if call.timeout_ms is None else call.timeout_ms / 1000
        targets = self.registry.candidates(job_id=job_id, pids=pids, include_launchers=call.include_launchers)
        if len(targets) > stack_snapshots.MAX_PROCESSES:
            raise RequestError(
                f"{len(targets)} processes match; a stacks request takes at most "
                f"{stack_snapshots.MAX_PROCESSES} per daemon (name a job or pids)"
            )
        exe = stack_snapshots.find_py_spy()
        processes = stack_snapshots.take(
            targets,
            native=call.native,
            with_locals=call.locals,
            timeout_s=min(timeout_s, stack_snapshots.MAX_TIMEOUT_S),
        )
        log.info(
            "kscopeStacks: %d processes (%d failed)", len(processes), sum(1 for p in processes if p.error)
        )
        response = rpc.KscopeStacksResponse(
            hostname=self.hostname,
            processes=processes,
            registered=self.registry.summary(),
            py_spy=stack_snapshots.py_spy_version(exe) if exe else None,
        )
        return response
