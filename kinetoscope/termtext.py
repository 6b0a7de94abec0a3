"""Text and tables that read on an 80-column terminal: values whole, text wrapped between words.

The rule every human output of ``kscope`` follows (docs/cli.md, "80 columns"): a number, an id,
a rank list or a path is a *value* and is never broken across lines or cut; a description is
*text* and wraps between words. Rich's defaults do not hold that rule (``overflow="fold"``
breaks ``14/20`` into ``14/2`` and ``0``; a soft-wrapped line is broken by the terminal wherever
the edge falls), so the CLI and its diagnosis text (cli/diagnosis_text.py) print through these helpers:

* :func:`table` builds a compact table whose value columns are ``no_wrap`` and whose text
  columns wrap between words; :func:`print_table` prints it when every value fits, else prints
  each row as ``header: value`` pairs, breaking lines between pairs, never inside one.
* :func:`print_wrapped` prints a line of prose wrapped between words with a hanging indent.

A value longer than the whole width (a long path) gets a line of its own and stays whole: a
path must stay copyable. Imports Rich only inside functions (``kscope --help`` start-up).
"""

from __future__ import annotations

import textwrap
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

VALUE = "value"  # a number, id, rank list, path: never wrapped, never cut
TEXT = "text"  # prose: wraps between words
GAP = 2  # columns between two columns of :func:`table` (right padding, blank separator)


@dataclass(frozen=True)
class Col:
    """One column: its header (short; it may wrap between its words) and its kind."""

    header: str
    kind: str = VALUE
    right: bool = False  # right-justified (numbers)


def num(header: str) -> Col:
    """A right-justified value column (a number)."""
    return Col(header, VALUE, right=True)


def text(header: str) -> Col:
    """A prose column: it wraps between words (the only kind that may grow several lines)."""
    return Col(header, TEXT)


PIPE_WIDTH = 200  # piped with no $COLUMNS: wide enough that lines rarely wrap


def console() -> Any:
    """A Rich console for stdout: the terminal's width, else ``$COLUMNS``, else (piped)
    :data:`PIPE_WIDTH` columns."""
    import os

    from rich.console import Console

    out = Console(highlight=False)
    if not out.is_terminal and "COLUMNS" not in os.environ:
        out = Console(highlight=False, width=PIPE_WIDTH)
    return out


def table(title: str | None, cols: Sequence[Col], rows: Iterable[Sequence[str]]) -> Any:
    """A compact Rich table: a rule under the header, no frame, columns two spaces apart."""
    from rich import box
    from rich.table import Table

    t = Table(
        title=title,
        title_justify="left",
        box=box.SIMPLE_HEAD,
        show_edge=False,
        pad_edge=False,
        padding=(0, 1, 0, 0),
        header_style="bold",
    )
    for c in cols:
        if c.kind == TEXT:
            t.add_column(c.header, overflow="fold", justify="left")
        else:
            t.add_column(c.header, no_wrap=True, justify="right" if c.right else "left")
    for r in rows:
        t.add_row(*r)
    return t


def _cells(t: Any) -> list[list[str]]:
    return [[str(c) for c in col._cells] for col in t.columns]


def _widths(t: Any) -> tuple[list[int], list[int]]:
    """Per column, the narrowest width that keeps every value and word whole (a value column at
    its widest cell, a text column at its longest word, a header at its longest word), and the
    natural width (nothing wrapped)."""
    from rich.cells import cell_len

    mins: list[int] = []
    naturals: list[int] = []
    for col, cells in zip(t.columns, _cells(t)):
        head = str(col.header)
        head_min = max((cell_len(w) for w in head.split()), default=0)
        widest = max((cell_len(c) for c in cells), default=0)
        body_min = widest if col.no_wrap else max((cell_len(w) for c in cells for w in c.split()), default=0)
        mins.append(max(head_min, body_min, 1))
        naturals.append(max(cell_len(head), widest, 1))
    return mins, naturals


def min_width(t: Any) -> int:
    """The narrowest width at which ``t`` (built by :func:`table`) keeps every value and word whole."""
    return sum(_widths(t)[0]) + max(len(t.columns) - 1, 0) * GAP


def fit(t: Any, width: int) -> bool:
    """Give every column of ``t`` a fixed width so that the table is at most ``width`` wide and no
    value or word is broken: value columns first get room for their whole header, then text
    columns share what is left. False (``t`` untouched) when even the narrowest layout is wider."""
    mins, naturals = _widths(t)
    room = width - sum(mins) - max(len(t.columns) - 1, 0) * GAP
    if room < 0:
        return False
    widths = list(mins)
    order = [i for i, c in enumerate(t.columns) if c.no_wrap] + [
        i for i, c in enumerate(t.columns) if not c.no_wrap
    ]
    for i in order:
        add = min(room, naturals[i] - widths[i])
        widths[i] += add
        room -= add
    for col, w in zip(t.columns, widths):
        col.width = w
        col.no_wrap = False  # the header may wrap between its words; every value fits its width
        col.overflow = "fold"
    return True


def print_table(console: Any, t: Any, indent: int = 0) -> None:
    """``t`` as a table when it fits the console's width (less ``indent`` columns of margin) with
    every value whole, else as ``header: value`` records (:func:`print_records`)."""
    if fit(t, console.width - indent):
        if indent:
            from rich.padding import Padding

            console.print(Padding(t, (0, 0, 0, indent)))
        else:
            console.print(t)
    else:
        print_records(console, t, indent)


