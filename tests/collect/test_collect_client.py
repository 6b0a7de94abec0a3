"""RPC client against a tiny real TCP server: framing, token, and every failure naming its cause."""

from __future__ import annotations

import socket

import pytest

from kinetoscope.collect.client import DaemonClient, DaemonError, HostAddress, parse_host, parse_hosts
from kinetoscope.errors import UsageError
from kinetoscope.protocol import rpc
from kinetoscope.protocol.rpc import KscopeTraceRequest


@pytest.mark.parametrize(
    "text, expected",
    [
        ("node7", HostAddress("node7", 1778)),
        ("node7:1779", HostAddress("node7", 1779)),
        ("10.0.0.3:42", HostAddress("10.0.0.3", 42)),
        ("[::1]:1779", HostAddress("::1", 1779)),
        ("[fe80::1]", HostAddress("fe80::1", 1778)),
        ("::1", HostAddress("::1", 1778)),
    ],
)
def test_parse_host(text, expected):
    assert parse_host(text) == expected


def test_host_str_round_trips():
    for text in ("node7:1779", "[::1]:1779"):
        assert str(parse_host(text)) == text


@pytest.mark.parametrize("text", ["node:abc", "node:0", "node:70000", "[::1", ":1778", ""])
def test_parse_host_rejects(text):
    with pytest.raises(UsageError):
        parse_host(text)


def test_parse_hosts_defaults_and_dedup():
    assert parse_hosts(None) == [HostAddress("localhost", 1778)]
    assert parse_hosts(["a,b:2", "a"]) == [HostAddress("a"), HostAddress("b", 2)]


def test_call_sends_fn_fields_and_token(rpc_server):
    srv = rpc_server({"getVersion": lambda r: {"version": "0.6.0"}, "kscopeTrace": lambda r: {"matched": []}})
    client = DaemonClient(srv.address, token="s3cret", timeout=5)
    assert client.get_version().version == "0.6.0"
    assert srv.requests[-1] == {"fn": "getVersion", "token": "s3cret"}
    client.call("kscopeTrace", trace_id="t1", job_id=None, pids=[1, 2])
    assert srv.requests[-1] == {"fn": "kscopeTrace", "trace_id": "t1", "pids": [1, 2], "token": "s3cret"}


def test_answers_decode_into_typed_responses(rpc_server):
    # a fake daemon sends part of an answer: the fields a daemon may omit take their defaults
    srv = rpc_server(
        {
            "kscopeListProcesses": lambda r: {"hostname": "n1", "processes": [{"pid": 7, "rank": 0}]},
            "kscopeTraceStatus": lambda r: {"files": [{"pid": 7, "path": "/t/a.json", "complete": True}]},
        }
    )
    client = DaemonClient(srv.address)
    listing = client.list_processes()
    assert listing.hostname == "n1" and listing.next_offset is None
    assert [(p.pid, p.rank, p.is_launcher, p.alive) for p in listing.processes] == [(7, 0, False, None)]
    status = client.trace_status("t1")
    assert status.known and status.files[0].complete and status.files[0].delivered is None


@pytest.mark.parametrize(
    ("answer", "field"),
    [
        ({"processes": [{"rank": 0}]}, "'processes[0]': Object missing required field `pid`"),
        ({"processes": [{"pid": "seven"}]}, "'processes[0].pid': Expected `int`, got `str`"),
        ({"processes": "none"}, "'processes': Expected `array`, got `str`"),
        ({"next_offset": True}, "'next_offset': Expected `int | null`, got `bool`"),
    ],
)
def test_malformed_answer_is_one_line_naming_the_field(rpc_server, answer, field):
    srv = rpc_server({"kscopeListProcesses": lambda r: answer})
    with pytest.raises(DaemonError) as info:
        DaemonClient(srv.address).list_processes()
    assert info.value.kind == "no_answer"
    assert str(info.value) == f"daemon {srv.address}: kscopeListProcesses: malformed answer: {field}"


def test_oversized_answer_is_one_line(rpc_server):
    big = {"hostname": "n1", "processes": [{"pid": p} for p in range(100)]}
    srv = rpc_server({"kscopeListProcesses": lambda r: big})
    with pytest.raises(DaemonError) as info:
        DaemonClient(srv.address).ask(
            "kscopeListProcesses", rpc.KscopeListProcessesResponse, max_reply_bytes=256
        )
    assert info.value.kind == "no_answer" and "\n" not in str(info.value)
    assert "exceeds the 256-byte limit" in str(info.value)


def test_failed_status_carries_the_daemons_reason(rpc_server):
    srv = rpc_server({"kscopeTrace": lambda r: {"status": "failed", "error": "bad token"}})
    with pytest.raises(DaemonError) as info:
        DaemonClient(srv.address).trace(KscopeTraceRequest(trace_id="x"))
    assert info.value.kind == "failed"
    assert str(info.value) == f"daemon {srv.address}: kscopeTrace failed: bad token"


def test_dynolog_style_failure_without_error_field(rpc_server):
    srv = rpc_server({"kscopeTrace": lambda r: {"status": "failed with exception = boom"}})
    with pytest.raises(DaemonError, match="failed with exception = boom"):
        DaemonClient(srv.address).trace(KscopeTraceRequest(trace_id="x"))


def test_closed_without_answer_suggests_plain_dynolog(rpc_server):
    srv = rpc_server({})  # unknown fn: close without a reply, as dynolog does
    with pytest.raises(DaemonError) as info:
        DaemonClient(srv.address).list_processes()
    assert info.value.kind == "no_answer"
    assert "plain Dynolog daemon" in str(info.value)


def test_refused(free_port):
    with pytest.raises(DaemonError) as info:
        DaemonClient(f"127.0.0.1:{free_port}", timeout=2).get_status()
    assert info.value.kind == "unreachable"
    assert f"127.0.0.1:{free_port}" in str(info.value)
    assert "connection refused" in str(info.value)


def test_unresolvable_host():
    with pytest.raises(DaemonError) as info:
        DaemonClient("no-such-host.invalid:1778", timeout=2).get_status()
    assert info.value.kind == "unreachable"
    assert "cannot resolve host name 'no-such-host.invalid'" in str(info.value)


def test_silent_server_times_out():
    with socket.socket() as listener:  # accepts (kernel backlog) but never answers
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        port = listener.getsockname()[1]
        with pytest.raises(DaemonError) as info:
            DaemonClient(f"127.0.0.1:{port}", timeout=0.3).get_status()
    assert info.value.kind == "no_answer"
    assert "no answer within 0.3 s" in str(info.value)
