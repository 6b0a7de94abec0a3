"""The `kscope` entry point: one Typer app; each sub-command lives in its own module.

Start-up is part of the interface (`kscope --help` should answer at once), so sub-command modules
are imported lazily: the root group lists the commands from the table below, and imports a
command's module only when that command runs or prints its own help. A module's heavy
libraries (Polars, Plotly, SQLAlchemy, FastAPI, ...) load inside its command function.
"""

from __future__ import annotations

import faulthandler
import importlib
import sys
from typing import Any

import typer
from typer import _click
from typer.core import TyperArgument, TyperCommand, TyperGroup, TyperOption

from kinetoscope import __version__
from kinetoscope.cli import deprecated, lean_coercion
from kinetoscope.errors import KinetoscopeError

# name -> (module exposing ``register(app)``, one-line help shown by `kscope --help`).
# Order is the order of `kscope --help`; tests/cli/test_cli_help.py checks each line against
# the command's own docstring so the two cannot drift apart.
COMMANDS: dict[str, tuple[str, str]] = {
    "daemon": (
        "kinetoscope.cli.daemon_cmd",
        "Run the per-host daemon: PyTorch processes register over IPC, "
        "`dyno` and `kscope trace` trigger traces over RPC.",
    ),
    "trace": (
        "kinetoscope.cli.trace_cmd",
        "Trigger an on-demand trace of running PyTorch processes, like `dyno gputrace`.",
    ),
    "stacks": (
        "kinetoscope.cli.stacks_cmd",
        "Show where every rank of a job is right now: Python stacks grouped by shape, outliers first.",
    ),
    "analyze": (
        "kinetoscope.cli.analyze_cmd",
        "Analyse traces: temporal, idle-time, kernel and overlap breakdowns and more (HTA-compatible).",
    ),
    "diff": (
        "kinetoscope.cli.diff_cmd",
        "Compare two traces: op/kernel counts and durations added, removed and changed.",
    ),
    "jobs": (
        "kinetoscope.cli.jobs_cmd",
        "List every job the catalog has seen (by hand or by the autopilot), most recent first.",
    ),
    "traces": ("kinetoscope.cli.catalog_cmd", "List recorded trace requests, newest first."),
    "report": (
        "kinetoscope.cli.report_cmd",
        "Write a self-contained HTML report (diagnosis, step-time breakdown, stragglers, kernels, ...).",
    ),
    "autopilot": (
        "kinetoscope.cli.autopilot_cmd",
        "Trace and diagnose every job of the fleet automatically, on a schedule.",
    ),
    "serve": (
        "kinetoscope.cli.serve_cmd",
        "Serve the web app: catalog browser, HTML reports, trace trigger form and a local Perfetto UI.",
    ),
    "demo": (
        "kinetoscope.cli.demo_cmd",
        "Run the end-to-end demo: daemon + DDP job + on-demand trace + "
        "diagnosis + report (about 30-60 s on 2 cores).",
    ),
    "catalog": (
        "kinetoscope.cli.catalog_cmd",
        "Manage the trace catalog (record existing trace folders, show requests).",
    ),
}


# Typer 0.29 shows a Python type where an option has no metavar (``<list[str]>``, ``<int>``):
# the help shows the value's kind in Click's words instead.
_METAVARS = {"str": "TEXT", "int": "INTEGER", "float": "FLOAT", "Path": "PATH", "bool": "BOOLEAN"}


def _flag_type_rich(self: TyperOption, ctx: _click.Context) -> str | None:
    """A flag (``--json``, ``--wait``, ``--record/--no-record``) takes no value, so its help row
    shows no type; Typer 0.29 prints ``<bool>`` there, which reads as if it wanted one. Other
    options show a metavar (``TEXT``, ``INTEGER``), never a Python type."""
    if self.is_flag and self.metavar is None:
        return None
    return _metavar(_typed_option_type_rich(self, ctx))


def _metavar(shown: str | None) -> str | None:
    """``<list[str]>`` -> ``TEXT``, ``<int>`` -> ``INTEGER``; anything else unchanged."""
    if shown and shown.startswith("<") and shown.endswith(">"):
        inner = shown[1:-1]
        for wrapper in ("list[", "Optional[", "tuple["):
            if inner.startswith(wrapper) and inner.endswith("]"):
                inner = inner[len(wrapper) : -1]
        return _METAVARS.get(inner.split(".")[-1], inner.upper())
    return shown


_typed_option_type_rich = TyperOption.display_type_rich
TyperOption.display_type_rich = _flag_type_rich  # type: ignore[method-assign]
_typed_argument_type_rich = TyperArgument.display_type_rich
TyperArgument.display_type_rich = lambda self, ctx: _metavar(_typed_argument_type_rich(self, ctx))  # type: ignore[method-assign]
lean_coercion.install()  # no Pydantic TypeAdapters for values already of their type (~0.1 s)


