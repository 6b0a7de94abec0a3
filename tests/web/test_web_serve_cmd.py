"""`kscope serve` as a real subprocess: ready line, loopback-only Host check, clean stop."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from kinetoscope.cli.serve_cmd import _is_loopback
from tests.report.kscope_testkit import env_with_repo

REPO_ROOT = Path(__file__).resolve().parents[2]


def test_serve_starts_answers_and_stops(tmp_path):
    log = tmp_path / "serve.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "kinetoscope.cli.main",
                "serve",
                "--port",
                "0",
                "--catalog",
                str(tmp_path / "c.db"),
                "--daemon",
                "127.0.0.1:9",
            ],
            cwd=REPO_ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env_with_repo(),
            start_new_session=True,
        )
    try:
        base = None
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and base is None and proc.poll() is None:
            for line in log.read_text(errors="replace").splitlines():
                if line.startswith("kscope serve ready: "):
                    base = line.split()[3].rstrip("/")
            time.sleep(0.1)
        assert base and base.startswith("http://127.0.0.1:"), log.read_text()
        r = httpx.get(base + "/api/health", timeout=10)
        assert r.status_code == 200 and r.json()["daemons"] == ["127.0.0.1:9"]
        assert str(tmp_path / "c.db") in r.json()["catalog"]
        assert httpx.get(base + "/", timeout=10).status_code == 200
        assert (
            httpx.get(base + "/api/health", headers={"Host": "evil.example"}, timeout=10).status_code == 400
        )
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) in (
            0,
            -signal.SIGTERM,
        )  # uvicorn re-raises the signal after a graceful stop
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_serve_argument_errors(tmp_path):
    r = subprocess.run(
        [sys.executable, "-m", "kinetoscope.cli.main", "serve", "--port", "70000"],
        cwd=REPO_ROOT,
        env=env_with_repo(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert (
        r.returncode == 2 and "--port must be between 0 and 65535" in r.stderr and "Traceback" not in r.stderr
    )


@pytest.mark.parametrize(
    ("host", "loop"),
    [
        ("127.0.0.1", True),
        ("localhost", True),
        ("::1", True),
        ("[::1]", True),
        ("127.1.2.3", True),
        ("0.0.0.0", False),
        ("10.1.2.3", False),
        ("example.org", False),
        ("::", False),
    ],
)
def test_loopback_detection(host, loop):
    assert _is_loopback(host) is loop
