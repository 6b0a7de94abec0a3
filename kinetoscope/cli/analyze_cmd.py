"""`kscope analyze`: load traces, run the registered analyses, render tables or one JSON document.

All the work is in the library: the arguments become one ``AnalyzeRequest`` and
``kinetoscope.orchestration.analyze`` runs it (inputs resolved, then ``kinetoscope.scale.run_analysis``,
the one orchestration for every backend); this module only parses arguments and renders.
"""

from __future__ import annotations

import json
import math
import os
import sys
from typing import TYPE_CHECKING, Any

import typer
from rich.console import Console
from rich.markup import escape

from kinetoscope.cli.examples import examples
from kinetoscope.errors import UsageError
from kinetoscope.termtext import Col, num, print_table, print_wrapped, table, text

if TYPE_CHECKING:
    from kinetoscope.document import AnalysisDocument

EXAMPLES = examples(
    ("kscope analyze run/traces/kst-20261121-053012-3f9a/", "verdict, then the tables"),
    ("kscope analyze kst-20261121-053012-3f9a --json > doc.json", "a catalog trace id"),
    ("kscope analyze trace.json --only kernel_breakdown --full", "one table, up to 25 rows"),
)


MAX_ROWS = 25  # rows per table with --full
COMPACT_ROWS = 10  # rows per table by default: the output should fit a screen or two
MAX_NAME = 70


def _parse_ranks(text: str | None) -> set[int] | None:
    if not text:
        return None
    out: set[int] = set()
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        try:
            if "-" in part[1:]:
                a, b = part.split("-", 1)
                out.update(range(int(a), int(b) + 1))
            else:
                out.add(int(part))
        except ValueError:
            raise UsageError(f"--ranks: {part!r} is not a rank or a range like 0-3") from None
    return out


def _parse_options(items: list[str]) -> dict[str, Any]:
    opts: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise UsageError(f"--option: expected KEY=VALUE, got {item!r}")
        try:
            value: Any = json.loads(raw)
        except json.JSONDecodeError:
            value = raw
        opts[key.strip()] = value
    return opts


_TIME_COLS = ("start(us)", "end(us)", "ts", "ts(us)")
_NAME_COLS = ("name", "launch_name", "user_annotation")


def _fmt(v: Any, col: str) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        if math.isnan(v):
            return "-"
        if col.endswith("pctg") or col == "percentage":
            return f"{v:.2f}"
        if v != 0 and abs(v) < 1:
            return f"{v:.4g}"
        if float(v).is_integer():
            return f"{int(v):,}"
        return f"{v:,.2f}"
    if isinstance(v, int) and not isinstance(v, bool):
        return str(v) if col in ("rank", "stream", "step", "correlation", "idx", "pid", "tid") else f"{v:,}"
    s = str(v)
    return s if len(s) <= MAX_NAME else s[: MAX_NAME - 1] + "…"


def _render_human(
    console: Console,
    traces: list[Any],
    doc: dict[str, Any],
    results: Any,
    *,
    show_all: bool,
    max_rows: int = MAX_ROWS,
) -> None:
    """Verdict first, then the traces and the analysis tables that have rows; ``show_all`` adds the
    empty ones and longer tables."""
    from kinetoscope.analysis import registry
    from kinetoscope.document import decode

    typed = decode(doc)
    if typed.summary_lines:
        console.print("[bold]Diagnosis[/]")
        for line in typed.summary_lines:  # wrapped between words; numbers and ids stay whole
            print_wrapped(console, line, indent="  ", subsequent="    ")
        console.print()
        from kinetoscope.cli.diagnosis_text import render_rich

        render_rich(console, typed if show_all else _compact_diagnosis(typed))
        console.print()

    _print_traces(console, traces)

    quiet: dict[str, list[str]] = {}  # note -> analyses with nothing to show
    for name, df in results.items():
        spec = registry.get(name)
        title = f"{name} — {spec.description}"
        if name in results.errors:
            console.print()
            print_wrapped(console, title, indent="", subsequent="  ")
            print_wrapped(console, f"failed: {results.errors[name]}", indent="  ", style="red")
            continue
        if df.is_empty():
            note = results.notes.get(name, "no rows")
            if not show_all:
                quiet.setdefault(note, []).append(name)
                continue
            console.print()
            print_wrapped(console, title, indent="", subsequent="  ")
            print_wrapped(console, note, indent="  ")
            continue
        console.print()
        _print_table(console, title, df, max_rows if show_all else min(max_rows, COMPACT_ROWS))
    if quiet:
        console.print()
        for note, names in quiet.items():
            print_wrapped(
                console, f"nothing to show ({note.rstrip('.')}): {', '.join(names)}", indent="", style="dim"
            )
        console.print("[dim]--full prints every table; --json has every row[/]", highlight=False)
    if "diagnosis" in results.errors:
        console.print()
        print_wrapped(console, f"diagnosis failed: {results.errors['diagnosis']}", indent="", style="red")


