"""`kscope diff A B`: which ops and kernels were added, removed or changed between two traces.

The work is in ``kinetoscope.analysis.trace_diff``; this module parses arguments, loads the two
traces and renders a table or one JSON document (key ``trace_diff``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

import typer
from rich.console import Console

from kinetoscope.cli.examples import examples
from kinetoscope.errors import KinetoscopeError, UsageError
from kinetoscope.termtext import Col, num, print_table, print_wrapped, table, text
from kinetoscope.units import fmt_compact, fmt_signed

EXAMPLES = examples(
    ("kscope diff before.json after.json", "ops and kernels added, removed, changed"),
    ("kscope diff run1/ run2/ --rank 0 --top 20", "rank 0 of two trace folders"),
)


MAX_NAME = 80


def _pick(path: Path, rank: int | None, what: str) -> Any:
    """One trace from a file, or from a directory of traces (then ``rank`` picks it)."""
    from kinetoscope import trace as ktrace

    if not path.exists():
        raise UsageError(f"{what}: {path} does not exist")
    if path.is_file():
        t = ktrace.load_trace(str(path))
        if rank is not None and t.meta.rank is not None and t.meta.rank != rank:
            raise UsageError(f"{what}: {path} holds rank {t.meta.rank}, not {rank}")
        return t
    try:
        from kinetoscope.trace.loader import load_traces

        traces = list(load_traces([str(path)]))
    except ImportError:  # pragma: no cover - older loader
        files = sorted(
            f
            for f in path.iterdir()
            if f.is_file() and f.name.endswith((".json", ".json.gz")) and not f.name.startswith("manifest")
        )
        traces = [ktrace.load_trace(str(f)) for f in files]
    if not traces:
        raise UsageError(f"{what}: no trace files in {path}")
    if rank is None:
        if len(traces) > 1:
            ranks = sorted({t.meta.rank for t in traces if t.meta.rank is not None})
            raise UsageError(
                f"{what}: {path} holds {len(traces)} traces (ranks {ranks}); choose one with --rank"
            )
        return traces[0]
    for t in traces:
        if t.meta.rank == rank:
            return t
    raise UsageError(f"{what}: no trace of rank {rank} in {path}")


def _parse_step(text: str | None) -> Any:
    if text is None or text == "":
        return None
    if text in ("first", "each"):
        return text
    try:
        return int(text)
    except ValueError:
        raise UsageError(f"--step: expected a step number, 'first' or 'each', got {text!r}") from None


def register(app: typer.Typer) -> None:
    @app.command("diff", epilog=EXAMPLES)
    def diff(
        control: Path = typer.Argument(..., help="Control trace (file, or directory of traces with --rank)."),
        test: Path = typer.Argument(..., help="Test trace (file, or directory of traces with --rank)."),
        rank: Optional[int] = typer.Option(
            None, "--rank", help="Rank to compare when a path is a directory (both sides)."
        ),
        control_rank: Optional[int] = typer.Option(
            None, "--control-rank", help="Rank of the control side (overrides --rank)."
        ),
        test_rank: Optional[int] = typer.Option(
            None, "--test-rank", help="Rank of the test side (overrides --rank)."
        ),
        step: Optional[str] = typer.Option(
            None,
            "--step",
            help="Compare one step: a ProfilerStep number, 'first' (HTA's default), or 'each' (one diff per common step). Default: whole traces.",
        ),
        device: str = typer.Option(
            "all", "--device", help="all, cpu (CPU ops and runtime calls) or gpu (kernels, memcpy, memset)."
        ),
        short_names: bool = typer.Option(
            False, "--short-names", help="Group by names without template/argument lists."
        ),
        top: int = typer.Option(25, "--top", help="Rows to show (largest duration change first); 0 = all."),
        as_json: bool = typer.Option(
            False, "--json", help="Print one JSON document (key trace_diff) instead of tables."
        ),
    ) -> None:
        """Compare two traces: op/kernel counts and durations added, removed and changed."""
        from kinetoscope.analysis import trace_diff as td

        if device not in ("all", "cpu", "gpu"):
            raise UsageError("--device must be all, cpu or gpu")
        sel = _parse_step(step)
        a = _pick(control, control_rank if control_rank is not None else rank, "control")
        b = _pick(test, test_rank if test_rank is not None else rank, "test")
        try:
            if sel == "each":
                df = td.trace_diff_by_step(a, b, device=device, use_short_name=short_names)
            else:
                df = td.trace_diff(a, b, step=sel, device=device, use_short_name=short_names)
        except ValueError as exc:
            raise KinetoscopeError(str(exc)) from None
        options = {"step": sel, "device": device, "short_names": short_names}
        doc = td.diff_document(a, b, df, options=options)
        if as_json:
            typer.echo(json.dumps(doc, default=str))
            return
        _render(_console(), a, b, df, doc, top)


def _render(console: Console, a: Any, b: Any, df: Any, doc: dict[str, Any], top: int) -> None:
    """The two traces, the totals, then the largest changes (numbers whole, names wrapped)."""

    def label(t: Any) -> str:
        r = "?" if t.meta.rank is None else str(t.meta.rank)
        return f"{t.path} (rank {r})"

    print_wrapped(console, ["control", label(a)], indent="", subsequent="  ")
    print_wrapped(console, ["test   ", label(b)], indent="", subsequent="  ")
    opts = doc["options"]
    sel = "whole traces" if opts["step"] is None else f"step {opts['step']}"
    print_wrapped(console, f"selection: {sel}, device={opts['device']}", indent="")
    tot = doc["totals"]
    counts = ", ".join(f"{tot[k]} {k}" for k in ("added", "deleted", "increased", "decreased", "unchanged"))
    print_wrapped(console, f"names by count: {counts}", indent="", subsequent="  ")
    gpu_line = _gpu_line(df)
    if gpu_line:
        print_wrapped(console, gpu_line, indent="", subsequent="  ")
    if df.is_empty():
        console.print("no events selected")
        return
    _changes(console, df, top)


def _gpu_line(df: Any) -> str | None:
    """Total GPU time of both sides, when the diff has GPU rows."""
    import polars as pl

    cols = [c for c in df.columns if c.endswith("_total_duration")]
    if not (df.height and len(cols) == 2):
        return None
    gpu = df.filter(pl.col("device") == "gpu")
    if not gpu.height:
        return None
    ca, cb = float(gpu[cols[0]].sum()), float(gpu[cols[1]].sum())
    pct = f" ({(cb - ca) * 100 / ca:+.1f}%)" if ca else ""
    return f"GPU time (sum of kernel/memcpy/memset durations): {ca:,.0f} us -> {cb:,.0f} us{pct}"


def _changes(console: Console, df: Any, top: int) -> None:
    """The largest changes: numbers first (whole), the op/kernel name last, wrapped between words
    (names longer than MAX_NAME lose their template and argument lists, never their ends)."""
    from kinetoscope.analysis.names import shorten_name

    shown = df if top <= 0 else df.head(top)
    counts = [c for c in df.columns if c.endswith("_counts") and c != "diff_counts"]
    durations = [c for c in df.columns if c.endswith("_total_duration")]
    has_step = "step" in df.columns
    cols = [num("step")] if has_step else []
    cols += [Col("dev")] + [num(c.replace("_counts", " n").lower()) for c in counts]
    cols += [num(c.replace("_total_duration", " us").lower()) for c in durations]
    cols += [num("diff us"), Col("count"), text("name")]
    rows = []
    for r in shown.iter_rows(named=True):
        name = shorten_name(r["name"]) if len(r["name"]) > MAX_NAME else r["name"]
        row = ([str(r["step"])] if has_step else []) + [r["device"]]
        row += [fmt_compact(r[c]) for c in counts] + [fmt_compact(r[c]) for c in durations]
        row += [fmt_signed(r["diff_duration"]), r["count_change"], name]
        rows.append(row)
    print_wrapped(console, f"Largest changes ({shown.height} of {df.height} names)", indent="", style="bold")
    print_table(console, table(None, cols, rows))


def _console() -> Console:
    """Stdout: the terminal's width, $COLUMNS, else 200 columns when piped."""
    import os

    out = Console(highlight=False)
    return out if out.is_terminal or "COLUMNS" in os.environ else Console(highlight=False, width=200)
