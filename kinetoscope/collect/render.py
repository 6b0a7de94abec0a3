"""Rich renderings of a trace request, shared by ``kscope trace`` and ``kscope demo``."""

from __future__ import annotations

import os
import threading
from types import TracebackType
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, Progress, SpinnerColumn, TaskID, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from kinetoscope.collect.trigger import HostReply, MatchedProcess, TraceFile, TraceResult
from kinetoscope.termtext import Col, num, print_wrapped, table, text
from kinetoscope.termtext import (
    print_titled as print_titled,  # moved to termtext; cli/trace_cmd.py imports it here
)
from kinetoscope.units import fmt_bytes

_STATE_LABELS = {
    "triggered": "traced",
    "busy": "busy (earlier request pending)",
    "limit": "skipped (--process-limit)",
    "launcher": "launcher (skipped)",
}


def short_command(cmdline: str, width: int | None = None) -> str:
    """``/venv/bin/python -u -m pkg.mod --a 1`` -> ``python -m pkg.mod --a 1``, cut to ``width``
    when given (the tables show it whole: it wraps between its words)."""
    parts = cmdline.split()
    if not parts:
        return ""
    parts[0] = os.path.basename(parts[0])
    parts = [p for i, p in enumerate(parts) if not (i > 0 and p == "-u")]
    short = " ".join(parts)
    return short if width is None or len(short) <= width else short[: width - 1] + "…"


def _table(title: str, compact: bool, cols: list[Col], rows: list[list[str]]) -> Table:
    """A table built by :func:`kinetoscope.termtext.table` (values whole, prose wrapped between
    words; print it with :func:`print_titled`). ``compact``: no rules, no title (``kscope demo``).
    Cells are plain text: a ``[`` in a path is not Rich markup."""
    t: Table = table(None if compact else title, cols, [])
    if compact:
        t.box = None
    for row in rows:
        t.add_row(*(Text(cell) for cell in row))
    return t


def matched_table(
    result: TraceResult,
    *,
    compact: bool = False,
    show_host: bool | None = None,
    rows: list[MatchedProcess] | None = None,
    title: str | None = None,
) -> Table:
    """The matched processes (``rows``: only these, e.g. the ones not traced of a large request);
    the command whole, wrapping between its words."""
    matched = result.matched if rows is None else rows
    if show_host is None:
        show_host = len({m.hostname for m in matched}) > 1 or not compact
    cols = [Col("host")] if show_host else []
    cols += [num("pid"), Col("rank")] + ([] if compact else [Col("job")]) + [Col("state"), text("command")]
    cells = []
    for m in matched:
        rank = "-" if m.rank is None else (f"{m.rank}/{m.world_size}" if m.world_size else str(m.rank))
        row = [str(m.pid), rank] + ([m.job_id or "-"] if not compact else [])
        row += [_STATE_LABELS.get(m.state, m.state), short_command(m.cmdline)]
        cells.append(([m.hostname] if show_host else []) + row)
    title = title or f"trace {result.trace_id}: {len(result.matched)} process(es) matched"
    return _table(title, compact, cols, cells)


def files_table(
    result: TraceResult,
    *,
    compact: bool = False,
    rows: list[TraceFile] | None = None,
    title: str | None = None,
) -> Table:
    """The trace files (``rows``: only these, e.g. the incomplete ones of a large request); a
    file in the output folder by its name, else by its whole path (a value: never cut)."""
    files = result.files if rows is None else rows
    hosts = {m.host: m.hostname for m in result.matched}
    show_host = len({f.host for f in result.files}) > 1
    cols = ([Col("host")] if show_host else []) + [Col("rank"), num("pid"), Col("file"), num("size")]
    cols.append(Col("complete"))
    cells = []
    for f in sorted(files, key=lambda f: (f.host, f.rank is None, f.rank, f.pid)):
        name = os.path.basename(f.path) if os.path.dirname(f.path) == result.output_dir else f.path
        done = "yes" if f.complete else ("no" if result.waited else "pending")
        row = ["-" if f.rank is None else str(f.rank), str(f.pid), name]
        row += [fmt_bytes(f.bytes, missing="-", thousands=False), done]
        cells.append(([hosts.get(f.host, f.host)] if show_host else []) + row)
    return _table(title or "trace files", compact, cols, cells)


