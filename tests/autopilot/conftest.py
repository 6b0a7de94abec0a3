"""Fixtures of the autopilot tests: real daemons on loopback, each standing in for a host (own IPC
socket dir, own port), and real CPU training jobs registered with them; a simulated fleet
(benchmarks/sim_fleet.py) for the many-host tests; PostgreSQL from tests/store."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.store.conftest import catalog_url, pg_server, pg_url  # noqa: F401 - PostgreSQL fixtures, shared

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT / "benchmarks"))

TINY = ["--quiet"]


def kscope_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "KINETO_", "KSCOPE_"))}
    env["PYTHONPATH"] = str(REPO_ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["COLUMNS"] = "200"
    env["PYTHONFAULTHANDLER"] = "1"  # a crash in native code prints every thread's stack
    env.update(extra or {})
    return env


def run_kscope(
    *args: str, timeout: float = 600, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kinetoscope.cli.main", *args],
        cwd=REPO_ROOT,
        env=kscope_env(env),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def popen_kscope(*args: str, log: Path) -> subprocess.Popen[bytes]:
    with open(log, "wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "kinetoscope.cli.main", *args],
            cwd=REPO_ROOT,
            env=kscope_env(),
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def write_policy(path: Path, **overrides: Any) -> Path:
    """A policy for tests: trace at once, small traces, generous timeouts."""
    values: dict[str, Any] = {
        "warmup_s": 0,
        "min_age_s": 0,
        "interval_s": 3600,
        "iterations": 3,
        "sweep_interval_s": 1,
        "trace_timeout_s": 180,
        "max_in_flight": 8,
        "rpc_timeout_s": 10,
    }
    values.update(overrides)
    lines = [f"{k} = {v!r}" if not isinstance(v, str) else f'{k} = "{v}"' for k, v in values.items()]
    path.write_text("[autopilot]\n" + "\n".join(lines) + "\n", encoding="utf-8")
    return path


def wait_until(check: Callable[[], Any], timeout: float, what: str, interval: float = 0.2) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")


@dataclass
class RealFleet:
    """Three daemons (hosts a, b, c) and their jobs: a: one single process + one opted out;
    b: a 2-rank torchrun DDP job. Host c has no job until a test starts one there."""

    daemons: dict[str, Any]
    jobs: dict[str, Any] = field(default_factory=dict)
    workdir: Path = Path()

    def address(self, name: str) -> str:
        return str(self.daemons[name].address)

    @property
    def addresses(self) -> list[str]:
        return [self.address(n) for n in sorted(self.daemons)]

    def host_args(self) -> list[str]:
        return [a for addr in self.addresses for a in ("--host", addr)]

    def start_job(
        self,
        name: str,
        host: str,
        *,
        ranks: int = 1,
        step_sleep_ms: float = 20,
        steps: int = 0,
        env: dict[str, str] | None = None,
    ) -> Any:
        from kinetoscope.demo.local import TrainingJob

        d = self.daemons[host]
        job = TrainingJob(
            self.workdir / name,
            ranks=ranks,
            torchrun=ranks > 1,
            steps=steps,
            model="tiny",
            max_seconds=900,
            env={**d.kineto_env(), **(env or {})},
            name=name,
            extra_args=["--step-sleep-ms", str(step_sleep_ms), *TINY],
        ).start()
        self.jobs[name] = job
        return job


@pytest.fixture(scope="module")
def real_fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealFleet]:
    pytest.importorskip("torch")
    from kinetoscope.demo.local import LocalDaemon

    workdir = tmp_path_factory.mktemp("fleet")
    daemons = {n: LocalDaemon(workdir / f"host-{n}") for n in ("a", "b", "c")}
    fleet = RealFleet(daemons=daemons, workdir=workdir)
    try:
        for d in daemons.values():
            d.start(timeout=60)
        fleet.start_job("single", "a")
        fleet.start_job("optout", "a", env={"KSCOPE_AUTOPILOT": "off"})
        fleet.start_job("ddp", "b", ranks=2)
        daemons["a"].wait_for_processes(2, timeout=180)
        daemons["b"].wait_for_processes(2, timeout=180)
        for name in ("single", "optout", "ddp"):
            fleet.jobs[name].wait_for_steps(3, timeout=180)
        yield fleet
    finally:
        for job in fleet.jobs.values():
            job.stop()
        for d in daemons.values():
            d.stop()