def _compact_diagnosis(doc: AnalysisDocument) -> AnalysisDocument:
    """The diagnosis tables worth a screen by default: the per-rank straggler table and the job
    line. The per-step what-if, the clock offsets, an MFU with no value and the recommendations
    table (its actions are in the verdict lines above) print with ``--full``. A copy: the JSON
    document stays complete."""
    from msgspec.structs import replace

    strag = replace(doc.stragglers, per_step=[]) if doc.stragglers is not None else None
    job = replace(doc.job, clock=None) if doc.job is not None else None
    mfu = doc.mfu if doc.mfu is not None and doc.mfu.mfu is not None else None
    return replace(doc, stragglers=strag, job=job, mfu=mfu, recommendations=None)


def _print_traces(console: Console, traces: list[Any]) -> None:
    """One line per trace file: rank, device, events, file name, under the folder they share.
    Not a table: a table column folds a long path mid-token on an 80-column terminal, and a path
    must stay whole to be copied."""
    paths = [str(tr.meta.path) for tr in traces]
    folder = os.path.commonpath([os.path.dirname(p) for p in paths]) if paths else ""
    print_wrapped(
        console, ["Traces in", f"{folder}{os.sep}"] if folder else "Traces", indent="", style="bold"
    )
    for tr, path in zip(traces, paths):
        m = tr.meta
        rank = "?" if m.rank is None else str(m.rank)
        if m.rank is not None and m.rank_source not in ("distributedInfo",):
            rank += f" ({m.rank_source})"
        name = os.path.relpath(path, folder) if folder else path
        parts = [f"rank {rank}", str(m.device_type), f"{m.num_trace_events:,} events", name]
        print_wrapped(console, parts, indent="  ", subsequent="    ", sep="  ")
    for tr in traces:
        for w in tr.meta.warnings:
            print_wrapped(
                console, f"warning: {tr.meta.path}: {w}", indent="", subsequent="  ", style="yellow"
            )


def _print_table(console: Console, title: str, df: Any, max_rows: int) -> None:
    """One analysis result as a Rich table of at most ``max_rows`` rows (ids and paths whole)."""
    from kinetoscope.analysis.names import display_name

    shown = df.head(max_rows)
    # Absolute trace-clock times are unreadable: show them relative to the first one.
    times = [c for c in _TIME_COLS if c in shown.columns]
    if times:
        base = min(v for c in times for v in shown[c].to_list() if v is not None)
        shown = shown.with_columns([(shown[c] - base).alias(c) for c in times]).rename(
            {c: f"{c} from {base:,.0f}" if c == times[0] else c for c in times}
        )
    cols = [_column(c, shown.schema[c].is_numeric()) for c in shown.columns]
    rows = []
    for row in shown.iter_rows():
        cells = []
        for v, c in zip(row, shown.columns):
            if c in _NAME_COLS and isinstance(v, str):
                v = display_name(v)
            cells.append(_fmt(v, c))
        rows.append(cells)
    print_wrapped(console, title, indent="", subsequent="  ")
    print_table(console, table(None, cols, rows))
    if df.height > max_rows:
        console.print(
            f"  … {df.height - max_rows:,} more rows (--full for {MAX_ROWS}, --json for all)", highlight=False
        )


