"""The `kscope` entry point: one Typer app; each sub-command lives in its own module."""

from __future__ import annotations

import importlib
import sys

import typer
from rich.console import Console
from rich.markup import escape

from kinetoscope import __version__
from kinetoscope.errors import KinetoscopeError

app = typer.Typer(
    name="kscope",
    help="Kinetoscope: trace running PyTorch jobs without code changes, and diagnose them.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

# Each module exposes ``register(app)``; order is the order of `kscope --help`.
COMMAND_MODULES = [
    "kinetoscope.cli.daemon_cmd",
    "kinetoscope.cli.trace_cmd",
    "kinetoscope.cli.analyze_cmd",
    "kinetoscope.cli.diff_cmd",
    "kinetoscope.cli.catalog_cmd",
    "kinetoscope.cli.report_cmd",
    "kinetoscope.cli.serve_cmd",
    "kinetoscope.cli.demo_cmd",
]


@app.callback(invoke_without_command=True)
def _root(
    version: bool = typer.Option(False, "--version", help="Print the version and exit."),
    max_trace_bytes: str | None = typer.Option(
        None, "--max-trace-bytes", metavar="SIZE",
        help="Largest decompressed JSON of one trace file, e.g. 32G (default 16G; $KSCOPE_MAX_TRACE_BYTES).",
    ),
) -> None:
    if version:
        typer.echo(__version__)
        raise typer.Exit(0)
    if max_trace_bytes is not None:
        from kinetoscope.trace.limits import set_max_trace_bytes

        set_max_trace_bytes(max_trace_bytes)


for _module in COMMAND_MODULES:
    importlib.import_module(_module).register(app)


def main() -> None:
    """Run the CLI; user-facing errors become one message and an exit code, never a traceback."""
    err = Console(stderr=True)
    try:
        app()
    except KinetoscopeError as exc:
        err.print(f"[bold red]error:[/] {escape(str(exc))}", highlight=False, markup=True, soft_wrap=True)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        err.print("interrupted")
        sys.exit(130)


if __name__ == "__main__":
    main()
