"""Renamed flags: the old spelling keeps working, with a one-line warning on stderr.

One flag, one meaning across commands (docs/cli.md, "Every flag"): where a command used a
spelling that means something else elsewhere, the flag was renamed, and the old spelling stays an
alias so that scripts keep working. The aliases are not options of their own (they would show in
``--help``): :func:`install` wraps each command's argument parsing to rewrite an old spelling
into the new one before Click sees it, saying so once on stderr::

    warning: kscope serve --host is deprecated: use --bind (the address to listen on)
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any

from typer import _click

# command -> {old spelling: (new spelling, what it means)}
RENAMED: dict[str, dict[str, tuple[str, str]]] = {
    "serve": {"--host": ("--bind", "the address to listen on, as in kscope daemon")},
    "analyze": {"--all": ("--full", "every table; --all means every process in trace and stacks")},
    "demo": {"--ranks": ("--world-size", "how many ranks; --ranks means which ranks in analyze")},
}


def rewrite(command: str, args: list[str], renames: Mapping[str, tuple[str, str]]) -> list[str]:
    """``args`` with each old spelling (``--old`` or ``--old=value``) replaced by the new one,
    a warning on stderr for each spelling used. Stops at ``--`` (what follows is not an option)."""
    out: list[str] = []
    warned: set[str] = set()
    for i, arg in enumerate(args):
        if arg == "--":
            return out + args[i:]
        name, eq, value = arg.partition("=")
        if name in renames:
            new, meaning = renames[name]
            if name not in warned:
                warned.add(name)
                print(
                    f"warning: kscope {command} {name} is deprecated: use {new} ({meaning})", file=sys.stderr
                )
            arg = new + eq + value
        out.append(arg)
    return out


def install(commands: Mapping[str, Any]) -> None:
    """Let each command of :data:`RENAMED` among ``commands`` accept its old spellings."""
    for name, cmd in commands.items():
        renames = RENAMED.get(name)
        if renames is None or not isinstance(cmd, _click.Command):
            continue
        parse = cmd.parse_args

        def parse_args(ctx: Any, args: list[str], _parse: Any = parse, _name: str = name) -> Any:
            return _parse(ctx, rewrite(_name, list(args), RENAMED[_name]))

        cmd.parse_args = parse_args  # type: ignore[method-assign]
