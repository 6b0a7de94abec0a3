"""Issue 16 item 6 (daemon part): no silent loss of authentication. An empty token is refused,
a non-loopback ``--bind`` needs ``--token`` or an explicit ``--insecure`` (loudly warned), and
an unauthenticated caller learns nothing about the RPC functions. Real CLI process, real sockets."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from daemon_helpers import rpc

REPO = Path(__file__).resolve().parents[2]


def _daemon(args: list[str], env_extra: dict[str, str] | None = None) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    env.pop("KINETO_IPC_SOCKET_DIR", None)
    env.pop("KSCOPE_TOKEN", None)
    env.update(env_extra or {})
    return subprocess.Popen(
        [sys.executable, "-m", "kinetoscope.cli.main", "daemon", "--port", "0", "--metrics-port", "-1",
         "--no-gpu-metrics", *args],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def _refused(args: list[str], env_extra: dict[str, str] | None = None) -> str:
    p = _daemon(args, env_extra)
    try:
        out, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
            p.communicate()
    assert p.returncode == 1, (out, err)
    assert "Traceback" not in err and "ready" not in out
    return err


@pytest.fixture()
def ipc_args(sockdir, tmp_path) -> list[str]:
    return ["--ipc-socket-dir", sockdir, "--trace-root", str(tmp_path / "tr")]


def test_non_loopback_bind_without_token_is_refused(ipc_args):
    err = _refused(["--bind", "0.0.0.0", *ipc_args])
    assert "without --token" in err and "--insecure" in err


@pytest.mark.parametrize("how", ["flag", "env", "blank"])
def test_empty_token_is_refused(ipc_args, how):
    if how == "flag":
        err = _refused(["--token", "", *ipc_args])
    elif how == "env":
        err = _refused(ipc_args, {"KSCOPE_TOKEN": ""})
    else:
        err = _refused(["--token", "   ", *ipc_args])
    assert "token" in err and "empty" in err


@pytest.mark.parametrize("extra", [["--insecure"], ["--token", "s3cret"]])
def test_non_loopback_bind_with_token_or_insecure_starts(ipc_args, extra):
    p = _daemon(["--bind", "0.0.0.0", *extra, *ipc_args])
    try:
        line = p.stdout.readline()
        assert "kscope daemon ready" in line, p.stderr.read() if p.poll() is not None else line
        port = int(re.search(r"rpc_port=(\d+)", line).group(1))
        token = {"token": "s3cret"} if "--token" in extra else {}
        assert rpc(port, {"fn": "getStatus", **token}) == {"status": 1}
    finally:
        p.terminate()
        _out, err = p.communicate(timeout=30)
    if "--insecure" in extra:
        assert "INSECURE" in err and "without a token" in err


def test_unknown_function_answers_only_after_authentication(make_daemon):
    d = make_daemon(token="s3cret")
    reply = rpc(d.rpc_port, {"fn": "noSuchFunction"})
    assert reply["status"] == "failed" and "unauthorized" in reply["error"]
    assert "kscopeTrace" not in reply["error"]  # the function list is not revealed
    reply = rpc(d.rpc_port, {"fn": "noSuchFunction", "token": "s3cret"})
    assert "unknown function" in reply["error"] and "kscopeTrace" in reply["error"]


def test_in_process_daemon_applies_the_same_rules(make_daemon):
    from kinetoscope.errors import KinetoscopeError

    with pytest.raises(KinetoscopeError, match="empty"):
        make_daemon(token="")
    with pytest.raises(KinetoscopeError, match="without --token"):
        make_daemon(bind=["0.0.0.0"])
    d = make_daemon(bind=["127.0.0.1"])  # loopback: no token needed
    assert rpc(d.rpc_port, {"fn": "getStatus"}) == {"status": 1}
