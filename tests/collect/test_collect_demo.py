"""`kscope demo` end to end, its cleanup when it fails or is interrupted, and the training
script's straggler schedule."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from kinetoscope.demo.train_ddp import StragglerPlan
from kinetoscope.protocol.manifest import read_manifest

REPO_ROOT = Path(__file__).resolve().parents[2]


def demo_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO_ROOT)
    env["COLUMNS"] = "100"
    return env


def leftovers(marker: str) -> list[str]:
    """Command lines of live processes that mention ``marker`` (the demo's workdir)."""
    out = []
    for p in psutil.process_iter(["pid", "cmdline", "status"]):
        try:
            cmd = " ".join(p.info["cmdline"] or [])
            if marker in cmd and p.info["status"] != psutil.STATUS_ZOMBIE and p.pid != os.getpid():
                out.append(f"{p.pid}: {cmd}")
        except (psutil.Error, TypeError):
            continue
    return out


def wait_no_leftovers(marker: str, timeout: float = 15.0) -> list[str]:
    deadline = time.monotonic() + timeout
    while True:
        left = leftovers(marker)
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.2)


def test_straggler_schedule_is_shared_and_seeded():
    plan = StragglerPlan(mode="intermittent", rank=-1, prob=0.3, lo_ms=50, hi_ms=200, seed=3)
    events = 0
    for step in range(400):
        sleeps = [plan.sleep_ms(step, r, 4) for r in range(4)]
        assert sum(1 for s in sleeps if s > 0) <= 1  # at most one straggler per step
        assert all(s == 0 or 50 <= s <= 200 for s in sleeps)
        events += any(sleeps)
        assert sleeps == [plan.sleep_ms(step, r, 4) for r in range(4)]  # deterministic
    assert 80 < events < 160  # ~30 % of 400
    fixed = StragglerPlan(mode="intermittent", rank=2, prob=1.0, seed=0)
    assert all(fixed.sleep_ms(s, 2, 4) > 0 and fixed.sleep_ms(s, 1, 4) == 0 for s in range(20))
    persistent = StragglerPlan(mode="persistent", rank=-1)
    assert all(persistent.sleep_ms(s, 3, 4) > 0 and persistent.sleep_ms(s, 0, 4) == 0 for s in range(20))
    assert StragglerPlan(mode="none").sleep_ms(5, 0, 2) == 0


@pytest.mark.torch
def test_demo_failure_names_the_step_and_cleans_up(tmp_path):
    r = subprocess.run(
        [sys.executable, "-m", "kinetoscope.cli.main", "demo", "--workdir", str(tmp_path), "--timeout", "4"],
        cwd=REPO_ROOT,
        env=demo_env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert r.returncode == 1, r.stdout + r.stderr
    err = " ".join(r.stderr.split())
    assert "error: demo step '" in err and "failed:" in err and str(tmp_path) in err
    assert "Traceback" not in r.stderr
    assert wait_no_leftovers(str(tmp_path)) == []


@pytest.mark.slow
@pytest.mark.torch
def test_demo_interrupted_cleans_up(tmp_path):
    proc = subprocess.Popen(
        [sys.executable, "-m", "kinetoscope.cli.main", "demo", "--workdir", str(tmp_path)],
        cwd=REPO_ROOT,
        env=demo_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 90
        job_log = tmp_path / "job.log"
        while time.monotonic() < deadline and b"Registering daemon config loader" not in (
            job_log.read_bytes() if job_log.exists() else b""
        ):
            time.sleep(0.2)
        assert len(leftovers(str(tmp_path))) >= 2  # daemon + torchrun at least
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=60)
        assert proc.returncode == 130, out
        assert wait_no_leftovers(str(tmp_path)) == []
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@pytest.mark.slow
@pytest.mark.torch
def test_demo_end_to_end(tmp_path):
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "kinetoscope.cli.main",
            "demo",
            "--workdir",
            str(tmp_path),
            "--iterations",
            "6",
        ],
        cwd=REPO_ROOT,
        env=demo_env(),
        capture_output=True,
        text=True,
        timeout=200,
        check=False,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "Demo complete" in r.stdout
    (trace_dir,) = [p for p in (tmp_path / "traces").iterdir() if p.is_dir()]
    manifest = read_manifest(trace_dir)
    assert sorted((f.rank, f.world_size, f.complete) for f in manifest.files) == [(0, 2, True), (1, 2, True)]
    assert "ground truth: rank 1" in " ".join(r.stdout.split())
    assert wait_no_leftovers(str(tmp_path)) == []


def test_training_script_has_no_profiling_code():
    import ast

    import kinetoscope.demo.train_ddp as train_ddp

    tree = ast.parse(Path(train_ddp.__file__).read_text())
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            imported |= {f"{node.module}.{a.name}" for a in node.names} | {node.module or ""}
    assert not any("profiler" in name for name in imported), imported
    attrs = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    assert "profiler" not in attrs and "profile" not in attrs
