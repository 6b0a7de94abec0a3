"""Start-up imports only what the command needs (issue 14): every command's --help, `kscope
analyze --list` and an analysis run, each in a fresh interpreter, must not import the libraries
(or analysis/diagnosis modules) that the command does not use."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kinetoscope.analysis.builtins import BUILTIN_ANALYSES
from kinetoscope.cli.main import COMMANDS

REPO = Path(__file__).resolve().parents[2]
SMALL = REPO / "tests" / "data" / "traces" / "hta" / "trace_file_list" / "inference_rank_1.json.gz"
# Libraries no `kscope analyze` run needs (the web app, the report, Ray, the HTA oracle, torch).
NEVER = ["plotly", "fastapi", "uvicorn", "jinja2", "sqlalchemy", "ray", "pandas", "torch", "hta"]
ANALYSIS_MODULES = sorted({target.partition(":")[0] for target, _ in BUILTIN_ANALYSES})
FOUR = ["temporal_breakdown", "idle_time_breakdown", "kernel_breakdown", "comm_comp_overlap"]


def _run_cli(*args: str) -> tuple[subprocess.CompletedProcess[str], set[str]]:
    """``kscope ARGS`` in a fresh interpreter; its output and the modules it had imported."""
    code = (
        "import sys\n"
        "import kinetoscope.cli.main as m\n"
        f"sys.argv = ['kscope', *{list(args)!r}]\n"
        "try:\n    m.main()\nexcept SystemExit as e:\n    code = e.code\nelse:\n    code = 0\n"
        "sys.stdout.flush()\n"
        "sys.stderr.write('\\nMODULES:' + ','.join(sorted(sys.modules)) + '\\n')\n"
        "sys.exit(code)\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("KSCOPE_CATALOG", "RAY_ADDRESS")}
    env |= {"COLUMNS": "200", "NO_COLOR": "1"}
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=REPO, env=env
    )
    line = [ln for ln in proc.stderr.splitlines() if ln.startswith("MODULES:")]
    assert line, proc.stderr
    return proc, set(line[-1][len("MODULES:") :].split(","))


def _imported(modules: set[str], names: list[str]) -> list[str]:
    """The names (packages) of which ``modules`` holds the package or any sub-module."""
    return [n for n in names if n in modules or any(m.startswith(n + ".") for m in modules)]


@pytest.mark.parametrize("command", ["", *COMMANDS])
def test_help_imports_no_heavy_library(command: str) -> None:
    proc, modules = _run_cli(*([command] if command else []), "--help")
    assert proc.returncode == 0, proc.stderr
    assert _imported(modules, [*NEVER, "polars", "numpy", "kinetoscope.analysis.runner"]) == []


def test_list_imports_no_analysis_module() -> None:
    """`kscope analyze --list` comes from the registry's static table: no analysis module,
    no Polars, no numpy, and every analysis is listed."""
    proc, modules = _run_cli("analyze", "--list")
    assert proc.returncode == 0, proc.stderr
    assert _imported(modules, [*NEVER, "polars", "numpy", *ANALYSIS_MODULES]) == []
    for _, meta in BUILTIN_ANALYSES:
        assert meta["name"] in proc.stdout


def test_analyze_imports_only_the_analyses_it_runs() -> None:
    """The four main analyses: their modules (and steps, which temporal uses), no other analysis,
    no diagnosis (not asked for), no numpy; the document is unchanged."""
    only = [a for name in FOUR for a in ("--only", name)]
    proc, modules = _run_cli("analyze", str(SMALL), *only, "--json", "--no-cache", "--no-record")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert all(doc[name] for name in FOUR) and doc["errors"] == {}
    needed = {
        "kinetoscope.analysis.temporal",
        "kinetoscope.analysis.steps",
        "kinetoscope.analysis.idle_time",
        "kinetoscope.analysis.kernel_breakdown",
        "kinetoscope.analysis.comm_overlap",
    }
    unneeded = [m for m in ANALYSIS_MODULES if m not in needed]
    assert _imported(modules, [*NEVER, "numpy", "kinetoscope.diagnosis", *unneeded]) == []
    assert needed <= modules


def test_default_analyze_imports_no_web_report_or_ray() -> None:
    proc, modules = _run_cli("analyze", str(SMALL), "--json", "--no-cache", "--no-record")
    assert proc.returncode == 0, proc.stderr
    assert "temporal_breakdown" in json.loads(proc.stdout)
    assert _imported(modules, NEVER) == []