def _problems(f: dict[str, Any], asked: Any) -> str:
    """What is wrong with one file read back, in words (empty: nothing)."""
    problems = []
    if f.get("empty"):
        problems.append("EMPTY (0 events)")
    if f.get("fell_back_to_duration"):
        problems.append("fell back to a duration trace (no iteration hook)")
    if asked and not f.get("empty") and f["iterations"] < asked:
        problems.append("fewer iterations than asked")
    if f.get("timestamp_anomalies"):
        problems.append(f"{f['timestamp_anomalies']} timestamp anomalies")
    return "; ".join(problems)


def captured_table(captured: dict[str, Any]) -> Table:
    """Per file read back: iterations captured against those asked, events, window, and what is
    wrong with it (``collect.captured``)."""
    cols = [Col("rank"), num("pid"), num("iterations"), num("events"), num("window"), text("problem")]
    cells = []
    for f in sorted(captured.get("files") or [], key=lambda f: (f["rank"] is None, f["rank"] or 0, f["pid"])):
        asked = f.get("iterations_asked")
        its = f"{f['iterations']}/{asked}" if asked else str(f["iterations"])
        window = "-" if f.get("window_ms") is None else f"{f['window_ms'] / 1000.0:.2f} s"
        rank = "-" if f["rank"] is None else str(f["rank"])
        cells.append([rank, str(f["pid"]), its, str(f["events"]), window, _problems(f, asked)])
    return _table("what the files hold", False, cols, cells)


def captured_lines(captured: dict[str, Any]) -> list[str]:
    """The verdict on the set: usable for a cross-rank verdict or not (why, what to run), the
    windows, a job still warming up, and the evidence lines."""
    if not captured.get("checked"):
        return [f"files not read back: {captured.get('why_not')}"]
    out = []
    if captured.get("usable") and captured.get("reason"):
        out.append(f"kept as a duration trace; no cross-rank verdict from it: {captured.get('reason')}")
    elif captured.get("usable"):
        n = captured.get("steps_in_common")
        common = f" ({n} steps held by every rank)" if n is not None else ""
        out.append(f"usable for a verdict{common}")
    else:
        out.append(f"NOT USABLE for a cross-rank verdict: {captured.get('reason')}")
    if captured.get("windows_aligned") is False:
        out.append("windows not aligned: the ranks traced different steps")
    if captured.get("warming_up"):
        out.append(str(captured["warming_up"]))
    if captured.get("command"):
        out.append(f"trace again with: {captured['command']}")
    out += list(captured.get("evidence") or [])
    return out


def stored_table(result: TraceResult, *, compact: bool = False) -> Table:
    """The objects ``--store`` uploaded: URL (whole), size and sha256 of each (the manifest last)."""
    cells = [[o.url, str(o.bytes), o.sha256] for o in result.stored]
    return _table(
        f"stored in {result.store_url or ''}", compact, [Col("url"), num("bytes"), Col("sha256")], cells
    )


_PHASES = {"list": "listing processes (alignment)", "trace": "triggering"}


def progress_bar(console: Console, counts: str) -> Progress:
    """``kscope trace``'s transient bars on stderr: spinner, what is happening, the bar, ``counts``
    (a Rich text template of the task's fields) and the time elapsed."""
    return Progress(
        SpinnerColumn(),
        TextColumn("[progress.description]{task.description}"),
        BarColumn(),
        TextColumn(counts),
        TimeElapsedColumn(),
        console=console,
        transient=True,
        refresh_per_second=8,
    )


def print_large(console: Console, summary: tuple[str, Table | None]) -> None:
    """A large request's summary line, then the table of the rows that need a look (if any)."""
    line, t = summary
    print_wrapped(console, line, indent="")
    if t is not None:
        print_titled(console, t)


