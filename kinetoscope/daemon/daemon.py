"""``kscope daemon``: wires the registry, IPC fabric, RPC server and metrics together.

Why a class and not a script: tests and the benchmark run the daemon in-process (``with
Daemon(options) as d: ...``) on private endpoints; the CLI only parses flags, builds
``DaemonOptions`` and calls ``run()``, which blocks until SIGTERM/SIGINT and then shuts down
cleanly (sockets closed, the filesystem IPC socket unlinked).
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
import time
from dataclasses import dataclass, field
from types import FrameType

from kinetoscope.daemon.handlers import VERSION, RpcHandlers
from kinetoscope.daemon.ipc_server import IpcEndpoint, IpcServer
from kinetoscope.daemon.metrics import DaemonMetrics, HostSampler, MetricsExporter, ProcessMetrics, ProcessRow
from kinetoscope.daemon.paths import PathRefused, TraceRoot, check_root_chain, ensure_dir
from kinetoscope.daemon.registry import MAX_PROCESSES_PER_UID, Registry
from kinetoscope.daemon.rpc_server import DEFAULT_BINDS, BindSpec, RpcServer, is_loopback
from kinetoscope.daemon.tls import server_tls
from kinetoscope.daemon.traces import TraceBook
from kinetoscope.errors import KinetoscopeError
from kinetoscope.protocol.announce import AnnounceSink
from kinetoscope.protocol.defaults import DEFAULT_PORT, DEFAULT_TRACE_ROOT

log = logging.getLogger("kinetoscope.daemon")

DEFAULT_METRICS_PORT = 9778


@dataclass
class DaemonOptions:
    """Everything ``kscope daemon`` can be told (see docs/daemon.md)."""

    port: int = DEFAULT_PORT  # RPC; 0 = ephemeral
    bind: list[str] = field(default_factory=list)  # empty = loopback (127.0.0.1 and ::1)
    token: str | None = None  # None = no authentication; "" is refused
    insecure: bool = False  # allow a non-loopback bind without a token (loudly warned)
    trace_root: str = DEFAULT_TRACE_ROOT
    ipc_name: str = "dynolog"
    ipc_socket_dir: str | None = None  # KINETO_IPC_SOCKET_DIR
    gc_timeout_s: float = 60.0
    metrics_port: int | None = DEFAULT_METRICS_PORT  # None = no exporter; 0 = ephemeral
    metrics_interval_s: float = 10.0
    gpu_metrics: bool = True
    hostname: str | None = None
    include_launchers: bool = False
    rpc_timeout_s: float = 5.0  # whole request, from accept to its last byte
    rpc_min_rate_bps: float = 1024.0  # after the first second (see rpc_server)
    max_connections: int = 64  # requests handled at once (status is answered besides)
    # where to announce this daemon (daemon/announce.py); ``kscope daemon --catalog`` plugs in the catalog
    announce: AnnounceSink | None = None
    announce_interval_s: float = 30.0
    max_processes_per_uid: int = MAX_PROCESSES_PER_UID  # registrations one user may hold (issue 32)
    tls_cert: str | None = None  # RPC over TLS (daemon/tls.py); with tls_key
    tls_key: str | None = None
    tls_client_ca: str | None = None  # mutual TLS: clients need a certificate signed by this CA


def check_exposure(bind: list[str], token: str | None, insecure: bool, mutual_tls: bool = False) -> None:
    """Refuse an empty token, and a non-loopback ``--bind`` without a token (or mutual TLS, whose
    client certificates authenticate callers) unless ``insecure``.

    Why: whoever reaches the RPC port can trigger traces, choose directories under the trace
    root and list every registered process with its command line; an empty token used to
    switch authentication off silently (issue 16).
    """
    if token is not None and not token.strip():
        raise KinetoscopeError(
            "the RPC token (--token / KSCOPE_TOKEN) is empty: set a secret, or unset it to run "
            "without authentication on loopback"
        )
    exposed = [h for h in bind if not is_loopback(h)]
    if not exposed or token is not None or mutual_tls:
        return
    if not insecure:
        raise KinetoscopeError(
            f"--bind {exposed[0]} exposes the RPC port beyond this host without --token: anyone who "
            "can reach it may trigger traces and list processes. Set --token (or KSCOPE_TOKEN), or "
            "pass --insecure to accept that (see docs/security.md)"
        )
    log.warning(
        "INSECURE: RPC listens on %s without a token (--insecure): anyone who can reach it may "
        "trigger traces and list processes; see docs/security.md",
        ", ".join(exposed),
    )


class Daemon:
    """One daemon instance. ``start()``/``stop()`` or use as a context manager; ``run()`` blocks."""

    def __init__(self, options: DaemonOptions) -> None:
        self.options = options
        self.hostname = options.hostname or socket.gethostname()
        root = options.trace_root
        if not root or not os.path.isabs(root):
            raise KinetoscopeError(f"--trace-root must be an absolute path, got {root!r}")
        self.trace_root = os.path.normpath(root)
        tls = server_tls(options.tls_cert, options.tls_key, options.tls_client_ca)
        check_exposure(options.bind, options.token, options.insecure, mutual_tls=bool(tls and tls.mutual))
        self.tls = tls
        self.metrics = DaemonMetrics()
        self.registry = Registry(gc_timeout_s=options.gc_timeout_s, max_per_uid=options.max_processes_per_uid)
        self.metrics.registered.set_function(lambda: len(self.registry))
        self.metrics.info.labels(VERSION, self.hostname).set(1)
        self.book = TraceBook()
        self.handlers = RpcHandlers(
            registry=self.registry,
            book=self.book,
            metrics=self.metrics,
            hostname=self.hostname,
            trace_root=self.trace_root,
            token=options.token,
            include_launchers=options.include_launchers,
        )
        self.ipc = IpcServer(
            IpcEndpoint(options.ipc_name, options.ipc_socket_dir or None), self.registry, self.metrics
        )
        binds = [BindSpec(h) for h in options.bind] or [
            BindSpec(h, optional=(h == "::1")) for h in DEFAULT_BINDS
        ]
        self.rpc = RpcServer(
            binds,
            options.port,
            self.handlers.handle_frame,
            self.handlers.frame_error,
            timeout_s=options.rpc_timeout_s,
            max_connections=options.max_connections,
            fast=self.handlers.is_fast,
            min_rate_bps=options.rpc_min_rate_bps,
            penalty=self.handlers.penalty,
            tls=tls.context() if tls else None,
        )
        self.metrics.contexts.set_function(self.registry.context_count)
        self.metrics.rpc_pending.set_function(lambda: self.rpc.pending_count)
        self.sampler = HostSampler(options.metrics_interval_s, self.hostname, enable_gpu=options.gpu_metrics)
        self.metrics.registry.register(self.sampler)
        self.metrics.registry.register(ProcessMetrics(self._process_rows))
        self.exporter: MetricsExporter | None = None
        self.root: TraceRoot | None = None
        self._started: list[object] = []
        self._stop_event = threading.Event()

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        self._pin_trace_root()
        try:
            self.ipc.start()
            self._started.append(self.ipc)
            self.rpc.start()
            self._started.append(self.rpc)
            self.sampler.start()
            self._started.append(self.sampler)
            if self.options.metrics_port is not None:
                self._start_exporter()
            if self.options.announce is not None:
                self._start_announcer(self.options.announce)
        except BaseException:
            self.stop()
            raise
        log.info(
            "kscope daemon %s on %s: trace root %s, process GC after %g s, launchers %s",
            VERSION,
            self.hostname,
            self.trace_root,
            self.options.gc_timeout_s,
            "traced" if self.options.include_launchers else "excluded from targets",
        )

    def _pin_trace_root(self) -> None:
        """Check who controls the trace root's directories, create it, and pin it (issue 32):
        resolved and opened once here; requests use that directory or are refused."""
        try:
            check_root_chain(self.trace_root)
            ensure_dir(self.trace_root)
            check_root_chain(self.trace_root)  # what ensure_dir found or made
            root = TraceRoot(self.trace_root)
        except PathRefused as exc:
            raise KinetoscopeError(str(exc)) from None
        except OSError as exc:
            raise KinetoscopeError(f"cannot create the trace root {self.trace_root}: {exc}") from exc
        self.root = root
        self.handlers.root = root
        self._started.append(root)

    def _start_exporter(self) -> None:
        addr = self.rpc.addresses[0][0]
        exporter = MetricsExporter(self.metrics.registry, addr, self.options.metrics_port or 0)
        try:
            exporter.start()
        except OSError as exc:
            # Metrics are secondary: tracing keeps working; say so loudly.
            log.error(
                "metrics exporter disabled: cannot listen on %s port %s: %s",
                addr,
                self.options.metrics_port,
                exc,
            )
            return
        self.exporter = exporter
        self._started.append(exporter)
        log.info(
            "Prometheus metrics on http://%s:%d/metrics",
            addr if ":" not in addr else f"[{addr}]",
            exporter.port,
        )

    def _start_announcer(self, sink: AnnounceSink) -> None:
        from kinetoscope.daemon.announce import Announcer

        def address() -> str:  # a wildcard bind is reached by host name
            host, port = self.rpc.addresses[0]
            host = self.hostname if host in ("0.0.0.0", "::") else host
            return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"

        nvml = getattr(self.sampler, "_nvml", None)
        announcer = Announcer(
            sink,
            address,
            self.hostname,
            lambda: len(nvml.handles) if nvml else None,
            VERSION,
            self.options.announce_interval_s,
        )
        announcer.start()
        self._started.append(announcer)

    def stop(self) -> None:
        """Stop everything that was started, newest first. Idempotent."""
        while self._started:
            part = self._started.pop()
            try:
                if isinstance(part, TraceRoot):
                    part.close()
                else:
                    part.stop()  # type: ignore[attr-defined]
            except Exception:  # pragma: no cover
                log.exception("error while stopping %s", type(part).__name__)
        self._stop_event.set()

    def __enter__(self) -> Daemon:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def request_stop(self, *_: object) -> None:
        """Make ``run()`` return (safe from a signal handler)."""
        self._stop_event.set()

    def run(self, ready: callable | None = None) -> int:  # type: ignore[valid-type]
        """Start, call ``ready(self)``, serve until SIGTERM/SIGINT, stop. Returns the exit code."""
        self.start()
        previous = {}

        def on_signal(signum: int, _frame: FrameType | None) -> None:
            log.info("received %s, shutting down", signal.Signals(signum).name)
            self._stop_event.set()

        for sig in (signal.SIGTERM, signal.SIGINT):
            previous[sig] = signal.signal(sig, on_signal)
        try:
            if ready is not None:
                ready(self)
            # No timeout: a signal interrupts the wait and its handler sets the event, so an
            # idle daemon does not wake up at all on this thread.
            self._stop_event.wait()
        finally:
            self.stop()
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        log.info("kscope daemon stopped")
        return 0

    def _process_rows(self) -> list[ProcessRow]:
        """The registered processes, labelled for the per-process metrics (ranks only)."""
        now = time.monotonic()
        rows = []
        for p, is_launcher in self.registry.snapshot():
            if is_launcher:
                continue
            info, ident = p.info, p.identity
            labels = (
                str(p.pid),
                str(info.pid) if info else "",
                "" if info is None or info.rank is None else str(info.rank),
                ident.id,
                ident.source,
                ident.pod or "",
                ident.namespace or "",
            )
            rows.append(
                ProcessRow(labels, p.polls, round(now - p.last_poll, 3), p.polls > 0 and not p.last_type & 2)
            )
        return rows

    # ------------------------------------------------------------------ facts
    @property
    def rpc_port(self) -> int:
        return self.rpc.port

    @property
    def metrics_port(self) -> int | None:
        return self.exporter.port if self.exporter else None

    def describe(self) -> str:
        """The one line printed once the daemon is ready (tests parse ``rpc_port=``)."""
        rpc = ",".join(f"[{h}]:{p}" if ":" in h else f"{h}:{p}" for h, p in self.rpc.addresses)
        metrics = f"{self.metrics_port}" if self.metrics_port else "off"
        return (
            f"kscope daemon ready: rpc_port={self.rpc_port} rpc={rpc} ipc={self.ipc.endpoint.describe()} "
            f"metrics_port={metrics} trace_root={self.trace_root}"
            + (f" tls={'mutual' if self.tls.mutual else 'on'}" if self.tls else "")
        )
