"""`kscope analyze` on a pool of workers: a rank file that cannot be analysed is an error entry of a
complete document. (What `--backend auto` picks, and why, is tests/scale/test_executors.py's:
these six small files it analyses in this process.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.scale.conftest import PAIR, write_ranks


def test_on_the_pool_a_bad_rank_is_an_error_entry(tmp_path: Path) -> None:
    files = write_ranks(tmp_path / "job", PAIR, 5)
    bad = tmp_path / "job" / "rank-5.json.gz"
    bad.write_bytes(files[0].read_bytes()[:4000])  # truncated gzip
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "kinetoscope.cli.main",
            "analyze",
            str(tmp_path / "job"),
            "--json",
            "--no-cache",
            "--no-record",
            "--backend",
            "local",
            "--workers",
            "2",
        ],
        capture_output=True,
        text=True,
        check=False,
        timeout=900,
        env=env,
    )
    assert "backend" not in proc.stderr  # said only for what --backend auto chose
    assert f"error: not analysed: {bad}" in proc.stderr
    assert "Traceback" not in proc.stderr
    doc = json.loads(proc.stdout)
    assert [t["rank"] for t in doc["traces"]] == [0, 1, 2, 3, 4]
    assert list(doc["errors"]) == [str(bad)]
    assert doc["stragglers"] and doc["kernel_distribution"]
    assert proc.returncode == 1  # the document is complete; the exit status says a rank failed