class FanoutProgress:
    """A live "hosts answered / failed / total" bar of a fan-out, for ``trigger_trace(on_answer=...)``.

    ``on_answer`` runs in the pool's threads and only bumps counters; Rich redraws from its own
    thread a few times a second, so 1,000 answers cost 1,000 counter updates, not 1,000 redraws.
    ``transient``: the bar disappears when done (the result is printed after it)."""

    def __init__(self, console: Console, hosts: int) -> None:
        self.hosts = hosts
        self.lock = threading.Lock()
        self.counts: dict[str, list[int]] = {}  # phase -> [answered, failed]
        self.tasks: dict[str, TaskID] = {}
        self.progress = progress_bar(
            console, "{task.fields[answered]} answered, {task.fields[failed]} failed / {task.total} hosts"
        )

    def __enter__(self) -> FanoutProgress:
        self.progress.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.progress.stop()

    def on_answer(self, phase: str, reply: HostReply) -> None:
        with self.lock:
            if phase not in self.tasks:
                self.counts[phase] = [0, 0]
                self.tasks[phase] = self.progress.add_task(
                    _PHASES.get(phase, phase), total=self.hosts, answered=0, failed=0
                )
            counts = self.counts[phase]
            counts[reply.error is not None] += 1
            self.progress.update(
                self.tasks[phase], completed=sum(counts), answered=counts[0], failed=counts[1]
            )


def fanout_summary(result: TraceResult) -> str:
    """One line: how many hosts answered, failed, and when (``kscope trace`` to many hosts)."""
    f = result.fanout
    line = f"{f.answered} of {f.hosts} hosts answered, {f.failed} failed"
    if f.first_answer_s is not None and f.all_answered_s is not None:
        line += f"; first answer after {f.first_answer_s:.3f} s, all after {f.all_answered_s:.2f} s"
    if f.listing_s is not None:
        line += f" (after a {f.listing_s:.2f} s listing to align the iteration windows)"
    return f"{line}; {len(result.triggered)} processes triggered"


# Above this many processes (or files) ``kscope trace`` prints a summary and only the rows that
# need a look: Rich lays out every cell of a table, ~25 s for 4,000 processes on a loaded 2-core
# box, and nobody reads 4,000 rows (``--json`` lists them all).
TABLE_MAX_ROWS = 128


def _counted(counts: dict[str, int]) -> str:
    return ", ".join(f"{n} {label}" for label, n in counts.items() if n)


def large_matched(result: TraceResult, limit: int = TABLE_MAX_ROWS) -> tuple[str, Table | None]:
    """A summary line of a large request's processes, and a table of those not traced (capped)."""
    states: dict[str, int] = {}
    for m in result.matched:
        label = _STATE_LABELS.get(m.state, m.state)
        states[label] = states.get(label, 0) + 1
    hosts = len({m.host for m in result.matched})
    line = (
        f"trace {result.trace_id}: {len(result.matched)} processes matched on {hosts} hosts: "
        f"{_counted(states)} (--json lists every process)"
    )
    odd = [m for m in result.matched if m.state != "triggered"]
    if not odd:
        return line, None
    shown = odd[:limit]
    more = f" (first {len(shown)})" if len(odd) > len(shown) else ""
    return line, matched_table(result, rows=shown, title=f"{len(odd)} process(es) not traced{more}")


def large_files(result: TraceResult, limit: int = TABLE_MAX_ROWS) -> tuple[str, Table | None]:
    """A summary line of a large request's files, and a table of the incomplete ones after --wait."""
    complete = [f for f in result.files if f.complete]
    total = sum(f.bytes or 0 for f in complete)
    missing = sorted(
        (f for f in result.files if not f.complete), key=lambda f: (f.host, f.rank is None, f.rank, f.pid)
    )
    label = "incomplete" if result.waited else "pending"
    line = (
        f"{len(result.files)} trace files: "
        + _counted({"complete": len(complete), label: len(missing)})
        + (f", {fmt_bytes(total)}" if complete else "")
    )
    if not result.waited or not missing:
        return line, None
    shown = missing[:limit]
    more = f" (first {len(shown)})" if len(missing) > len(shown) else ""
    return line, files_table(result, rows=shown, title=f"{len(missing)} incomplete file(s){more}")


def render_captured(out: Console, err: Console, captured: dict[str, Any]) -> None:
    """``captured_table`` (when the files were read back), then ``captured_lines``: the
    verdict on the set in bold on ``out``, the rest as notes."""
    if captured.get("checked") and captured.get("files"):
        print_titled(out, captured_table(captured))
    lines = captured_lines(captured)
    style = "bold green" if captured.get("usable") and captured.get("checked") else "bold red"
    print_wrapped(out, lines[0], indent="", style=style if captured.get("checked") else None)
    for line in lines[1:]:
        print_wrapped(out, line, indent="", subsequent="  ")