def _column(name: str, numeric: bool) -> Col:
    """A column of an analysis table: numbers and ids whole, names (kernels, ops) as prose; the
    header with spaces for underscores so that it can wrap between words."""
    header = name.replace("_", " ")
    if numeric:
        return num(header)
    return text(header) if name in _NAME_COLS or name.endswith(("name", "description")) else Col(header)


def _output(
    out: Console, as_json: bool, traces: list[Any], doc: dict[str, Any], results: Any, show_all: bool = False
) -> None:
    if as_json:
        import orjson

        sys.stdout.buffer.write(orjson.dumps(doc, option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY))
        sys.stdout.buffer.write(b"\n")
        sys.stdout.flush()
    else:
        _render_human(out, traces, doc, results, show_all=show_all)


def _run(request: Any, catalog_url: str | None) -> Any:
    """Resolve and analyse (``kinetoscope.orchestration.analyze``: the one orchestration, whatever the
    backend), saying on stderr which backend ran and why, with a progress bar of ranks done /
    failed when there are several; each rank that failed is an error line, not a failed command."""
    from kinetoscope.orchestration import analyze

    err = Console(stderr=True, highlight=False)

    def on_backend(backend: str, why: str, n_files: int) -> None:
        # what --backend auto chose: a pool or Ray always, this process only on a terminal;
        # Ray (chosen or asked for) also says which nodes the tasks go to
        auto = request.backend == "auto" and (backend != "single" or (n_files > 1 and err.is_terminal))
        if auto or backend == "ray":
            err.print(f"[dim]backend {backend}: {escape(why)}[/]", soft_wrap=True)

    if not err.is_terminal:  # no progress bar to draw: not even its import (start-up time)
        run = analyze(request, on_backend=on_backend)
    else:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        columns = (
            TextColumn("ranks"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[failed]} failed"),
            TimeElapsedColumn(),
        )
        with Progress(*columns, console=err, transient=True) as bar:
            task = bar.add_task("map", total=None, failed=0)
            run = analyze(
                request,
                progress=lambda done, failed, total: bar.update(
                    task, completed=done, total=total, failed=failed
                ),
                on_backend=on_backend,
            )
    for note in run.scale.notes:  # e.g. Ray tasks resubmitted after their node was lost
        err.print(f"[dim]{escape(note)}[/]", soft_wrap=True)
    for why in run.scale.load_errors.values():
        err.print(f"[red]error:[/] not analysed: {escape(str(why))}", soft_wrap=True)
    return run


def _record(doc: dict[str, Any], resolved: Any, catalog_url: str | None, *, quiet: bool) -> None:
    """Record the analysis in the catalog; a catalog problem is a warning, never a failed analysis."""
    from rich.markup import escape

    from kinetoscope.errors import KinetoscopeError
    from kinetoscope.orchestration import AnalysisRun, record_run

    err = Console(stderr=True, highlight=False, soft_wrap=True)  # one line per message
    run = AnalysisRun(document=doc, paths=resolved.paths, inputs=resolved.inputs, trace_id=resolved.trace_id)
    try:
        from kinetoscope.store import Catalog

        with Catalog.open(catalog_url) as cat:
            rec = record_run(cat, run)
            where = cat.display_url
    except (KinetoscopeError, OSError) as exc:
        err.print(f"[yellow]warning:[/] analysis not recorded in the catalog: {escape(str(exc))}")
        return
    if not quiet:
        err.print(
            f"recorded analysis {rec.id} in {escape(where)}"
            + (f" (trace {escape(run.trace_id)})" if run.trace_id else "")
        )


