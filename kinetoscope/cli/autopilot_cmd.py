"""`kscope autopilot`: keep the whole fleet traced and diagnosed, no person in the loop.
Thin: flags -> :class:`kinetoscope.autopilot.service.Autopilot` (docs/autopilot.md)."""

from __future__ import annotations

import signal
import sys
import threading
from types import FrameType
from typing import TYPE_CHECKING, Any

import typer

from kinetoscope.cli.examples import examples
from kinetoscope.cli.tls_options import TLS_CA, TLS_CERT, TLS_KEY, TLS_SERVER_NAME, apply_client_tls

if TYPE_CHECKING:
    from kinetoscope.autopilot.service import CycleReport

EXAMPLES = examples(
    ("kscope autopilot --host node1:1778 --host node2:1778 --once", "one cycle, then exit"),
    ("kscope autopilot --hosts-file hosts.txt --catalog postgresql://db/k", "run as a service"),
    ("kscope autopilot --hosts-file hosts.txt --policy fleet.toml --store s3://b/t", "own policy, S3"),
)


def register(app: typer.Typer) -> None:
    @app.command("autopilot", epilog=EXAMPLES)
    def autopilot(
        host: list[str] | None = typer.Option(
            None,
            "--host",
            "-H",
            metavar="HOST[:PORT]",
            help="A daemon to watch (repeatable, or comma-separated), as in kscope trace.",
        ),
        hosts_file: str | None = typer.Option(
            None,
            "--hosts-file",
            metavar="FILE",
            help="Daemons to watch, one HOST[:PORT] per line (# comments); merged with --host.",
        ),
        announced: bool = typer.Option(
            False,
            "--announced",
            help="Also watch daemons that announce themselves to the catalog (kscope daemon --catalog URL).",
        ),
        catalog: str | None = typer.Option(
            None,
            "--catalog",
            metavar="URL",
            help="Catalog holding all autopilot state: SQLite path or postgresql://... "
            "Default: $KSCOPE_CATALOG, else ~/.kinetoscope/catalog.db.",
        ),
        store: str | None = typer.Option(
            None,
            "--store",
            metavar="URL",
            help="Upload every sample's files here (folder, file:// or s3://).",
        ),
        policy: str | None = typer.Option(
            None, "--policy", metavar="FILE", help="Policy TOML file (defaults: docs/autopilot.md)."
        ),
        once: bool = typer.Option(
            False,
            "--once",
            help="One full cycle (discover, trace what is due, wait, analyse, record), then exit.",
        ),
        as_json: bool = typer.Option(False, "--json", help="With --once: print the cycle's report as JSON."),
        instance: str | None = typer.Option(
            None,
            "--instance",
            metavar="NAME",
            help="Name of this autopilot in the catalog's leases (default autopilot@<hostname>); "
            "a restart with the same name resumes its samples at once.",
        ),
        token: str | None = typer.Option(
            None, "--token", envvar="KSCOPE_TOKEN", show_default=False, help="RPC token of the daemons."
        ),
        output_dir: str | None = typer.Option(
            None,
            "--output-dir",
            "-o",
            metavar="DIR",
            help="Trace folder root on the hosts (default: each daemon's --trace-root).",
        ),
        metrics_port: int = typer.Option(
            -1,
            "--metrics-port",
            help="Serve Prometheus /metrics on 127.0.0.1:PORT; 0 = a free port; -1 = off.",
        ),
        log_level: str = typer.Option("INFO", "--log-level", help="DEBUG, INFO, WARNING or ERROR."),
        log_json: bool = typer.Option(False, "--log-json", help="Log one JSON object per line."),
        backend: str = typer.Option(
            "auto",
            "--backend",
            help="How each sample is analysed (as kscope analyze): auto, single, local (process pool) or ray.",
        ),
        ray_address: str | None = typer.Option(
            None,
            "--ray-address",
            envvar="RAY_ADDRESS",
            help="With --backend ray/auto: the Ray cluster to use.",
        ),
        tls_ca: str | None = TLS_CA,
        tls_cert: str | None = TLS_CERT,
        tls_key: str | None = TLS_KEY,
        tls_server_name: str | None = TLS_SERVER_NAME,
    ) -> None:
        """Trace and diagnose every job of the fleet automatically, on a schedule."""
        apply_client_tls(tls_ca, tls_cert, tls_key, tls_server_name)
        from kinetoscope.autopilot.policy import load_policy
        from kinetoscope.autopilot.service import (
            AnalyzeSettings,
            Autopilot,
            AutopilotConfig,
            default_instance,
        )
        from kinetoscope.daemon.logsetup import configure_logging

        addresses = _check(log_level, host, hosts_file, announced, as_json=as_json, once=once)
        configure_logging(log_level, json_lines=log_json)
        cfg = AutopilotConfig(
            hosts=addresses,
            catalog_url=catalog,
            policy=load_policy(policy),
            store_url=store,
            instance=instance or default_instance(),
            token=token,
            output_dir=output_dir,
            announced=announced,
            analyze=AnalyzeSettings(backend=backend, ray_address=ray_address),
        )
        pilot = Autopilot(cfg)
        try:
            if metrics_port >= 0:
                port = pilot.metrics.serve(metrics_port)
                print(
                    f"kscope autopilot metrics: http://127.0.0.1:{port}/metrics", file=sys.stderr, flush=True
                )
            if once:
                _once(pilot, as_json)
            else:
                _forever(pilot, len(addresses))
        finally:
            pilot.close()


