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
from typing import Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from kinetoscope.cli.examples import examples
from kinetoscope.errors import UsageError

EXAMPLES = examples(
    ("kscope analyze run/traces/kst-20261121-053012-3f9a/", "verdict, then the tables"),
    ("kscope analyze kst-20261121-053012-3f9a --json > doc.json", "a catalog trace id"),
    ("kscope analyze trace.json --only kernel_breakdown --all", "one table, every row up to 25"),
)


MAX_ROWS = 25  # rows per table with --all
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

    summary = doc.get("diagnosis_summary")
    if summary:
        console.print("[bold]Diagnosis[/]")
        for line in summary:  # soft-wrapped: one verdict line stays one line when piped
            console.print(f"  {escape(str(line))}", highlight=False, soft_wrap=True)
        console.print()
        from kinetoscope.diagnosis.render import render_rich

        render_rich(console, doc if show_all else _compact_diagnosis(doc))
        console.print()

    _print_traces(console, traces)

    quiet: dict[str, list[str]] = {}  # note -> analyses with nothing to show
    for name, df in results.items():
        spec = registry.get(name)
        title = f"[bold]{name}[/] — {spec.description}"
        if name in results.errors:
            console.print()
            console.print(title)
            console.print(f"  [red]failed:[/] {escape(str(results.errors[name]))}", highlight=False)
            continue
        if df.is_empty():
            note = results.notes.get(name, "no rows")
            if not show_all:
                quiet.setdefault(note, []).append(name)
                continue
            console.print()
            console.print(title)
            console.print(f"  {escape(note)}", highlight=False)
            continue
        console.print()
        _print_table(console, title, df, max_rows if show_all else min(max_rows, COMPACT_ROWS))
    if quiet:
        console.print()
        for note, names in quiet.items():
            console.print(
                f"[dim]nothing to show ({escape(note.rstrip('.'))}): {', '.join(names)}[/]", highlight=False
            )
        console.print("[dim]--all prints every table in full; --json has every row[/]", highlight=False)
    if "diagnosis" in results.errors:
        console.print(
            f"\n[red]diagnosis failed:[/] {escape(str(results.errors['diagnosis']))}", highlight=False
        )


def _compact_diagnosis(doc: dict[str, Any]) -> dict[str, Any]:
    """The diagnosis tables worth a screen by default: the per-rank straggler table and the job
    line. The per-step what-if, the clock offsets, an MFU with no value and the recommendations
    table (its actions are in the verdict lines above) print with ``--all``. A shallow copy:
    the JSON document stays complete."""
    out = dict(doc)
    strag = out.get("stragglers")
    if isinstance(strag, dict):
        out["stragglers"] = {k: v for k, v in strag.items() if k != "per_step"}
    job = out.get("job")
    if isinstance(job, dict):
        out["job"] = {k: v for k, v in job.items() if k != "clock"}
    mfu = out.get("mfu")
    if isinstance(mfu, dict) and mfu.get("mfu") is None:
        out.pop("mfu")
    out.pop("recommendations", None)
    return out