def _print_flight_recorder(out: Console, report: Any, as_json: bool) -> None:
    """The Flight Recorder verdict: one line per process group with a rank stuck in it."""
    if as_json:
        sys.stdout.write(json.dumps({"flight_recorder": report.to_json()}, indent=2) + "\n")
        return
    print_wrapped(
        out,
        f"Flight Recorder ({len(report.files)} dumps, ranks {_ranks_text(report.ranks)})",
        indent="",
        style="bold",
    )
    for g in report.groups:
        print_wrapped(
            out, g.summary, indent="", subsequent="  ", style="bold red" if g.never_entered else None
        )
    if not report.groups:
        print_wrapped(out, report.verdict, indent="", subsequent="  ")


def _ranks_text(ranks: list[int]) -> str:
    return ",".join(map(str, ranks))


def register(app: typer.Typer) -> None:
    @app.command("analyze", epilog=EXAMPLES)
    def analyze(
        inputs: list[str] = typer.Argument(
            None,
            metavar="[INPUT]...",
            help="Trace files (.json / .json.gz), folders of them (one rank each), storage URLs "
            "(s3://.../<trace_id>) or catalog trace ids.",
            show_default=False,
        ),
        ranks: str | None = typer.Option(
            None, "--ranks", metavar="LIST", help="Only these ranks, e.g. 0,1,4-7."
        ),
        only: list[str] = typer.Option(
            None, "--only", metavar="NAME", help="Run only this analysis (repeatable). See --list for names."
        ),
        as_json: bool = typer.Option(False, "--json", help="Print one JSON document instead of tables."),
        no_cache: bool = typer.Option(False, "--no-cache", help="Parse the files again, ignoring the cache."),
        salvage: bool = typer.Option(
            False, "--salvage", help="Keep the complete events of damaged/truncated files."
        ),
        option: list[str] = typer.Option(
            None,
            "--option",
            metavar="KEY=VALUE",
            help="Analysis option (repeatable), e.g. --option num_kernels=20. (-o means output in every command.)",
        ),
        list_: bool = typer.Option(False, "--list", help="List the analyses and exit."),
        show_all: bool = typer.Option(
            False,
            "--full",
            help="Print every analysis table, the empty ones too, up to 25 rows each "
            "(default: the verdict and the tables with rows, 10 rows each). --json is always complete. "
            "(Was --all, which now warns.)",
        ),
        model_flops: float | None = typer.Option(
            None,
            "--model-flops",
            metavar="FLOPS",
            help="FLOPs of one global training step for MFU, e.g. 6*tokens_per_batch*num_params.",
        ),
        peak_flops: float | None = typer.Option(
            None,
            "--peak-flops",
            metavar="FLOPS",
            help="Peak FLOP/s of one device for MFU (overrides the built-in table; needed on CPU).",
        ),
        catalog: str | None = typer.Option(
            None,
            "--catalog",
            metavar="URL",
            help="Catalog URL for trace ids and for recording the analysis "
            "(default: $KSCOPE_CATALOG, else ~/.kinetoscope/catalog.db).",
        ),
        backend: str = typer.Option(
            "auto",
            "--backend",
            metavar="NAME",
            help="Where the per-rank work runs: 'single' (this process), 'local' (process pool, "
            "one rank per worker), 'ray', or 'auto': Ray when --ray-address or $RAY_ADDRESS is given, this process "
            "for up to 4 rank files or 128 MiB of JSON, else the local pool (it says which and why). See docs/scale.md.",
        ),
        workers: int | None = typer.Option(
            None,
            "--workers",
            metavar="N",
            min=1,
            help="Worker processes (local) or local Ray CPUs (default: CPU count).",
        ),
        ray_address: str | None = typer.Option(
            None,
            "--ray-address",
            metavar="ADDRESS",
            help="The Ray cluster to join (default: $RAY_ADDRESS; with --backend ray and "
            "neither, a local Ray is started).",
        ),
        record: bool | None = typer.Option(
            None,
            "--record/--no-record",
            help="Record the analysis in the catalog. Default: when --catalog or $KSCOPE_CATALOG is given, "
            "or the input is a catalog trace id.",
        ),
        flight_recorder: list[str] = typer.Option(
            None,
            "--flight-recorder",
            metavar="PATH",
            help="PyTorch Flight Recorder dumps (JSON; files or a folder, repeatable): name the ranks that never "
            "entered the collective the others wait in (docs/stacks.md). Alone, or with traces.",
        ),
    ) -> None:
        """Analyse traces: temporal, idle-time, kernel and overlap breakdowns and more (HTA-compatible)."""
        out = _console()
        if list_:
            _print_analyses(out)
            return
        fr_report = None
        if flight_recorder:
            from kinetoscope.diagnosis.flight_recorder import analyse as fr_analyse

            fr_report = fr_analyse(flight_recorder)
            if not inputs:
                _print_flight_recorder(out, fr_report, as_json)
                return
        if not inputs:
            raise UsageError(
                "give at least one trace file, folder, storage URL or trace id (kscope analyze PATH ...)"
            )
        from kinetoscope.orchestration import AnalyzeRequest

        keys = _diagnosis_keys(only or [])
        request = AnalyzeRequest.from_only(
            only or [],
            keys,
            inputs=tuple(inputs),
            options=_parse_options(option or []),
            ranks=_parse_ranks(ranks),
            model_flops=model_flops,
            peak_flops=peak_flops,
            cache=not no_cache,
            salvage=salvage,
            catalog_url=catalog,
            backend=backend,
            workers=workers,
            ray_address=ray_address,
        )
        run = _run(request, catalog)
        _finish(out, run, fr_report, as_json=as_json, show_all=show_all, record=record, catalog=catalog)


