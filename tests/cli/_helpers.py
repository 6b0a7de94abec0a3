"""One way for the CLI tests to run ``kscope``: the real CLI in a subprocess
(``python -m kinetoscope.cli.main``), plain text (``NO_COLOR``, ``TERM=dumb``) at a known width."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def kscope(
    *args: str, cwd: Path = REPO, columns: int | None = 80, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    """Run ``kscope *args`` in ``cwd``; ``COLUMNS`` is ``columns`` (None: unset, as when piped
    from a shell that does not export it)."""
    env = {**os.environ, "NO_COLOR": "1", "TERM": "dumb"}
    env.pop("COLUMNS", None)
    if columns is not None:
        env["COLUMNS"] = str(columns)
    return subprocess.run(
        [sys.executable, "-m", "kinetoscope.cli.main", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
        cwd=cwd,
    )
