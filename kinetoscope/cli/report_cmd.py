"""`kscope report`: analyse traces (or take an analysis document) and write one offline HTML report.

All the work is in ``kinetoscope.orchestration`` (``analyze_inputs``) and ``kinetoscope.report`` (``render_report``); this module only
parses arguments, records the analysis in the catalog when asked, and prints where the file is.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import typer

from kinetoscope.cli.examples import examples
from kinetoscope.errors import UsageError

EXAMPLES = examples(
    ("kscope report run/traces/kst-20261121-053012-3f9a/ -o report.html", "analyse and write"),
    ("kscope report --document doc.json -o report.html", "from kscope analyze --json"),
)


def register(app: typer.Typer) -> None:
    @app.command("report", epilog=EXAMPLES)
    def report(
        inputs: list[str] = typer.Argument(
            None,
            help="Trace files, folders of them, storage URLs (s3://.../<trace_id>) or catalog trace ids.",
            show_default=False,
        ),
        output: Path = typer.Option(
            Path("kinetoscope-report.html"), "--output", "-o", help="The HTML file to write."
        ),
        catalog: str | None = typer.Option(
            None,
            "--catalog",
            help="Catalog URL for trace ids and for recording the analysis "
            "(default: $KSCOPE_CATALOG, else ~/.kinetoscope/catalog.db).",
        ),
        record: bool | None = typer.Option(
            None,
            "--record/--no-record",
            help="Record the analysis in the catalog. Default: when --catalog or $KSCOPE_CATALOG is given, or the "
            "input is a trace id.",
        ),
        document: Path | None = typer.Option(
            None,
            "--document",
            help="Render this `kscope analyze --json` document instead of analysing traces.",
        ),
        title: str | None = typer.Option(None, "--title", help="Report title."),
        model_flops: float | None = typer.Option(
            None, "--model-flops", help="FLOPs of one global training step (MFU)."
        ),
        peak_flops: float | None = typer.Option(
            None, "--peak-flops", help="Peak FLOP/s of one device (MFU)."
        ),
        max_rows: int = typer.Option(
            50, "--max-rows", help="Rows shown per table (all rows stay in the embedded JSON)."
        ),
        no_cache: bool = typer.Option(
            False, "--no-cache", help="Parse the files again, ignoring the trace cache."
        ),
        salvage: bool = typer.Option(
            False, "--salvage", help="Keep the complete events of damaged/truncated files."
        ),
    ) -> None:
        """Write a self-contained HTML report (diagnosis, step-time breakdown, stragglers, kernels, ...)."""
        from rich.console import Console

        from kinetoscope.orchestration import analyze_inputs
        from kinetoscope.report.render import check_output_path, write_report

        err = Console(stderr=True, highlight=False, soft_wrap=True)
        if document is None and not inputs:
            raise UsageError("give trace files, folders, storage URLs or trace ids (or --document FILE)")
        if document is not None and inputs:
            raise UsageError("give either inputs to analyse or --document, not both")
        if max_rows < 1:
            raise UsageError("--max-rows must be at least 1")
        check_output_path(output)  # before minutes of analysis, not after
        if document is not None:
            run = _load_document(document)
        else:
            with err.status("analysing..."):
                run = analyze_inputs(
                    inputs,
                    catalog_url=catalog,
                    model_flops=model_flops,
                    peak_flops=peak_flops,
                    cache=not no_cache,
                    salvage=salvage,
                )
        path = write_report(run.document, output, title=title, inputs=run.inputs, max_rows=max_rows)
        _say_done(run, path, err, record=record, catalog=catalog, from_document=document is not None)


def _load_document(document: Path) -> Any:
    """An ``analyze --json`` document read back as a run (nothing to record: no traces)."""
    import orjson

    from kinetoscope.orchestration import AnalysisRun

    try:
        doc = orjson.loads(document.read_bytes())
    except (OSError, orjson.JSONDecodeError) as exc:
        raise UsageError(f"--document {document}: cannot read a JSON document ({exc})") from None
    if not isinstance(doc, dict):
        raise UsageError(f"--document {document}: not a JSON object")
    return AnalysisRun(document=doc, paths=[], inputs=[str(document)])


def _say_done(
    run: Any, path: Path, err: Any, *, record: bool | None, catalog: str | None, from_document: bool
) -> None:
    """Warnings, the verdict's first line, the catalog record (when asked or implied), the path."""
    from rich.markup import escape

    from kinetoscope.document import decode
    from kinetoscope.termtext import console, print_wrapped

    out = console()
    doc = decode(run.document)
    for name, msg in doc.errors.items():
        err.print(f"[yellow]warning:[/] {escape(name)}: {escape(msg)}")
    if doc.summary_lines:
        print_wrapped(out, doc.summary_lines[0], indent="", subsequent="  ")
    want_record = (
        record if record is not None else bool(catalog or os.environ.get("KSCOPE_CATALOG") or run.trace_id)
    )
    if want_record and not from_document:
        from kinetoscope.orchestration import record_run
        from kinetoscope.store import Catalog

        with Catalog.open(catalog) as cat:
            rec = record_run(cat, run, report_path=str(path.resolve()))
            where = f"recorded analysis {rec.id} in {cat.display_url}"
            print_wrapped(out, where + (f" (trace {run.trace_id})" if run.trace_id else ""), indent="")
    elif want_record:
        err.print("note: --document is not recorded in the catalog (record the traces' analysis instead)")
    print_wrapped(out, ["report:", str(path)], indent="", subsequent="  ")
