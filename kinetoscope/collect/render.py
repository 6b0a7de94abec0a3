"""Rich renderings of a trace request, shared by ``kscope trace`` and ``kscope demo``."""

from __future__ import annotations

import os

from rich import box
from rich.markup import escape
from rich.table import Table

from kinetoscope.collect.trigger import TraceResult
from kinetoscope.units import fmt_bytes

_STATE_LABELS = {
    "triggered": "traced",
    "busy": "busy (earlier request pending)",
    "limit": "skipped (--process-limit)",
    "launcher": "launcher (skipped)",
}


def short_command(cmdline: str, width: int = 56) -> str:
    """``/venv/bin/python -u -m pkg.mod --a 1`` -> ``python -m pkg.mod --a 1``, cut to ``width``."""
    parts = cmdline.split()
    if not parts:
        return ""
    parts[0] = os.path.basename(parts[0])
    parts = [p for i, p in enumerate(parts) if not (i > 0 and p == "-u")]
    text = " ".join(parts)
    return text if len(text) <= width else text[: width - 1] + "…"


def _table(title: str, compact: bool) -> Table:
    """The look shared by the tables below (``compact``: no box, no title, as in ``kscope demo``)."""
    return Table(
        box=None if compact else box.SIMPLE_HEAD,
        pad_edge=False,
        show_edge=False,
        title=None if compact else title,
        title_justify="left",
    )


def matched_table(result: TraceResult, *, compact: bool = False, show_host: bool | None = None) -> Table:
    if show_host is None:
        show_host = len({m.hostname for m in result.matched}) > 1 or not compact
    table = _table(f"trace {result.trace_id}: {len(result.matched)} process(es) matched", compact)
    if show_host:
        table.add_column("host", no_wrap=True, min_width=4)
    table.add_column("pid", no_wrap=True, min_width=7)
    table.add_column("rank", no_wrap=True, min_width=4)
    if not compact:
        table.add_column("job", no_wrap=True, min_width=3)
    labels = [_STATE_LABELS.get(m.state, m.state) for m in result.matched]
    table.add_column("state", no_wrap=True, min_width=max([5, *map(len, labels)]))
    table.add_column("command", no_wrap=True, overflow="ellipsis", ratio=1)
    for m in result.matched:
        rank = "-" if m.rank is None else (f"{m.rank}/{m.world_size}" if m.world_size else str(m.rank))
        row = [str(m.pid), rank] + ([escape(m.job_id or "-")] if not compact else [])
        row += [_STATE_LABELS.get(m.state, m.state), escape(short_command(m.cmdline))]
        table.add_row(*([escape(m.hostname)] if show_host else []), *row)
    return table


def files_table(result: TraceResult, *, compact: bool = False) -> Table:
    table = _table("trace files", compact)
    hosts = {m.host: m.hostname for m in result.matched}
    show_host = len({f.host for f in result.files}) > 1
    if show_host:
        table.add_column("host", no_wrap=True)
    table.add_column("rank", no_wrap=True, min_width=4)
    table.add_column("pid", no_wrap=True, min_width=7)
    table.add_column("file", overflow="fold", ratio=1)
    table.add_column("size", no_wrap=True, min_width=9)
    table.add_column("complete", no_wrap=True, min_width=8)
    for f in sorted(result.files, key=lambda f: (f.host, f.rank is None, f.rank, f.pid)):
        name = os.path.basename(f.path) if os.path.dirname(f.path) == result.output_dir else f.path
        done = "yes" if f.complete else ("no" if result.waited else "pending")
        row = [
            "-" if f.rank is None else str(f.rank),
            str(f.pid),
            escape(name),
            fmt_bytes(f.bytes, missing="-", thousands=False),
            done,
        ]
        table.add_row(*([escape(hosts.get(f.host, f.host))] if show_host else []), *row)
    return table


def stored_table(result: TraceResult, *, compact: bool = False) -> Table:
    """The objects ``--store`` uploaded: URL, size and sha256 of each (the manifest last)."""
    table = _table(f"stored in {escape(result.store_url or '')}", compact)
    table.add_column("url", overflow="fold", ratio=1)
    table.add_column("bytes", no_wrap=True, justify="right")
    table.add_column("sha256", no_wrap=True)
    for o in result.stored:
        table.add_row(escape(o.url), str(o.bytes), o.sha256)
    return table
