"""Helpers for the cluster tests: the real CLI as a subprocess, waiting, reading its JSON.

(A module of its own, not conftest.py: `from conftest import` is ambiguous when pytest collects
several test folders at once.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]


def kscope_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "SLURM_", "KSCOPE_"))}
    env["PYTHONPATH"] = str(REPO_ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["COLUMNS"] = "200"
    if extra:
        env.update(extra)
    return env


def run_kscope(
    *args: str, timeout: float = 180, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``python -m kinetoscope.cli.main ARGS`` (the real CLI)."""
    return subprocess.run(
        [sys.executable, "-m", "kinetoscope.cli.main", *args],
        cwd=REPO_ROOT,
        env=kscope_env(env),
        capture_output=True,
        check=False,
        text=True,
        timeout=timeout,
    )


def wait_for(predicate: Callable[[], Any], timeout: float, what: str) -> Any:
    """Poll ``predicate`` until it returns something true (generous deadlines: a loaded 2-core box)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(0.3)


def trace_json(result: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    assert result.returncode == 0, f"kscope trace failed:\n{result.stdout}\n{result.stderr}"
    doc: dict[str, Any] = json.loads(result.stdout)
    return doc
