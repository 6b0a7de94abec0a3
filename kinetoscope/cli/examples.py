"""The "Examples" block that ends every sub-command's ``--help`` (a Typer epilog).

Each example is a real command line under a comment that says what it does, so a command can be
copied whole. Typer renders the epilog as Rich markup (square brackets are escaped) and keeps
single line breaks. Command lines stay under :data:`MAX_WIDTH` characters so that an 80-column
terminal does not wrap them.
"""

from __future__ import annotations

MAX_WIDTH = 74  # 80 columns less Typer's padding and the indent


def examples(*items: tuple[str, str]) -> str:
    """An epilog from ``(command line, what it does)`` pairs."""
    lines = ["[bold]Examples[/bold]"]
    for cmd, what in items:
        lines += [f"  [dim]# {_escape(what)}[/dim]", f"  {_escape(cmd)}"]
    return "\n".join(lines)


def _escape(text: str) -> str:
    """Rich markup escape without importing Rich's markup module at start-up."""
    return text.replace("[", r"\[")
