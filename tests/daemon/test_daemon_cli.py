"""`kscope daemon` as a real subprocess: startup line, serving, metrics, SIGTERM shutdown."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import urllib.request
import uuid
from pathlib import Path

import pytest
from daemon_helpers import IpcClient, rpc

REPO = Path(__file__).resolve().parents[2]


def _start(args: list[str]) -> subprocess.Popen:
    # the ready line's fields are the subject here, not its wrapping (test_80_columns_live.py):
    # with $COLUMNS set (pytest-xdist sets 80) metrics_port= would wrap onto a second line
    env = dict(os.environ, PYTHONPATH=str(REPO), COLUMNS="1000")
    env.pop("KINETO_IPC_SOCKET_DIR", None)
    env.pop("KSCOPE_TOKEN", None)
    return subprocess.Popen(
        [sys.executable, "-m", "kinetoscope.cli.main", "daemon", *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.fixture()
def cli_daemon():
    procs: list[subprocess.Popen] = []

    def _run(*args: str) -> tuple[subprocess.Popen, dict[str, str]]:
        p = _start(list(args))
        procs.append(p)
        line = p.stdout.readline()  # the ready line (or "" if it died)
        if not line:
            raise AssertionError(f"daemon did not start: {p.stderr.read()}")
        fields = dict(re.findall(r"(\w+)=(\S+)", line))
        return p, fields

    try:
        yield _run
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait(timeout=10)
            for f in (p.stdout, p.stderr):
                f.close()


def test_sigterm_shuts_down_cleanly(cli_daemon, sockdir, tmp_path):
    p, fields = cli_daemon(
        "--port", "0", "--ipc-socket-dir", sockdir, "--trace-root", str(tmp_path / "tr"),
        "--metrics-port", "0", "--no-gpu-metrics", "--log-json",
    )  # fmt: skip
    port = int(fields["rpc_port"])
    assert rpc(port, {"fn": "getStatus"}) == {"status": 1}
    c = IpcClient(os.path.join(sockdir, "dynolog"), sockdir)
    try:
        assert c.poll([9100]) == ""
    finally:
        c.close()
    body = (
        urllib.request.urlopen(f"http://127.0.0.1:{fields['metrics_port']}/metrics", timeout=5)
        .read()
        .decode()
    )
    assert "kscope_daemon_ipc_polls_total 1.0" in body
    assert "kscope_daemon_registered_processes 1.0" in body
    assert "kscope_daemon_ipc_context_registrations 0.0" in body
    assert "kscope_daemon_rpc_pending_connections" in body
    assert "kscope_host_cpu_utilization_percent" in body and "kscope_host_memory_total_bytes" in body
    assert "kscope_daemon_ipc_reply_latency_seconds_bucket" in body
    p.send_signal(signal.SIGTERM)
    assert p.wait(timeout=15) == 0
    assert not os.path.exists(os.path.join(sockdir, "dynolog"))
    err = p.stderr.read()
    assert '"msg":"received SIGTERM, shutting down"' in err  # --log-json: one JSON object per line
    assert "Traceback" not in err


def test_sigint_and_abstract_name(cli_daemon, tmp_path):
    name = f"kscope-cli-{uuid.uuid4().hex[:10]}"
    p, fields = cli_daemon(
        "--port", "0", "--ipc-name", name, "--trace-root", str(tmp_path / "tr"), "--metrics-port", "-1"
    )  # fmt: skip
    assert fields["metrics_port"] == "off"
    c = IpcClient(b"\0" + name.encode() + b"\0", None)
    try:
        assert c.poll([9200]) == ""
    finally:
        c.close()
    p.send_signal(signal.SIGINT)
    assert p.wait(timeout=15) == 0


def test_startup_error_is_one_line(tmp_path):
    p = _start(["--port", "0", "--trace-root", "relative/dir", "--metrics-port", "-1"])
    try:
        out, err = p.communicate(timeout=30)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 1
    assert "--trace-root must be an absolute path" in err and "Traceback" not in err
