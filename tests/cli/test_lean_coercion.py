"""`kinetoscope.cli.lean_coercion` gives every parameter of every command the same values and
the same errors as Typer's own Pydantic coercion, and `kscope analyze` no longer imports
Pydantic."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from typer import _coercion
from typer._click import Context
from typer._click.exceptions import BadParameter
from typer.core import _TyperParameter

from kinetoscope.cli import lean_coercion
from kinetoscope.cli.main import COMMANDS, load_commands

REPO = Path(__file__).resolve().parents[2]
SAMPLES: list[Any] = [None, "x", "", " 7 ", "3", "-1", "0", "1.5", "1e3", "abc", "true", "no", (), ("a",),
                      ("a", "b"), ["1", "2"], True, False, 3, 2.5]  # fmt: skip


def _params() -> list[tuple[str, Any, _TyperParameter]]:
    out = []
    for module in sorted({m for m, _ in COMMANDS.values()}):
        for name, cmd in load_commands(module).items():
            for p in cmd.params:
                if isinstance(p, _TyperParameter):
                    out.append((f"{name} {p.name}", cmd, p))
    return out


PARAMS = _params()


def _outcome(rp: _coercion.RuntimeParam, value: Any, param: _TyperParameter, ctx: Context) -> Any:
    try:
        return ("value", rp.coerce(value, param=param, ctx=ctx))
    except BadParameter as exc:
        return ("error", exc.format_message())


def test_every_command_has_typer_parameters() -> None:
    assert len(PARAMS) > 50
    assert any(label == "analyze inputs" for label, _, _ in PARAMS)


@pytest.mark.parametrize(("label", "cmd", "param"), PARAMS, ids=[label for label, _, _ in PARAMS])
def test_same_values_and_errors_as_typer(label: str, cmd: Any, param: _TyperParameter) -> None:
    ctx = Context(cmd)
    lean = lean_coercion.lean_runtime_param(param.type_descriptor)
    typer_own = lean_coercion._typer_build(param.type_descriptor)
    for value in SAMPLES:
        got, want = _outcome(lean, value, param, ctx), _outcome(typer_own, value, param, ctx)
        assert got == want and type(got[1]) is type(want[1]), (label, value, got, want)


def test_installed_by_the_cli() -> None:
    import typer.core

    assert typer.core.build_runtime_param is lean_coercion.lean_runtime_param


def test_analyze_imports_no_pydantic(tmp_path: Path) -> None:
    """A `kscope analyze` of a trace, with string options and flags only, runs without Pydantic."""
    code = (
        "import sys\n"
        "from kinetoscope.cli.main import main\n"
        "sys.argv = ['kscope', 'analyze', '--no-cache', '--only', 'kernel_breakdown', '--ranks', '34',"
        " 'tests/data/traces/hta/cpu_only', '--json']\n"
        "try:\n    main()\n"
        "except SystemExit as e:\n"
        "    assert not e.code, e.code\n"
        "    assert 'pydantic' not in sys.modules, 'pydantic imported'\n"
        "    print('ok', file=sys.stderr)\n"
    )
    env = {**os.environ, "HOME": str(tmp_path)}
    env.pop("KSCOPE_CATALOG", None)
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, env=env, timeout=300
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.strip().endswith("ok"), proc.stderr
