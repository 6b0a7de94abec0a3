"""TLS and mutual TLS on the daemon's RPC port, with certificates generated here.

A real daemon (the CLI, in a subprocess) with ``--tls-cert --tls-key --tls-client-ca``; real
clients (``kscope trace``, in subprocesses, and DaemonClient in process). The right client
certificate traces a real registered process; no certificate, a wrong CA on either side, or
plain text are refused with one line naming the reason; the token is still checked inside TLS.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from cluster_certs import Certs, make_certs
from cluster_helpers import REPO_ROOT, kscope_env, run_kscope, wait_for

from kinetoscope.collect.client import DaemonClient, DaemonError
from kinetoscope.collect.tls import TlsClientOptions
from kinetoscope.daemon.daemon import Daemon, DaemonOptions
from kinetoscope.errors import KinetoscopeError, UsageError

pytest.importorskip("cryptography")

TOKEN = "s3cret-token"


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    return make_certs(tmp_path_factory.mktemp("certs"))


@pytest.fixture()
def mtls_daemon(certs: Certs, tmp_path: Path):
    sockdir = Path(f"/tmp/kscope-tls-{os.getpid()}-{os.urandom(3).hex()}")
    options = DaemonOptions(
        port=0,
        metrics_port=None,
        gpu_metrics=False,
        trace_root=str(tmp_path / "traces"),
        ipc_socket_dir=str(sockdir),
        token=TOKEN,
        tls_cert=certs.server.cert,
        tls_key=certs.server.key,
        tls_client_ca=certs.ca,
    )
    with Daemon(options) as d:
        yield d


def _client(d: Daemon, tls: TlsClientOptions | None, token: str | None = TOKEN, host: str = "127.0.0.1"):
    return DaemonClient(f"{host}:{d.rpc_port}", token=token, timeout=10, tls=tls)


def test_right_client_certificate_is_served(mtls_daemon: Daemon, certs: Certs) -> None:
    tls = TlsClientOptions(certs.ca, certs.client.cert, certs.client.key)
    assert _client(mtls_daemon, tls).get_status().status == 1
    assert _client(mtls_daemon, tls, host="localhost").list_processes().processes == []
    assert mtls_daemon.rpc.tls_failures == 0


@pytest.mark.parametrize(
    ("case", "expected"),
    [
        ("no client certificate", r"TLS: the daemon requires a client certificate"),
        (
            "client certificate of another CA",
            r"TLS: the daemon refused our client certificate: it is not signed by a CA",
        ),
        ("daemon certificate from another CA", r"daemon's certificate was not accepted"),
        ("plain text", r"this daemon requires TLS"),
    ],
)
def test_refused_with_one_line_naming_the_reason(
    mtls_daemon: Daemon, certs: Certs, case: str, expected: str
) -> None:
    tls = {
        "no client certificate": TlsClientOptions(certs.ca),
        "client certificate of another CA": TlsClientOptions(
            certs.ca, certs.other_client.cert, certs.other_client.key
        ),
        "daemon certificate from another CA": TlsClientOptions(
            certs.other_ca, certs.client.cert, certs.client.key
        ),
        "plain text": None,
    }[case]
    with pytest.raises(DaemonError) as info:
        _client(mtls_daemon, tls).get_status()
    message = str(info.value)
    assert "\n" not in message and re.search(expected, message), message
    # the daemon is still serving the right client afterwards
    good = TlsClientOptions(certs.ca, certs.client.cert, certs.client.key)
    assert _client(mtls_daemon, good).get_status().status == 1


def test_token_still_applies_inside_tls(mtls_daemon: Daemon, certs: Certs) -> None:
    tls = TlsClientOptions(certs.ca, certs.client.cert, certs.client.key)
    with pytest.raises(DaemonError, match="unauthorized: missing 'token'"):
        _client(mtls_daemon, tls, token=None).list_processes()
    with pytest.raises(DaemonError, match="unauthorized: wrong 'token'"):
        _client(mtls_daemon, tls, token="nope").list_processes()


def test_tls_client_against_plain_daemon_says_so(tmp_path: Path, certs: Certs) -> None:
    options = DaemonOptions(
        port=0, metrics_port=None, gpu_metrics=False, trace_root=str(tmp_path / "t"),
        ipc_socket_dir=f"/tmp/kscope-tls-{os.getpid()}-p",
    )  # fmt: skip
    with Daemon(options) as d:
        with pytest.raises(DaemonError, match="does not speak TLS"):
            _client(
                d, TlsClientOptions(certs.ca, certs.client.cert, certs.client.key), token=None
            ).get_status()


def test_bad_tls_files_are_one_line_errors(tmp_path: Path, certs: Certs) -> None:
    with pytest.raises(UsageError, match="--tls-ca .*missing.pem"):
        _ = TlsClientOptions(str(tmp_path / "missing.pem")).context
    with pytest.raises(UsageError, match="go together"):
        TlsClientOptions(certs.ca, certs.client.cert)
    with pytest.raises(KinetoscopeError, match="--tls-cert .*cannot load"):
        Daemon(DaemonOptions(port=0, metrics_port=None, tls_cert=certs.ca, tls_key=certs.client.key))


def test_mutual_tls_allows_a_public_bind_without_token(tmp_path: Path, certs: Certs) -> None:
    from kinetoscope.daemon.daemon import check_exposure

    with pytest.raises(KinetoscopeError, match="without --token"):
        check_exposure(["0.0.0.0"], None, False)
    check_exposure(["0.0.0.0"], None, False, mutual_tls=True)


@pytest.mark.torch
@pytest.mark.slow
def test_kscope_trace_over_mutual_tls_traces_a_real_process(tmp_path: Path, certs: Certs) -> None:
    """The CLI daemon with mutual TLS; `kscope trace --tls-ca --tls-cert --tls-key` traces a
    real PyTorch process; the same command without the certificate, or in plain text, fails."""
    pytest.importorskip("torch")
    sockdir = f"/tmp/kscope-tls-{os.getpid()}-c"
    trace_root = tmp_path / "traces"
    daemon = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "kinetoscope.cli.main",
            "daemon",
            "--port",
            "0",
            "--metrics-port",
            "-1",
            "--no-gpu-metrics",
            "--trace-root",
            str(trace_root),
            "--ipc-socket-dir",
            sockdir,
            "--tls-cert",
            certs.server.cert,
            "--tls-key",
            certs.server.key,
            "--tls-client-ca",
            certs.ca,
        ],  # fmt: skip
        cwd=REPO_ROOT,
        env=kscope_env({"COLUMNS": "1000"}),  # the ready line wraps at the width: keep it one line
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    worker = None
    try:
        assert daemon.stdout is not None
        line = daemon.stdout.readline()
        assert "tls=mutual" in line, line
        port = int(re.search(r"rpc_port=(\d+)", line).group(1))  # type: ignore[union-attr]
        conf = tmp_path / "kineto.conf"
        conf.write_text("ON_DEMAND_CONFIG_UPDATE_INTERVAL_SECS=1\n")
        worker = subprocess.Popen(
            [sys.executable, str(REPO_ROOT / "tests/daemon/torch_worker.py"), "--lifetime", "120"],
            env=kscope_env(
                {
                    "KINETO_USE_DAEMON": "1",
                    "KINETO_IPC_SOCKET_DIR": sockdir,
                    "KINETO_CONFIG": str(conf),
                    "RANK": "0",
                    "WORLD_SIZE": "1",
                }
            ),  # fmt: skip
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        tls = ["--tls-ca", certs.ca, "--tls-cert", certs.client.cert, "--tls-key", certs.client.key]
        host = ["--host", f"localhost:{port}"]

        def registered() -> bool:
            out = run_kscope("trace", *host, *tls, "--pids", str(worker.pid), "--duration-ms", "500",
                             "--no-catalog", "--json", "--wait", "--timeout", "90")  # fmt: skip
            return out.returncode == 0 and json.loads(out.stdout)["files"][0]["complete"]

        assert wait_for(registered, 120, "a complete trace over mutual TLS")
        no_cert = run_kscope(
            "trace", *host, "--tls-ca", certs.ca, "--all", "--duration-ms", "500", "--no-catalog"
        )
        plain = run_kscope("trace", *host, "--all", "--duration-ms", "500", "--no-catalog")
        for refused, why in ((no_cert, "client certificate"), (plain, "requires TLS")):
            assert refused.returncode != 0
            assert why in refused.stdout + refused.stderr, refused.stdout + refused.stderr
            assert "Traceback" not in refused.stderr
    finally:
        if worker is not None:
            worker.kill()
            worker.wait()
        daemon.terminate()
        daemon.wait(timeout=30)


def test_server_name_overrides_the_host_dialed(mtls_daemon: Daemon, certs: Certs) -> None:
    """A fleet sharing one certificate is dialed by address and checked for one name."""
    named = TlsClientOptions(certs.ca, certs.client.cert, certs.client.key, server_name="localhost")
    assert _client(mtls_daemon, named).get_status().status == 1
    wrong = TlsClientOptions(certs.ca, certs.client.cert, certs.client.key, server_name="kscope.example.org")
    with pytest.raises(DaemonError, match="certificate was not accepted"):
        _client(mtls_daemon, wrong).get_status()


def test_kscope_stacks_speaks_tls(mtls_daemon: Daemon, certs: Certs) -> None:
    """`kscope stacks` takes the same TLS flags as `kscope trace`: with them the daemon answers
    (no process registered: an empty report, not a TLS error); without them, one line saying the
    daemon requires TLS."""
    host = ["--host", f"localhost:{mtls_daemon.rpc_port}", "--token", TOKEN, "--all"]
    tls = ["--tls-ca", certs.ca, "--tls-cert", certs.client.cert, "--tls-key", certs.client.key]
    served = run_kscope("stacks", *host, *tls, "--json", timeout=60)
    doc = json.loads(served.stdout)
    assert doc["ranks"] == [] and not any("TLS" in str(e) for e in doc.get("errors", [])), served.stdout
    plain = run_kscope("stacks", *host, timeout=60)
    assert plain.returncode != 0
    assert "requires TLS" in plain.stdout + plain.stderr, plain.stdout + plain.stderr
    assert "Traceback" not in plain.stderr