def load_commands(module: str) -> dict[str, _click.Command]:
    """Import ``module`` and return the click commands its ``register(app)`` defines."""
    sub = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
    importlib.import_module(module).register(sub)
    sub.callback()(lambda: None)  # a callback makes Typer build a group even for one command
    commands = dict(typer.main.get_group(sub).commands)
    deprecated.install(commands)  # renamed flags: the old spellings still work, with a warning
    return commands


class LazyGroup(TyperGroup):
    """The root group: lists every command from :data:`COMMANDS` without importing it, and
    loads the real command (its module) only when the command line names it."""

    def list_commands(self, ctx: _click.Context) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: _click.Context, cmd_name: str) -> _click.Command | None:
        if cmd_name in self.commands:
            return self.commands[cmd_name]
        entry = COMMANDS.get(cmd_name)
        if entry is None:
            return None
        return TyperCommand(cmd_name, help=entry[1])  # a listing entry; never invoked

    def resolve_command(self, ctx: _click.Context, args: list[str]) -> Any:
        if args and args[0] in COMMANDS and args[0] not in self.commands:
            self.commands.update(load_commands(COMMANDS[args[0]][0]))
        return super().resolve_command(ctx, args)


app = typer.Typer(
    name="kscope",
    cls=LazyGroup,
    help="Kinetoscope: trace running PyTorch jobs without code changes, and diagnose them.",
    epilog="Every command's --help ends with examples; every flag and its one meaning: docs/cli.md.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@app.callback(invoke_without_command=True)
def _root(
    version: bool = typer.Option(False, "--version", help="Print the version and exit."),
    max_trace_bytes: str | None = typer.Option(
        None,
        "--max-trace-bytes",
        metavar="SIZE",
        help="Largest decompressed JSON of one trace file, e.g. 32G (default 16G; $KSCOPE_MAX_TRACE_BYTES).",
    ),
    max_trace_events: str | None = typer.Option(
        None,
        "--max-trace-events",
        metavar="COUNT",
        help="Most events of one trace file, e.g. 200M (default 64M, and for gzip files 512K per MiB "
        "compressed; $KSCOPE_MAX_TRACE_EVENTS, $KSCOPE_MAX_GZIP_EVENTS_PER_MIB).",
    ),
) -> None:
    if version:
        typer.echo(__version__)
        raise typer.Exit(0)
    if max_trace_bytes is not None:
        from kinetoscope.trace.limits import set_max_trace_bytes

        set_max_trace_bytes(max_trace_bytes)
    if max_trace_events is not None:
        from kinetoscope.trace.limits import set_max_trace_events

        set_max_trace_events(max_trace_events)


def main() -> None:
    """Run the CLI; user-facing errors (a bad option too) become one line on stderr and a
    non-zero exit status, never a traceback or a boxed usage panel. A crash in native code
    (SIGSEGV, SIGABRT, ...) prints every thread's Python stack to stderr before the process
    dies, so a report has more to go on than an exit status of -11."""
    _enable_faulthandler()
    try:
        rv = app(standalone_mode=False, prog_name="kscope")
    except KinetoscopeError as exc:
        _print_error(str(exc))
        sys.exit(exc.exit_code)
    except _click.exceptions.NoArgsIsHelpError as exc:  # bare `kscope` / `kscope catalog`: the help
        if exc.format_message().strip():  # Rich has printed it already; plain click returns it
            print(exc.format_message(), file=sys.stderr)
        sys.exit(exc.exit_code)
    except _click.exceptions.ClickException as exc:  # unknown option, bad value, missing argument
        _print_error(_usage_message(exc))
        sys.exit(exc.exit_code)
    except typer.Abort:
        print("aborted", file=sys.stderr)
        sys.exit(1)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        sys.exit(130)
    sys.exit(rv if isinstance(rv, int) else 0)


def _enable_faulthandler() -> None:
    try:
        faulthandler.enable(file=sys.stderr, all_threads=True)
    except (AttributeError, ValueError, OSError):  # stderr closed or not a real file: nothing to print to
        pass


def _usage_message(exc: _click.exceptions.ClickException) -> str:
    """Click's message plus where to look: ``No such option: -x (see: kscope analyze --help)``."""
    ctx = getattr(exc, "ctx", None)
    where = f" (see: {ctx.command_path} --help)" if ctx is not None else ""
    return " ".join(exc.format_message().split()) + where


def _print_error(message: str) -> None:
    """``error: <message>`` on stderr, on one line whatever the terminal width."""
    from rich.console import Console
    from rich.markup import escape

    err = Console(stderr=True)
    err.print(f"[bold red]error:[/] {escape(message)}", highlight=False, markup=True, soft_wrap=True)


if __name__ == "__main__":
    main()
