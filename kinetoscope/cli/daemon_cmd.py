"""`kscope daemon`: the per-host collection daemon (Dynolog-compatible). Thin: flags -> Daemon."""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, Optional

import typer

from kinetoscope.cli.examples import examples
from kinetoscope.errors import UsageError

if TYPE_CHECKING:
    from kinetoscope.protocol.announce import AnnounceSink

EXAMPLES = examples(
    ("kscope daemon", "RPC on 127.0.0.1:1778, traces to /tmp/kinetoscope/traces"),
    ('kscope daemon --bind 0.0.0.0 --token "$KSCOPE_TOKEN"', "reachable from other hosts"),
    (
        "kscope daemon --tls-cert n.pem --tls-key n.key --tls-client-ca ca.pem",
        "mutual TLS on the RPC port (docs/deploy.md)",
    ),
)


def register(app: typer.Typer) -> None:
    @app.command("daemon", epilog=EXAMPLES)
    def daemon(
        port: int = typer.Option(
            1778, "--port", help="RPC TCP port (dyno's default 1778); 0 = pick a free one."
        ),
        bind: Optional[list[str]] = typer.Option(  # noqa: UP007 - typer needs Optional here
            None,
            "--bind",
            help="Address to listen on for RPC and metrics (repeatable). Default: loopback "
            "(127.0.0.1 and ::1). '::' = every interface, IPv4 and IPv6, like Dynolog.",
        ),
        token: Optional[str] = typer.Option(  # noqa: UP007
            None,
            "--token",
            envvar="KSCOPE_TOKEN",
            help='Require this "token" in every RPC request (an empty one is refused).',
            show_default=False,
        ),
        insecure: bool = typer.Option(
            False,
            "--insecure",
            help="Allow --bind to a non-loopback address without --token (anyone who reaches the port may trace).",
        ),
        trace_root: str = typer.Option(
            "/tmp/kinetoscope/traces",
            "--trace-root",
            help="Trace files may only be written under this directory.",
        ),
        ipc_socket_dir: Optional[str] = typer.Option(  # noqa: UP007
            None,
            "--ipc-socket-dir",
            envvar="KINETO_IPC_SOCKET_DIR",
            help="Use the filesystem socket <dir>/<name> (as KINETO_IPC_SOCKET_DIR does for PyTorch) "
            "instead of the abstract socket. Keep it at most 54 characters.",
        ),
        ipc_name: str = typer.Option(
            "dynolog", "--ipc-name", help="IPC endpoint name (PyTorch looks for 'dynolog')."
        ),
        gc_timeout: float = typer.Option(
            60.0, "--gc-timeout", help="Forget a process after this many seconds without a poll."
        ),
        metrics_port: int = typer.Option(
            9778,
            "--metrics-port",
            help="Prometheus /metrics port on the RPC address; 0 = pick a free one; -1 = off.",
        ),
        metrics_interval: float = typer.Option(
            10.0, "--metrics-interval", help="Seconds between host metric samples."
        ),
        no_gpu_metrics: bool = typer.Option(False, "--no-gpu-metrics", help="Do not query NVML."),
        trace_launchers: bool = typer.Option(
            False,
            "--trace-launchers",
            help="Treat launchers (registered processes whose children are registered too, e.g. "
            "torchrun's agent) as trace targets, as Dynolog does. Default: ranks only.",
        ),
        hostname: Optional[str] = typer.Option(
            None, "--hostname", help="Host name used in file names and answers."
        ),  # noqa: UP007
        rpc_timeout: float = typer.Option(
            5.0,
            "--rpc-timeout",
            help="Seconds a client has to send its whole request (from connect to the last byte).",
        ),
        max_processes_per_uid: int = typer.Option(
            1024,
            "--max-processes-per-uid",
            help="Registered processes one user may have; beyond it, that user's new processes are not "
            "registered (docs/security.md).",
        ),
        log_level: str = typer.Option("INFO", "--log-level", help="DEBUG, INFO, WARNING or ERROR."),
        log_json: bool = typer.Option(False, "--log-json", help="Log JSON lines to stderr."),
        catalog: str | None = typer.Option(
            None,
            "--catalog",
            metavar="URL",
            help="Announce this daemon (address, GPUs, heartbeat) to kscope autopilot's catalog (docs/autopilot.md).",
        ),
        tls_cert: str | None = typer.Option(
            None,
            "--tls-cert",
            metavar="PEM",
            help="Serve RPC over TLS with this certificate (with --tls-key).",
        ),
        tls_key: str | None = typer.Option(None, "--tls-key", metavar="PEM", help="The key of --tls-cert."),
        tls_client_ca: str | None = typer.Option(
            None,
            "--tls-client-ca",
            metavar="PEM",
            help="Mutual TLS: require a client certificate signed by this CA (authenticates clients; "
            "allows a non-loopback --bind without --token).",
        ),
    ) -> None:
        """Run the per-host daemon: PyTorch processes register over IPC, `dyno` and `kscope trace` trigger traces over RPC."""
        from kinetoscope.daemon.daemon import Daemon, DaemonOptions
        from kinetoscope.daemon.logsetup import configure_logging

        _check(
            log_level, port, metrics_port, (gc_timeout, metrics_interval, rpc_timeout), max_processes_per_uid
        )
        if token is None and "KSCOPE_TOKEN" in os.environ:
            token = os.environ["KSCOPE_TOKEN"]  # click drops an empty variable; the daemon refuses it
        configure_logging(log_level, json_lines=log_json)
        options = DaemonOptions(
            port=port,
            bind=list(bind or []),
            token=token,
            insecure=insecure,
            trace_root=trace_root,
            ipc_name=ipc_name,
            ipc_socket_dir=ipc_socket_dir or None,
            gc_timeout_s=gc_timeout,
            metrics_port=None if metrics_port < 0 else metrics_port,
            metrics_interval_s=metrics_interval,
            gpu_metrics=not no_gpu_metrics,
            hostname=hostname,
            include_launchers=trace_launchers,
            rpc_timeout_s=rpc_timeout,
            announce=_catalog_sink(catalog) if catalog else None,
            max_processes_per_uid=max_processes_per_uid,
            tls_cert=tls_cert,
            tls_key=tls_key,
            tls_client_ca=tls_client_ca,
        )

        def ready(d: Daemon) -> None:
            say_ready(d.describe())

        code = Daemon(options).run(ready=ready)
        sys.stdout.flush()
        raise typer.Exit(code)