def _print_traces(console: Console, traces: list[Any]) -> None:
    """One line per trace file: rank, device, events, path. Not a table: a table column folds a
    long path mid-token on an 80-column terminal, and a path must stay whole to be copied."""
    console.print("[bold]Traces[/]")
    for tr in traces:
        m = tr.meta
        rank = "?" if m.rank is None else str(m.rank)
        if m.rank is not None and m.rank_source not in ("distributedInfo",):
            rank += f" ({m.rank_source})"
        console.print(
            f"  rank {escape(rank)}  {m.device_type}  {m.num_trace_events:,} events  {escape(str(m.path))}",
            highlight=False,
            soft_wrap=True,
        )
    for tr in traces:
        for w in tr.meta.warnings:
            console.print(
                f"[yellow]warning:[/] {escape(str(tr.meta.path))}: {escape(str(w))}",
                highlight=False,
                soft_wrap=True,
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
    table = Table(title=title, title_justify="left")
    for col in shown.columns:
        numeric = shown.schema[col].is_numeric()
        table.add_column(col, justify="right" if numeric else "left", overflow="fold")
    for row in shown.iter_rows():
        cells = []
        for v, c in zip(row, shown.columns):
            if c in _NAME_COLS and isinstance(v, str):
                v = display_name(v)
            cells.append(_fmt(v, c))
        table.add_row(*cells)
    console.print(table)
    if df.height > max_rows:
        console.print(
            f"  … {df.height - max_rows:,} more rows (--all for {MAX_ROWS}, --json for all)", highlight=False
        )


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

    err = Console(stderr=True, highlight=False)
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
    out.print(
        f"[bold]Flight Recorder[/] ({len(report.files)} dumps, ranks {escape(_ranks_text(report.ranks))})"
    )
    for g in report.groups:
        out.print(
            ("[bold red]" if g.never_entered else "") + escape(g.summary) + ("[/]" if g.never_entered else "")
        )
    if not report.groups:
        out.print(escape(report.verdict))


def _ranks_text(ranks: list[int]) -> str:
    return ",".join(map(str, ranks))


def register(app: typer.Typer) -> None:
    @app.command("analyze", epilog=EXAMPLES)
    def analyze(
        inputs: list[str] = typer.Argument(
            None,
            help="Trace files (.json / .json.gz), folders of them (one rank each), storage URLs "
            "(s3://.../<trace_id>) or catalog trace ids.",
            show_default=False,
        ),
        ranks: str | None = typer.Option(None, "--ranks", help="Only these ranks, e.g. 0,1,4-7."),
        only: list[str] = typer.Option(
            None, "--only", help="Run only this analysis (repeatable). See --list for names."
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
            "--all",
            help="Print every analysis table, the empty ones too, up to 25 rows each "
            "(default: the verdict and the tables with rows, 10 rows each). --json is always complete.",
        ),
        model_flops: float | None = typer.Option(
            None,
            "--model-flops",
            help="FLOPs of one global training step for MFU, e.g. 6*tokens_per_batch*num_params.",
        ),
        peak_flops: float | None = typer.Option(
            None,
            "--peak-flops",
            help="Peak FLOP/s of one device for MFU (overrides the built-in table; needed on CPU).",
        ),
        catalog: str | None = typer.Option(
            None,
            "--catalog",
            help="Catalog URL for trace ids and for recording the analysis "
            "(default: $KSCOPE_CATALOG, else ~/.kinetoscope/catalog.db).",
        ),
        backend: str = typer.Option(
            "auto",
            "--backend",
            help="Where the per-rank work runs: 'single' (this process), 'local' (process pool, "
            "one rank per worker), 'ray', or 'auto': Ray when --ray-address or $RAY_ADDRESS is given, this process "
            "for up to 4 rank files or 128 MiB of JSON, else the local pool (it says which and why). See docs/scale.md.",
        ),
        workers: int | None = typer.Option(
            None,
            "--workers",
            min=1,
            help="Worker processes (local) or local Ray CPUs (default: CPU count).",
        ),
        ray_address: str | None = typer.Option(
            None,
            "--ray-address",
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
        from kinetoscope.analysis import registry

        out = Console(highlight=False, soft_wrap=False)
        if not out.is_terminal and "COLUMNS" not in os.environ:  # piped: wide tables, unless told
            out = Console(highlight=False, soft_wrap=False, width=200)
        if list_:
            t = Table(title="Analyses", title_justify="left")
            for c in ("name", "default", "needs GPU", "description"):
                t.add_column(c)
            for s in registry.all_specs():
                t.add_row(s.name, "yes" if s.default else "", "yes" if s.needs_gpu else "", s.description)
            out.print(t)
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
        from kinetoscope.document.model import DIAGNOSIS_KEYS as BASE_KEYS
        from kinetoscope.document.model import EXTRA_DIAGNOSIS_KEYS

        DIAGNOSIS_KEYS = (*BASE_KEYS, *EXTRA_DIAGNOSIS_KEYS)
        known = set(registry.names())
        only_analyses = [n for n in only or [] if n not in DIAGNOSIS_KEYS]
        for n in only_analyses:
            if n not in known:
                raise UsageError(
                    f"--only: unknown analysis {n!r}; known: {', '.join([*registry.names(), *DIAGNOSIS_KEYS])}"
                )
        opts = _parse_options(option or [])
        wanted = _parse_ranks(ranks)

        from kinetoscope.orchestration import AnalyzeRequest

        request = AnalyzeRequest.from_only(
            only or [],
            DIAGNOSIS_KEYS,
            inputs=tuple(inputs),
            options=opts,
            ranks=wanted,
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
        resolved, doc = run, run.document
        traces, results = run.scale.traces, run.scale.results
        if fr_report is not None:
            doc["flight_recorder"] = fr_report.to_json()
        _output(out, as_json, traces, doc, results, show_all)
        if fr_report is not None and not as_json:
            _print_flight_recorder(out, fr_report, False)
        want_record = (
            record
            if record is not None
            else bool(catalog or os.environ.get("KSCOPE_CATALOG") or resolved.trace_id)
        )
        if want_record:
            _record(doc, resolved, catalog, quiet=as_json)
        if results.errors:
            raise typer.Exit(1)
