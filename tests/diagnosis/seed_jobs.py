"""Run the real seed jobs of ``benchmarks/diag_scenarios`` (pipeline, uneven inputs, recompiles)
under torchrun or a plain interpreter, one thread per rank, with the repository importable."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCENARIOS = REPO / "benchmarks" / "diag_scenarios"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_torchrun(script: str, nproc: int, out: Path, *args: str, timeout: float = 420.0) -> None:
    """``torchrun --nproc-per-node NPROC SCRIPT OUT ARGS`` (a standalone rendezvous on a free port)."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        str(nproc),
        "--master-addr",
        "127.0.0.1",
        "--master-port",
        str(free_port()),
        str(SCENARIOS / script),
        str(out),
        *args,
    ]
    proc = subprocess.run(cmd, env=env, timeout=timeout, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"{script} failed ({proc.returncode}): {proc.stderr[-2000:]}")


def run_python(script: str, out: Path, *args: str, timeout: float = 420.0) -> str:
    """``python SCRIPT OUT ARGS``; returns its stdout."""
    # inductor's compile cache goes beside the job's output, not /tmp/torchinductor_root: a cache
    # left by an earlier run (or another torch build) must not change what this run compiles.
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "OMP_NUM_THREADS": "1",
        "TORCHINDUCTOR_CACHE_DIR": str(out / "inductor-cache"),
    }
    proc = subprocess.run(
        [sys.executable, str(SCENARIOS / script), str(out), *args],
        env=env,
        timeout=timeout,
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"{script} failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return proc.stdout
