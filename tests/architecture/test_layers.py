"""The import layers of docs/architecture.md hold: ``lint-imports`` (import-linter) keeps every
contract in pyproject.toml ([tool.importlinter]).

Why a test as well as ``make lint``: ``make test`` is what CI and contributors run most; an
upward import (say, ``analysis`` importing ``diagnosis``, or ``store`` importing ``collect``)
or a new cycle inside ``trace/`` fails here with import-linter's report of the offending lines.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _lint_imports() -> subprocess.CompletedProcess[str]:
    exe = Path(sys.executable).parent / "lint-imports"
    return subprocess.run(
        [str(exe), "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=240, check=False
    )


def test_every_import_contract_is_kept() -> None:
    proc = _lint_imports()
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "0 broken" in proc.stdout


def test_protocol_imports_nothing_above_it() -> None:
    """The bottom layer's modules import only the standard library, msgspec/orjson and
    ``kinetoscope.errors`` (checked from the source, so a lazy import inside a function counts)."""
    import ast

    allowed = {"kinetoscope.errors"}
    for path in sorted((ROOT / "kinetoscope" / "protocol").glob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            for name in names:
                if name.startswith("kinetoscope") and not name.startswith("kinetoscope.protocol"):
                    assert name in allowed, f"{path.name} imports {name}: protocol/ is the bottom layer"
