"""Write the ``kscope analyze --json`` document of every trace in ``tests/data`` to a folder.

Why: a refactor that must leave behaviour unchanged can prove it by running this script before
and after and comparing the two folders byte for byte (``diff -r BEFORE AFTER``).

Each trace file is copied to a fixed temporary folder first, so the paths inside the documents
are the same whichever checkout runs the script, and no cache file lands beside the test data.
The script runs the ``kscope`` of the interpreter that runs it (``python -m
kinetoscope.cli.main``), so ``/work/main/.venv/bin/python scripts/doc_snapshot.py OUT`` snapshots
``main``. Each trace gets two documents: the default analyses (``NAME.default.out``) and every
registered analysis (``NAME.all.out``, ``--only`` for each name), so the analyses that are off by
default are compared too. Usage: ``python scripts/doc_snapshot.py OUT_DIR [DATA_DIR]``.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

SUFFIXES = (".json", ".json.gz")
DEFAULT_DATA = Path(__file__).resolve().parent.parent / "tests" / "data"


def trace_files(data: Path) -> list[Path]:
    """Every trace file under ``data`` (the suffixes ``kscope analyze`` reads), sorted."""
    return sorted(p for p in data.rglob("*") if p.is_file() and p.name.endswith(SUFFIXES))


def analysis_names() -> list[str]:
    """Every registered analysis of the ``kinetoscope`` this interpreter imports."""
    from kinetoscope.analysis import registry

    return list(registry.names())


def snapshot_one(src: Path, rel: Path, work: Path, out: Path, names: list[str]) -> str:
    """Analyse one copied trace (default analyses, then all); write stdout, the exit code and
    stderr to ``out``; return a status line."""
    dst = work / rel
    dst.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src, dst)
    base = [sys.executable, "-m", "kinetoscope.cli.main", "analyze", "--json", "--no-cache", str(dst)]
    only = [arg for name in names for arg in ("--only", name)]
    codes = []
    for label, cmd in (("default", base), ("all", base + only)):
        proc = subprocess.run(cmd, capture_output=True, cwd=work, check=False)
        target = out / (str(rel).replace("/", "__") + f".{label}.out")
        target.write_bytes(proc.stdout + f"\n--- exit {proc.returncode}\n".encode() + proc.stderr)
        codes.append(str(proc.returncode))
    return f"{'/'.join(codes)} {rel}"


def main(argv: list[str]) -> int:
    """Snapshot every trace under the data folder into the output folder."""
    if len(argv) not in (2, 3):
        print("usage: doc_snapshot.py OUT_DIR [DATA_DIR]", file=sys.stderr)
        return 2
    out = Path(argv[1])
    data = Path(argv[2]) if len(argv) == 3 else DEFAULT_DATA
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.gettempdir()) / "kscope-doc-snapshot"
    shutil.rmtree(work, ignore_errors=True)
    names = analysis_names()
    for src in trace_files(data):
        print(snapshot_one(src, src.relative_to(data), work, out, names), flush=True)
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
