"""`kscope stacks`: where is every rank of a job, right now? (docs/stacks.md)

Thin layer over ``kinetoscope.collect.stacks``: parse the arguments, take the snapshots, print
the groups smallest first (or one JSON document with ``--json``).
"""

from __future__ import annotations

import sys

import orjson
import typer
from rich.console import Console
from rich.markup import escape

from kinetoscope.cli.examples import examples
from kinetoscope.cli.host_options import DAEMON_HOSTS, HOSTS_FILE, daemon_hosts
from kinetoscope.cli.tls_options import TLS_CA, TLS_CERT, TLS_KEY, TLS_SERVER_NAME, apply_client_tls
from kinetoscope.termtext import console, print_wrapped

EXAMPLES = examples(
    ("kscope stacks --job-id $SLURM_JOB_ID", "which rank is where, now"),
    ("kscope stacks -H node01 -H node02 -j 36199 --samples 3", "stuck or progressing?"),
    ("kscope stacks --pids 4242 --native --json", "with C/C++ frames, as JSON"),
)


def _print_report(out: Console, report: object, show_stacks: bool) -> None:
    from kinetoscope.collect.stack_groups import StacksReport, main_thread

    assert isinstance(report, StacksReport)
    hosts = len(report.hosts)
    spy = next((h.get("py_spy") for h in report.hosts if h.get("py_spy")), None)
    print_wrapped(
        out,
        f"{len(report.ranks)} processes on {hosts} host{'s' if hosts != 1 else ''}, "
        f"{report.samples} sample{'s' if report.samples != 1 else ''}" + (f" (py-spy {spy})" if spy else ""),
        indent="",
    )
    for g in report.groups:
        states = ""
        if report.samples > 1:
            states = (
                "  [" + ", ".join(f"{k} {v}" if g.size > 1 else k for k, v in sorted(g.states.items())) + "]"
            )
        style = "bold red" if g.outlier else None
        print_wrapped(out, g.summary + states, indent="", subsequent="  ", style=style)
        if show_stacks:
            member = next(r for r in report.ranks if r.group == g.id)
            good = [s for s in member.snapshots if s.error is None]
            thread = main_thread(good[-1]) if good else None
            for f in thread.frames if thread else []:
                print_wrapped(out, [f.name, f"({f.file}:{f.line})"], indent="    ", subsequent="      ")
    print_wrapped(out, f"verdict: {report.verdict}", indent="", subsequent="  ")


def register(app: typer.Typer) -> None:
    @app.command("stacks", epilog=EXAMPLES)
    def stacks(
        host: list[str] | None = DAEMON_HOSTS,
        hosts_file: str | None = HOSTS_FILE,
        job_id: str | None = typer.Option(
            None, "--job-id", "-j", help="The processes of this job (SLURM_JOB_ID, as `kscope trace`)."
        ),
        pids: str | None = typer.Option(
            None,
            "--pids",
            "-p",
            metavar="P[,P...]",
            help="These processes (a pid also matches its descendants, e.g. a launcher's ranks).",
        ),
        all_: bool = typer.Option(False, "--all", help="Every registered process."),
        native: bool = typer.Option(False, "--native", help="Add C/C++ frames (py-spy --native)."),
        samples: int = typer.Option(
            1,
            "--samples",
            "-n",
            metavar="N",
            help="Take N snapshots about --interval apart: tells a stuck rank (same stack and locals every "
            "time) from a progressing one.",
        ),
        interval: float = typer.Option(1.0, "--interval", metavar="S", help="Seconds between snapshots."),
        timeout: float = typer.Option(
            10.0, "--timeout", metavar="S", help="Give up on one process's snapshot after S seconds."
        ),
        show_stacks: bool = typer.Option(
            False, "--stacks", help="Also print the main-thread stack of each group (innermost first)."
        ),
        token: str | None = typer.Option(
            None,
            "--token",
            envvar="KSCOPE_TOKEN",
            help="Shared secret the daemons require (env KSCOPE_TOKEN).",
        ),
        json_out: bool = typer.Option(
            False, "--json", help="Print one JSON document: raw stacks and groups (see docs/stacks.md)."
        ),
        tls_ca: str | None = TLS_CA,
        tls_cert: str | None = TLS_CERT,
        tls_key: str | None = TLS_KEY,
        tls_server_name: str | None = TLS_SERVER_NAME,
    ) -> None:
        """Show where every rank of a job is right now: Python stacks grouped by shape, outliers first."""
        from kinetoscope.collect.stacks import parse_stacks_request, take_stacks

        apply_client_tls(tls_ca, tls_cert, tls_key, tls_server_name)

        host = daemon_hosts(host, hosts_file)
        request, notes = parse_stacks_request(
            hosts=host,
            job_id=job_id,
            pids=pids,
            all=all_,
            native=native,
            samples=samples,
            interval_s=interval,
            timeout_s=timeout,
        )
        err = Console(stderr=True, highlight=False, soft_wrap=True)  # one line per message
        for note in notes:
            err.print(f"[yellow]note:[/] {escape(note)}", soft_wrap=True)
        report = take_stacks(request, token=token)
        if json_out:
            sys.stdout.write(orjson.dumps(report.to_json(), option=orjson.OPT_INDENT_2).decode() + "\n")
            sys.stdout.flush()
        elif report.ranks:
            _print_report(console(), report, show_stacks)
        for e in report.errors:
            err.print(f"[bold red]error:[/] {escape(str(e.get('message')))}", soft_wrap=True)
        for r in report.ranks:
            if r.error:
                err.print(f"[bold red]error:[/] {escape(r.error)}", soft_wrap=True)
        if report.errors or any(r.error for r in report.ranks):
            raise typer.Exit(1)
