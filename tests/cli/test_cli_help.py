"""The CLI teaches itself: every command's --help ends with real examples, short options mean one
thing across commands (-o is output), flags show no ``<bool>`` type, and the root listing (kept
in kinetoscope.cli.main so `kscope --help` imports no command module) matches the commands."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys

import pytest
from typer import _click
from typer.core import TyperGroup

from kinetoscope.cli.main import COMMANDS, load_commands
from tests.cli._helpers import REPO, kscope

# A short option may be spelt by more than one long name only when they mean the same thing.
SAME_MEANING = {"-o": {"--output", "--output-dir"}}


def _all_commands() -> dict[str, _click.Command]:
    """Every leaf command by its path (``catalog import``), the real ones, modules imported."""
    out: dict[str, _click.Command] = {}
    for module in dict.fromkeys(m for m, _ in COMMANDS.values()):
        for name, cmd in load_commands(module).items():
            if isinstance(cmd, TyperGroup):
                out.update({f"{name} {sub}": c for sub, c in cmd.commands.items()})
                out[name] = cmd
            else:
                out[name] = cmd
    return out


COMMAND_PATHS = sorted(_all_commands())


def _example_lines(epilog: str) -> list[str]:
    return [ln.strip() for ln in epilog.splitlines() if ln.strip().startswith("kscope ")]


def test_root_listing_matches_the_commands() -> None:
    commands = _all_commands()
    for name, (_module, short_help) in COMMANDS.items():
        assert name in commands, f"{name} is listed by kscope --help but no module defines it"
        assert (commands[name].help or "").strip() == short_help
    assert {p.split()[0] for p in commands} == set(COMMANDS)


@pytest.mark.parametrize("path", COMMAND_PATHS)
def test_every_command_ends_its_help_with_real_examples(path: str) -> None:
    cmd = _all_commands()[path]
    examples = _example_lines(cmd.epilog or "")
    assert 2 <= len(examples) <= 3, f"kscope {path} --help should end with 2-3 examples: {cmd.epilog!r}"
    for line in examples:
        words = shlex.split(line.split(" > ")[0])[1:]  # drop "kscope" and a shell redirection
        target = _all_commands()[path]
        prefix = path.split()
        assert words[: len(prefix)] == prefix, f"example of kscope {path} runs another command: {line}"
        args = words[len(prefix) :]
        if isinstance(target, TyperGroup):
            target = target.commands[args[0]]
            args = args[1:]
        target.make_context(path, list(args))  # raises on an unknown option or a bad value


@pytest.mark.parametrize("path", COMMAND_PATHS)
def test_examples_fit_80_columns_unbroken(path: str) -> None:
    proc = kscope(*path.split(), "--help")
    assert proc.returncode == 0, proc.stderr
    help_lines = [ln.strip() for ln in proc.stdout.splitlines()]
    cmd = _all_commands()[path]
    for example in _example_lines(cmd.epilog or ""):
        assert example.replace(r"\[", "[") in help_lines, f"example wrapped at 80 columns: {example}"


def test_short_options_mean_one_thing_everywhere() -> None:
    meanings: dict[str, set[str]] = {}
    for cmd in _all_commands().values():
        for param in cmd.params:
            shorts = [o for o in param.opts if re.fullmatch(r"-[A-Za-z]", o)]
            longs = [o for o in param.opts if o.startswith("--")]
            for short in shorts:
                meanings.setdefault(short, set()).update(longs[:1])
    for short, longs in meanings.items():
        assert len(longs) == 1 or longs <= SAME_MEANING.get(short, set()), f"{short} means {sorted(longs)}"
    assert meanings.get("-o", set()) <= SAME_MEANING["-o"]


@pytest.mark.parametrize("args", [[], ["analyze"], ["report"], ["trace"], ["catalog", "import"]])
def test_help_shows_no_bool_type(args: list[str]) -> None:
    proc = kscope(*args, "--help")
    assert proc.returncode == 0, proc.stderr
    assert "<bool>" not in proc.stdout
    assert proc.stderr == ""


def test_cli_import_loads_no_heavy_library() -> None:
    """`kscope --help` must not pay for Polars, Plotly, SQLAlchemy or FastAPI (start-up time)."""
    heavy = ["polars", "plotly", "sqlalchemy", "fastapi", "numpy", "uvicorn", "jinja2"]
    code = (
        "import sys\n"
        "import kinetoscope.cli.main as m\n"
        "sys.argv = ['kscope', '--help']\n"
        "try:\n    m.main()\nexcept SystemExit:\n    pass\n"
        f"print('HEAVY:' + ','.join(x for x in {heavy!r} if x in sys.modules))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "HEAVY:", "imported at start-up"


@pytest.mark.parametrize("command", ["analyze", "trace", "report"])
def test_command_help_loads_no_heavy_library(command: str) -> None:
    code = (
        "import sys\n"
        "import kinetoscope.cli.main as m\n"
        f"sys.argv = ['kscope', {command!r}, '--help']\n"
        "try:\n    m.main()\nexcept SystemExit:\n    pass\n"
        "print('HEAVY:' + ','.join(x for x in ['polars', 'plotly', 'sqlalchemy', 'fastapi'] if x in sys.modules))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "HEAVY:", (
        f"kscope {command} --help imports a heavy library"
    )


@pytest.mark.parametrize("args", [[], ["catalog"]])
def test_bare_group_prints_its_help_and_nothing_else(args: list[str]) -> None:
    """`kscope` alone shows the help (exit 2, as Click does), without an empty error line."""
    proc = kscope(*args)
    assert proc.returncode == 2
    assert "Usage: kscope" in proc.stdout
    assert proc.stderr == ""
