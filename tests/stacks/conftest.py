"""Fixtures of the stacks tests: a real daemon on loopback and real gloo jobs (tests/stacks/hung_job.py
under torchrun) registered with it, hung on purpose."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
JOB = Path(__file__).resolve().parent / "hung_job.py"


@dataclass
class HungJob:
    """A torchrun launch of hung_job.py; ``progress`` reads each rank's last step."""

    process: Any
    progress_dir: Path
    fr_dir: Path
    ranks: int
    job_id: str

    def progress(self) -> dict[int, int]:
        out: dict[int, int] = {}
        for p in self.progress_dir.glob("rank-*.json"):
            try:
                doc = json.loads(p.read_text())
            except (OSError, ValueError):
                continue
            out[int(doc["rank"])] = int(doc["step"])
        return out

    def wait_until_hung(self, last_step: int, timeout: float = 300) -> None:
        """Until every rank has finished ``last_step`` and nothing moved for 2 s (all blocked)."""
        deadline = time.monotonic() + timeout
        stable_since: float | None = None
        while time.monotonic() < deadline:
            steps = self.progress()
            if len(steps) == self.ranks and all(s == last_step for s in steps.values()):
                stable_since = stable_since or time.monotonic()
                if time.monotonic() - stable_since >= 2.0:
                    return
            else:
                stable_since = None
                if not self.process.alive():
                    raise AssertionError(f"the job exited:\n{self.process.tail(30)}")
            time.sleep(0.3)
        raise AssertionError(
            f"the job did not hang at step {last_step}: {self.progress()}\n{self.process.tail(30)}"
        )

    def wait_for_steps(self, steps: int, timeout: float = 300) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            got = self.progress()
            if len(got) == self.ranks and min(got.values()) >= steps:
                return
            time.sleep(0.3)
        raise AssertionError(
            f"the job did not reach step {steps}: {self.progress()}\n{self.process.tail(30)}"
        )

    def stop(self) -> None:
        self.process.stop(grace=3)


def start_job(
    daemon: Any, workdir: Path, *, ranks: int, mode: str, job_id: str, extra: list[str] | None = None
) -> HungJob:
    from kinetoscope.demo.local import ManagedProcess, child_env

    workdir.mkdir(parents=True, exist_ok=True)
    env = child_env(
        {
            **daemon.kineto_env(),
            "SLURM_JOB_ID": job_id,
            "OMP_NUM_THREADS": "1",
            "TORCH_FR_BUFFER_SIZE": "200",
        }
    )
    argv = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={ranks}",
        str(JOB),
        "--mode",
        mode,
        "--progress-dir",
        str(workdir / "progress"),
        "--fr-dir",
        str(workdir / "fr"),
        "--max-seconds",
        "900",
        *(extra or []),
    ]
    process = ManagedProcess(f"job-{mode}", argv, workdir / "job.log", env).start()
    return HungJob(process, workdir / "progress", workdir / "fr", ranks, job_id)


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[Any]:
    pytest.importorskip("torch")
    from kinetoscope.demo.local import LocalDaemon

    d = LocalDaemon(tmp_path / "daemon").start(timeout=60)
    try:
        yield d
    finally:
        d.stop()


def kscope(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    from tests.autopilot.conftest import kscope_env

    return subprocess.run(
        [sys.executable, "-m", "kinetoscope.cli.main", *args],
        cwd=REPO_ROOT,
        env=kscope_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