def _console() -> Console:
    """Stdout for human output: the terminal's width, $COLUMNS, else 200 columns when piped."""
    out = Console(highlight=False, soft_wrap=False)
    if not out.is_terminal and "COLUMNS" not in os.environ:  # piped: wide tables, unless told
        out = Console(highlight=False, soft_wrap=False, width=200)
    return out


def _print_analyses(out: Console) -> None:
    """``--list``: every registered analysis, whether it runs by default, whether it needs a GPU."""
    from kinetoscope.analysis import registry

    rows = [
        [s.name, "yes" if s.default else "", "yes" if s.needs_gpu else "", s.description]
        for s in registry.all_specs()
    ]
    out.print("Analyses", style="bold")
    print_table(out, table(None, [Col("name"), Col("default"), Col("needs GPU"), text("description")], rows))


def _diagnosis_keys(only: list[str]) -> tuple[str, ...]:
    """The diagnosis keys ``--only`` may name; a name that is neither one nor an analysis fails."""
    from kinetoscope.analysis import registry
    from kinetoscope.document.model import DIAGNOSIS_KEYS as BASE_KEYS
    from kinetoscope.document.model import EXTRA_DIAGNOSIS_KEYS

    keys = (*BASE_KEYS, *EXTRA_DIAGNOSIS_KEYS)
    known = set(registry.names())
    for n in only:
        if n not in keys and n not in known:
            raise UsageError(
                f"--only: unknown analysis {n!r}; known: {', '.join([*registry.names(), *keys])}"
            )
    return keys


def _finish(
    out: Console,
    run: Any,
    fr_report: Any,
    *,
    as_json: bool,
    show_all: bool,
    record: bool | None,
    catalog: str | None,
) -> None:
    """Print the run (tables or JSON), record it when asked or implied, exit 1 if an analysis failed."""
    doc = run.document
    traces, results = run.scale.traces, run.scale.results
    if fr_report is not None:
        doc["flight_recorder"] = fr_report.to_json()
    _output(out, as_json, traces, doc, results, show_all)
    if fr_report is not None and not as_json:
        _print_flight_recorder(out, fr_report, False)
    want_record = (
        record if record is not None else bool(catalog or os.environ.get("KSCOPE_CATALOG") or run.trace_id)
    )
    if want_record:
        _record(doc, run, catalog, quiet=as_json)
    if results.errors:
        raise typer.Exit(1)