def _check(
    log_level: str,
    host: list[str] | None,
    hosts_file: str | None,
    announced: bool,
    *,
    as_json: bool,
    once: bool,
) -> list[str]:
    """The daemons to watch (``--host`` and ``--hosts-file``, once each); usage errors first."""
    from kinetoscope.collect.client import parse_hosts, read_hosts_file
    from kinetoscope.errors import UsageError

    if log_level.upper() not in ("DEBUG", "INFO", "WARNING", "ERROR"):
        raise UsageError(f"--log-level {log_level!r}: choose DEBUG, INFO, WARNING or ERROR")
    addresses = [str(a) for a in parse_hosts(host)] if host else []
    if hosts_file:
        addresses = list(dict.fromkeys(addresses + read_hosts_file(hosts_file)))
    if not addresses and not announced:
        raise UsageError(
            "no daemons to watch: give --host HOST[:PORT] (repeatable), --hosts-file FILE, "
            "or --announced (daemons started with --catalog URL)"
        )
    if as_json and not once:
        raise UsageError("--json needs --once (a service logs instead; see --log-json)")
    return addresses


def _once(pilot: Any, as_json: bool) -> None:
    """``--once``: one cycle, its report (lines or JSON); exit 1 when no daemon answered."""
    report = pilot.run_cycle()
    if as_json:
        import orjson

        sys.stdout.write(orjson.dumps(report.to_json(), option=orjson.OPT_INDENT_2).decode() + "\n")
    else:
        _print_cycle(report)
    if report.hosts_answered == 0:
        raise typer.Exit(_no_daemon(report))


def _forever(pilot: Any, n_daemons: int) -> None:
    """Cycle until SIGTERM or SIGINT."""
    stop = threading.Event()

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, on_signal)
    print(
        f"kscope autopilot running: {n_daemons} daemons, catalog {pilot.catalog.display_url}",
        file=sys.stderr,
        flush=True,
    )
    pilot.run_forever(stop)


def _print_cycle(report: CycleReport) -> None:
    """One line per job that was not traced (why, and when it will be), then the cycle's line."""
    from kinetoscope.termtext import console, print_wrapped

    out = console()
    for key, why in sorted(report.waiting.items()):
        print_wrapped(out, f"{key}: {why}", indent="", subsequent="  ")
    for key, kind in sorted(report.anomalies.items()):
        print_wrapped(out, f"{key}: traced now (anomaly: {kind})", indent="", subsequent="  ")
    states = ", ".join(f"{v} {k}" for k, v in _count(report.finished.values()).items()) or "none"
    asked = report.hosts_answered + len(report.hosts_failed)
    line = (
        f"autopilot cycle: {report.hosts_answered}/{asked} daemons answered, "
        f"{report.jobs_seen} jobs, {len(report.started)} samples started, "
        f"{len(report.resumed)} resumed, finished: {states} ({report.seconds:.1f} s)"
    )
    print_wrapped(out, line, indent="", subsequent="  ")


def _no_daemon(report: CycleReport) -> int:
    """Exit status 1 with one line on stderr when no daemon answered (nothing could be seen)."""
    parts = [why if h in why else f"{h}: {why}" for h, why in sorted(report.hosts_failed.items())]
    parts += [f"{h}: down earlier, in back-off (see fleet_hosts.next_retry)" for h in report.hosts_skipped]
    print(f"error: no daemon answered: {'; '.join(parts) or 'no daemon to ask'}", file=sys.stderr)
    return 1


def _count(values: object) -> dict[str, int]:
    out: dict[str, int] = {}
    for v in values:  # type: ignore[attr-defined]
        out[str(v)] = out.get(str(v), 0) + 1
    return out
