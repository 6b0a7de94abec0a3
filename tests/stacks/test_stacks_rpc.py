"""``kscopeStacks`` against a real in-process daemon and a real Python process registered over the
real IPC protocol (tests/daemon/fake_kineto.py): frames come back, the token is enforced, bad
fields are named, and a ptrace refusal names the process, the cause and the fix."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from kinetoscope.collect.client import DaemonClient, DaemonError
from kinetoscope.daemon.daemon import Daemon, DaemonOptions
from kinetoscope.daemon.stacks import classify, find_py_spy, snapshot
from kinetoscope.protocol import rpc

REPO = Path(__file__).resolve().parents[2]
FAKE = REPO / "tests" / "daemon" / "fake_kineto.py"

pytestmark = pytest.mark.skipif(find_py_spy() is None, reason="py-spy is not installed")


@pytest.fixture()
def sockdir() -> Iterator[str]:
    d = tempfile.mkdtemp(prefix="kss", dir="/tmp")
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def _daemon(sockdir: str, tmp_path: Path, token: str | None = None) -> Daemon:
    d = Daemon(
        DaemonOptions(
            port=0,
            ipc_socket_dir=sockdir,
            trace_root=str(tmp_path / "traces"),
            metrics_port=None,
            hostname="testhost",
            gpu_metrics=False,
            token=token,
        )
    )
    d.start()
    return d


@pytest.fixture()
def registered(sockdir: str, tmp_path: Path) -> Iterator[tuple[Daemon, subprocess.Popen[str]]]:
    d = _daemon(sockdir, tmp_path, token="s3cret")
    env = {**os.environ, "SLURM_JOB_ID": "777", "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(
        [sys.executable, str(FAKE), sockdir, "--period", "0.2", "--lifetime", "120", "--stay"],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("READY"), line
        yield d, proc
    finally:
        proc.kill()
        proc.wait()
        d.stop()


def _client(d: Daemon, token: str | None = "s3cret", timeout: float = 60) -> DaemonClient:
    return DaemonClient(f"127.0.0.1:{d.rpc_port}", token=token, timeout=timeout)


def test_stacks_of_a_registered_process(registered: tuple[Daemon, subprocess.Popen[str]]) -> None:
    d, proc = registered
    reply = _client(d).stacks(rpc.KscopeStacksRequest(job_id=777, locals=True))
    assert reply.status == "ok" and reply.hostname == "testhost"
    assert reply.py_spy
    [p] = reply.processes
    assert p.pid == proc.pid and p.host_pid == proc.pid and p.error is None
    assert p.job_id == "777" and p.cpu_s is not None and p.pause_ms is not None and p.pause_ms > 0
    main = next(t for t in p.threads if t.os_thread_id == proc.pid)
    names = [f.name for f in main.frames]
    assert "main" in names and names[-1] == "<module>"
    assert any(f.short_file == "fake_kineto.py" for f in main.frames)
    assert isinstance(main.active, bool) and isinstance(main.owns_gil, bool)
    module_frame = main.frames[-1]
    assert module_frame.locals is not None  # locals asked for: short reprs come back


def test_stacks_need_the_token_and_name_bad_fields(registered: tuple[Daemon, subprocess.Popen[str]]) -> None:
    d, _proc = registered
    with pytest.raises(DaemonError, match="unauthorized"):
        _client(d, token=None).stacks(rpc.KscopeStacksRequest(all=True))
    with pytest.raises(DaemonError, match="'timeout_ms': Expected `int"):
        _client(d).call(rpc.STACKS, all=True, timeout_ms="soon")
    with pytest.raises(DaemonError, match="'pids': Expected `array"):
        _client(d).call(rpc.STACKS, pids="12")
    # a job nobody runs: an empty answer that says what is registered
    reply = _client(d).stacks(rpc.KscopeStacksRequest(job_id=778))
    assert reply.processes == [] and "job 777" in reply.registered


def test_dyno_calls_are_unchanged(registered: tuple[Daemon, subprocess.Popen[str]]) -> None:
    d, _proc = registered
    assert _client(d).get_status().status == 1
    assert _client(d).list_processes(777).processes[0].cpu_s is not None


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run py-spy as another user")
def test_ptrace_refused_names_process_cause_and_fix() -> None:
    """py-spy run as uid 65534 against a root-owned process: the kernel refuses ptrace, and the
    daemon's message (for a daemon running as that uid) names the process, the cause, the fix."""
    spy_dir = tempfile.mkdtemp(prefix="kss-spy", dir="/tmp")
    target = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        time.sleep(0.5)
        found = find_py_spy()
        assert found is not None
        # uid 65534 runs a copy in a directory it can enter: the checkout's may not be (a clone
        # under ``mktemp -d`` is 0700, and py-spy failed with EACCES before any ptrace)
        exe = os.path.join(spy_dir, "py-spy")
        shutil.copy(found, exe)
        os.chmod(spy_dir, 0o755)
        os.chmod(exe, 0o755)
        out = subprocess.run(
            [exe, "dump", "--pid", str(target.pid), "--json"],
            capture_output=True,
            timeout=60,
            user=65534,
            group=65534,
            extra_groups=[],
            env={"PATH": "/usr/bin:/bin", "RUST_BACKTRACE": "0"},
            check=False,
        )
        assert out.returncode != 0
        kind, message = classify(target.pid, out.stderr, euid=65534, cap=False)
        assert kind == "permission", out.stderr
        assert message.startswith(f"pid {target.pid}: ptrace refused")
        assert "uid 0" in message and "uid 65534" in message  # the cause
        assert "CAP_SYS_PTRACE" in message and "fix:" in message
    finally:
        target.kill()
        target.wait()
        shutil.rmtree(spy_dir, ignore_errors=True)


def test_a_process_that_is_gone_is_named() -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    snap = snapshot(gone.pid, timeout_s=30)
    assert snap.error_kind == "gone" and f"pid {gone.pid}" in (snap.error or "")


def test_native_adds_c_frames_marked_native() -> None:
    target = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        time.sleep(0.5)
        snap = snapshot(target.pid, native=True, timeout_s=30)
        assert snap.error is None, snap.error
        frames = [f for t in snap.threads for f in t.frames]
        assert any(f.native for f in frames) and any(f.name == "<module>" and not f.native for f in frames)
    finally:
        target.kill()
        target.wait()
