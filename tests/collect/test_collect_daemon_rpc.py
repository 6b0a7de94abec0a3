"""`kscope trace` against the real daemon (subprocess) without any traced process: token, refusal
reasons and the "nothing registered" message. Cheap: no torch."""

from __future__ import annotations

import orjson
import pytest

from kinetoscope.collect.client import DaemonError
from kinetoscope.demo.local import LocalDaemon


@pytest.fixture(scope="module")
def token_daemon(tmp_path_factory):
    with LocalDaemon(tmp_path_factory.mktemp("tokend"), token="s3cret") as daemon:
        yield daemon


def test_missing_token_is_refused_with_the_daemons_reason(token_daemon, run_kscope):
    r = run_kscope("trace", "-H", str(token_daemon.address), "--all", "--duration-ms", "100", "--json")
    assert r.returncode == 1
    (err,) = orjson.loads(r.stdout)["errors"]
    assert err["kind"] == "failed" and err["host"] == str(token_daemon.address)
    assert "unauthorized: missing 'token'" in err["message"]


def test_token_from_env_and_nothing_registered(token_daemon, run_kscope):
    r = run_kscope(
        "trace", "-H", str(token_daemon.address), "--all", "--iterations", "3", env={"KSCOPE_TOKEN": "s3cret"}
    )
    assert r.returncode == 1
    flat = " ".join(r.stderr.split())
    assert "nothing to trace on host " in flat
    assert (
        f"({token_daemon.address}): no processes registered (are they started with KINETO_USE_DAEMON=1"
        in flat
    )


def test_output_dir_outside_trace_root_is_refused(token_daemon, tmp_path):
    from kinetoscope.collect.trigger import Target, TraceOptions, TraceRequest, trigger_trace

    res = trigger_trace(
        TraceRequest(
            [token_daemon.address],
            Target(all=True),
            TraceOptions(duration_ms=100),
            output_dir=str(tmp_path / "elsewhere"),
        ),
        token="s3cret",
    )
    assert [e.kind for e in res.errors] == ["failed"]
    assert "kscopeTrace failed" in res.errors[0].message and "output_dir" in res.errors[0].message


def test_client_against_real_daemon(token_daemon):
    client = token_daemon.client()
    assert client.get_status().status == 1
    assert client.get_version().version
    with pytest.raises(DaemonError, match="unknown function"):
        client.call("noSuchFunction")
