"""Run this folder's self-profiling torch scripts (``single_job.py``, ``feature_job.py``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def run_profiled_job(script: Path, out: Path) -> None:
    """``script OUT`` in a fresh interpreter, one thread, with the repository importable: the
    script profiles its own loop and writes its trace under ``out``."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    subprocess.run(
        [sys.executable, str(script), str(out)], check=True, env=env, timeout=300, capture_output=True
    )