def say_ready(line: str) -> None:
    """The daemon's ready line, wrapped between its ``key=value`` pairs at the terminal's width
    (a pair stays whole: a path is never split); the first line always reads ``kscope daemon
    ready: rpc_port=N``, which scripts and kinetoscope/demo/local.py look for."""
    import re

    from kinetoscope.termtext import console, print_wrapped

    head, *pairs = re.split(r" (?=[a-z_]+=)", line)
    first = f"{head} {pairs.pop(0)}" if pairs else head
    print_wrapped(console(), [first, *pairs], indent="", subsequent="  ")
    sys.stdout.flush()


def _check(
    log_level: str, port: int, metrics_port: int, periods: tuple[float, float, float], max_per_uid: int
) -> None:
    """Usage errors in the daemon's numbers and log level, before anything starts."""
    if log_level.upper() not in ("DEBUG", "INFO", "WARNING", "ERROR"):
        raise UsageError(f"--log-level must be DEBUG, INFO, WARNING or ERROR, not {log_level!r}")
    if not 0 <= port <= 65535:
        raise UsageError(f"--port must be 0-65535, got {port}")
    if not -1 <= metrics_port <= 65535:
        raise UsageError(f"--metrics-port must be -1 (off) or 0-65535, got {metrics_port}")
    if min(periods) <= 0:
        raise UsageError("--gc-timeout, --metrics-interval and --rpc-timeout must be positive")
    if max_per_uid < 1:
        raise UsageError(f"--max-processes-per-uid must be at least 1, got {max_per_uid}")


def _catalog_sink(catalog_url: str) -> AnnounceSink:
    """``--catalog URL``: the daemon announces itself to this catalog (SQLAlchemy loads only then)."""
    from kinetoscope.store.fleet import catalog_sink

    return catalog_sink(catalog_url)
