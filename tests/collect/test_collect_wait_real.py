"""`kscope trace --wait` with real PyTorch processes that die or hang mid-trace.

Each test starts its own process (a one-process ``train_ddp`` under a private daemon), triggers a
duration trace, waits until the daemon says the process picked the config up, and then breaks
the process: SIGKILL (it dies: ``exited``) or SIGSTOP (it hangs: ``stalled``). ``--wait`` has a
generous timeout; the error's kind (``exited``/``stalled``, never ``timeout``) shows that it
returned because it knew nothing more would come, not because the timeout ran out.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from kinetoscope.collect.client import DaemonClient

REPO_ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.torch

WAIT_TIMEOUT_S = 300  # far more than any of these tests needs: reaching it would mean a regression


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    pytest.importorskip("torch")
    from kinetoscope.demo.local import LocalDaemon

    with LocalDaemon(tmp_path_factory.mktemp("wait-real")) as d:
        yield d


def cli_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "KSCOPE_TOKEN"}
    env["PYTHONPATH"] = str(REPO_ROOT)
    return env


def start_job(daemon: object, workdir: Path) -> object:
    from kinetoscope.demo.local import TrainingJob

    job = TrainingJob(
        workdir,
        ranks=1,
        torchrun=False,
        steps=0,
        model="tiny",
        max_seconds=240,
        env=daemon.kineto_env(),
        extra_args=["--step-sleep-ms", "20", "--quiet"],
    ).start()
    daemon.wait_for_processes(1, timeout=120, alive=job.alive)
    job.wait_for_steps(2, timeout=120)
    return job


def start_trace(daemon: object, pid: int, trace_id: str, duration_ms: int) -> subprocess.Popen[str]:
    """``kscope trace --wait --json`` as a real subprocess (the CLI a user runs)."""
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "kinetoscope.cli.main",
            "trace",
            "--host",
            str(daemon.address),
            "--pids",
            str(pid),
            "--duration-ms",
            str(duration_ms),
            "--trace-id",
            trace_id,
            "--wait",
            "--timeout",
            str(WAIT_TIMEOUT_S),
            "--json",
            "--no-catalog",
        ],
        cwd=REPO_ROOT,
        env=cli_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_delivered(daemon: object, trace_id: str, cli: subprocess.Popen[str]) -> None:
    """Until the daemon says the traced process picked the config up."""
    client = DaemonClient(daemon.address, timeout=5)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        assert cli.poll() is None, cli.communicate()
        st = client.trace_status(trace_id)
        if st.known and st.files and st.files[0].delivered:
            return
        time.sleep(0.1)
    raise AssertionError("the process never picked up the trace config")


def finish(cli: subprocess.Popen[str]) -> dict:
    out, err = cli.communicate(timeout=WAIT_TIMEOUT_S + 60)
    assert cli.returncode == 1, err
    assert "Traceback" not in err
    return orjson.loads(out)


def test_wait_returns_when_the_traced_process_is_killed_mid_trace(daemon, tmp_path):
    job = start_job(daemon, tmp_path)
    try:
        pid = job.pid
        cli = start_trace(daemon, pid, "kst-killed-1", duration_ms=3000)
        wait_delivered(daemon, "kst-killed-1", cli)
        os.kill(pid, signal.SIGKILL)
        doc = finish(cli)
    finally:
        job.stop()
    (err,) = doc["errors"]
    assert err["kind"] == "exited" and err["pid"] == pid, err  # not "timeout": it did not wait 300 s
    assert err["message"] == (
        f"pid {pid} on {daemon.address}: {err['path']} did not appear: the process picked up the config but "
        "exited before the trace was written (the daemon reports it dead, so nothing more will come)"
    )
    assert doc["files"][0]["complete"] is False


def test_wait_reports_a_stalled_duration_trace_of_a_hung_process(daemon, tmp_path):
    job = start_job(daemon, tmp_path)
    pid = job.pid
    try:
        cli = start_trace(daemon, pid, "kst-stalled-1", duration_ms=3000)
        wait_delivered(daemon, "kst-stalled-1", cli)
        os.kill(pid, signal.SIGSTOP)  # hung: alive, but neither tracing nor polling
        doc = finish(cli)
    finally:
        os.kill(pid, signal.SIGCONT)
        job.stop()
    (err,) = doc["errors"]
    assert err["kind"] == "stalled" and err["pid"] == pid, err  # not "timeout": it did not wait 300 s
    msg = err["message"]
    assert msg.startswith(f"pid {pid} on {daemon.address}: {err['path']} was not written "), msg
    assert (
        "s after its 3000 ms window should have ended: the process picked up the config, then stopped "
        "polling the daemon" in msg
    )
    assert "The other processes' files are not affected." in msg


def test_duration_trace_dropped_by_kineto_is_sent_again(daemon, tmp_path):
    """Issue 10's lost rank, reproduced: Kineto (torch 2.13) must activate a duration request on
    a profiler tick 1-2 s after it got it; stopping the process over that second (as a loaded
    host delays the tick) makes Kineto create the 0-byte ``.tmp`` and then refuse to start
    ("Not starting tracing - insufficient time for warmup"). The daemon sees the process poll
    idle again without a file and sends the config again: the trace completes."""
    job = start_job(daemon, tmp_path)
    pid = job.pid
    try:
        cli = start_trace(daemon, pid, "kst-dropped-1", duration_ms=300)
        wait_delivered(daemon, "kst-dropped-1", cli)
        time.sleep(0.2)
        os.kill(pid, signal.SIGSTOP)  # over the whole activation second
        time.sleep(2.5)
        os.kill(pid, signal.SIGCONT)
        out, err = cli.communicate(timeout=WAIT_TIMEOUT_S + 60)
    finally:
        job.stop()
    assert cli.returncode == 0, err
    doc = orjson.loads(out)
    (f,) = doc["files"]
    assert f["complete"] is True and f["bytes"] > 0 and not doc["errors"]
    assert f"Kineto dropped the duration trace in pid {pid} (1x)" in " ".join(doc["notes"]), doc["notes"]
    # what Kineto itself said the first time (the cause the daemon worked around)
    assert "Not starting tracing - insufficient time for warmup" in Path(job.log_path).read_text(
        errors="replace"
    )