def print_titled(console: Any, t: Any, indent: int = 0) -> None:
    """``t``'s title wrapped between words at the console's width (a long path or URL in it on a
    line of its own, whole), then ``t`` by :func:`print_table`: a table when every value fits,
    else ``header: value`` records, a path on a line of its own if need be."""
    if t.title:
        print_wrapped(console, str(t.title), indent=" " * indent, style="bold")
        t.title = None
    print_table(console, t, indent)


def print_records(console: Any, t: Any, indent: int = 0) -> None:
    """``t`` row by row as ``header: value`` pairs, packed into lines of the console's width;
    a line breaks between pairs, never inside one (prose alone wraps between its words)."""
    margin = " " * indent
    if t.title:
        print_wrapped(console, str(t.title), indent=margin, style="bold")
    cells = _cells(t)
    for i in range(t.row_count):
        pairs = [f"{' '.join(str(col.header).split())}: {cells[j][i]}" for j, col in enumerate(t.columns)]
        print_wrapped(console, pairs, indent=margin + "  ", subsequent=margin + "      ", sep="   ")
    console.print()


def wrap(
    parts: str | Sequence[str], width: int, *, indent: str = "", subsequent: str | None = None, sep: str = " "
) -> list[str]:
    """Lines of at most ``width`` cells: ``parts`` is a string (wrapped between words) or a list of
    pieces kept whole each (wrapped between pieces, and inside a piece only between its words when
    the piece alone is wider than a line). A word wider than a line gets a line of its own."""
    from rich.cells import cell_len

    nxt = indent if subsequent is None else subsequent
    pieces = [parts] if isinstance(parts, str) else list(parts)
    lines: list[str] = []
    line = ""
    for piece in pieces:
        lead = indent if not lines else nxt
        joined = f"{line}{sep}{piece}" if line else lead + piece
        if cell_len(joined) <= width:
            line = joined
            continue
        if line:
            lines.append(line)
        lead = indent if not lines else nxt
        if cell_len(lead + piece) <= width:
            line = lead + piece
            continue
        words = textwrap.wrap(
            piece,
            width=max(width, 1),
            initial_indent=lead,
            subsequent_indent=nxt,
            break_long_words=False,
            break_on_hyphens=False,
        ) or [lead]
        lines.extend(words[:-1])
        line = words[-1]
    if line:
        lines.append(line)
    return lines


def print_wrapped(
    console: Any,
    parts: str | Sequence[str],
    *,
    indent: str = "  ",
    subsequent: str | None = None,
    sep: str = " ",
    style: str | None = None,
) -> None:
    """Print ``parts`` (see :func:`wrap`) at the console's width, plain text (no markup), each line
    exactly as wrapped (no further folding by Rich or by the terminal)."""
    for line in wrap(parts, console.width, indent=indent, subsequent=subsequent, sep=sep):
        console.print(line, markup=False, highlight=False, soft_wrap=True, style=style)


def print_marked(console: Any, markup: str, *, indent: str = "", subsequent: str | None = None) -> None:
    """Print Rich ``markup`` (``[bold]...[/]``) wrapped between words at the console's width,
    styles kept: like :func:`print_wrapped`, a word wider than a line gets a line of its own and
    stays whole (Rich alone would fold it), and no line is folded again by Rich or the terminal."""
    from rich.text import Text

    nxt = indent if subsequent is None else subsequent
    width = max(console.width - max(len(indent), len(nxt)), 1)
    first = True
    for part in Text.from_markup(markup).split("\n"):
        for start, end in _line_spans(part.plain, width):
            console.print(Text(indent if first else nxt) + part[start:end], soft_wrap=True, highlight=False)
            first = False


def _line_spans(plain: str, width: int) -> list[tuple[int, int]]:
    """``(start, end)`` of each line of ``plain`` packed word by word into ``width`` cells (a
    word wider than that alone on its line); at least one (empty) line."""
    import re

    from rich.cells import cell_len

    spans: list[tuple[int, int]] = []
    start = end = -1
    for m in re.finditer(r"\S+", plain):
        if start < 0:
            start, end = m.start(), m.end()
        elif cell_len(plain[start : m.end()]) <= width:
            end = m.end()
        else:
            spans.append((start, end))
            start, end = m.start(), m.end()
    spans.append((start, end) if start >= 0 else (0, 0))
    return spans


def per_rank(values: Mapping[Any, Any], unit: str = "") -> str:
    """``{'0': 10, '1': 4}`` as words: ``rank 0: 10, rank 1: 4`` (never a Python repr)."""
    return ", ".join(f"rank {k}: {as_words(v)}{unit}" for k, v in values.items())


def as_words(v: Any) -> str:
    """A value for a reader: lists joined by commas, dicts as ``key value`` pairs, floats rounded."""
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        return f"{v:,.3g}" if abs(v) < 1000 else f"{v:,.0f}"
    if isinstance(v, Mapping):
        return ", ".join(f"{k} {as_words(x)}" for k, x in v.items()) or "-"
    if isinstance(v, (list, tuple, set)):
        return ", ".join(as_words(x) for x in v) or "-"
    return str(v)
