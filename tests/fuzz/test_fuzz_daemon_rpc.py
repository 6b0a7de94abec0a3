"""Fuzzing the RPC port of a live daemon on loopback: framing, JSON and every handler.

Inputs: (1) raw byte streams - random bytes, hostile length prefixes, mutated copies of the
real ``dyno gputrace`` frame and of kscope requests; (2) well-formed frames whose JSON object
names a real function (or not) with random fields of random JSON types, hostile paths and
trace ids, while a process is registered so that trace requests really queue configs.
Properties: every connection gets one framed JSON object back (the client half-closes, so
the server never has to wait); a failure carries a string ``error``; no answer is an
"internal error" (a handler bug); ``getStatus`` still answers after each input; nothing is
written outside the trace root.
"""

from __future__ import annotations

import os
import random
import socket
import struct

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from kinetoscope.protocol import wire
from tests.daemon.daemon_helpers import IpcClient

from . import fuzz_settings
from .test_fuzz_daemon_ipc import mutate

FUNCTIONS = [
    "getStatus", "getVersion", "setKinetOnDemandRequest", "dcgmProfPause", "dcgmProfResume",
    "kscopeListProcesses", "kscopeTrace", "kscopeTraceStatus",
]  # fmt: skip
FIELDS = [
    "trace_id", "output_dir", "pids", "job_id", "all", "process_limit", "iterations", "duration_ms",
    "iteration_roundup", "profile_start_time_ms", "record_shapes", "profile_memory", "with_stack",
    "with_flops", "with_modules", "include_launchers", "config", "duration_s", "token",
]  # fmt: skip
DYNO_BODY = (
    b'\n{\n    "fn": "setKinetOnDemandRequest",\n    "config": "ACTIVITIES_LOG_FILE=/tmp/x/trace.json'
    b"\\nPROFILE_START_TIME=0\\nACTIVITIES_DURATION_MSECS=500\\nPROFILE_REPORT_INPUT_SHAPES=false"
    b'",\n    "job_id": 0,\n    "pids": [0],\n    "process_limit": 3\n}'
)
SEED_BODIES = [
    DYNO_BODY,
    b'{"fn":"getStatus"}',
    b'{"fn":"kscopeTrace","trace_id":"seed","all":true,"duration_ms":100}',
    b'{"fn":"kscopeTraceStatus","trace_id":"seed"}',
    b'{"fn":"kscopeListProcesses","job_id":"7"}',
]

json_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(2**63), max_value=2**64 - 1),
    st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=40),
)  # fmt: skip
json_values = st.recursive(
    json_scalars,
    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=8), kids, max_size=4),
    max_leaves=12,
)


def hostile_paths(root: str) -> st.SearchStrategy[str]:
    parts = st.sampled_from(
        ["a", "b", "..", ".", "", "x=y", "#c", " s", "link", "\n", "é", "seed", "-", "a" * 300]
    )
    return st.builds(
        lambda prefix, ps: prefix + "/".join(ps),
        st.sampled_from([root + "/", root, "/tmp/", "/etc/", "", "rel/", root + "-x/"]),
        st.lists(parts, max_size=5),
    )


def requests(root: str) -> st.SearchStrategy[dict]:
    path_or_value = st.one_of(hostile_paths(root), json_values)
    config = st.builds(
        lambda lines: "\n".join(lines),
        st.lists(
            st.one_of(
                st.builds(lambda v: f"ACTIVITIES_LOG_FILE={v}", hostile_paths(root)),
                st.sampled_from(
                    ["PROFILE_START_TIME=0", "ACTIVITIES_DURATION_MSECS=100", "X", "A=B=C", "# c", ""]
                ),
                st.text(max_size=30),
            ),
            max_size=5,
        ),
    )
    special = {
        "output_dir": path_or_value,
        "config": st.one_of(config, json_values),
        "trace_id": st.one_of(
            st.from_regex(r"[A-Za-z0-9-]{1,12}", fullmatch=True), json_values, hostile_paths(root)
        ),
        "pids": st.one_of(st.lists(st.integers(min_value=-(2**31), max_value=2**31)), json_values),
    }
    fields = st.dictionaries(st.sampled_from(FIELDS), json_values, max_size=6).flatmap(
        lambda d: st.fixed_dictionaries({k: special.get(k, st.just(v)) for k, v in d.items()})
    )
    fn = st.one_of(st.sampled_from(FUNCTIONS), st.text(max_size=20), json_values)
    return st.builds(lambda f, rest: {**rest, "fn": f}, fn, fields)


_STRATEGIES: dict[str, st.SearchStrategy[dict]] = {}


def _requests_for(root: str) -> st.SearchStrategy[dict]:
    """One strategy object per root: building it per example made generation dominate."""
    if root not in _STRATEGIES:
        _STRATEGIES[root] = requests(root)
    return _STRATEGIES[root]


def exchange(port: int, payload: bytes) -> dict:
    """Send ``payload``, half-close, read the one answer; it must be a framed JSON object."""
    with socket.create_connection(("127.0.0.1", port), timeout=20) as s:
        try:
            s.sendall(payload)
            s.shutdown(socket.SHUT_WR)
        except OSError:
            pass  # the server may answer and close before we finish (e.g. a bad length)
        reply = orjson.loads(wire.read_rpc_frame(s))
    assert isinstance(reply, dict), reply
    if reply.get("status") in ("failed",) or str(reply.get("status", "")).startswith("failed"):
        assert isinstance(reply.get("error"), str) and reply["error"]
    assert "internal error" not in str(reply.get("error", "")), reply
    return reply


@pytest.fixture(scope="module")
def registered(live_daemon):
    """A process registered with the daemon, so that trace requests match something."""
    c = IpcClient(live_daemon.ipc.endpoint.address, live_daemon.ipc.endpoint.socket_dir)
    assert c.poll([4242]) == ""
    yield c
    c.close()


def _status_ok(port: int) -> None:
    assert exchange(port, wire.frame_rpc(b'{"fn":"getStatus"}')) == {"status": 1}


raw_streams = st.one_of(
    st.binary(max_size=300),
    st.builds(
        lambda n, b: struct.pack("=i", n) + b,
        st.integers(min_value=-(2**31), max_value=2**31 - 1),
        st.binary(max_size=200),
    ),
    st.builds(
        lambda b, r: wire.frame_rpc(mutate(b, r)),
        st.sampled_from(SEED_BODIES),
        st.randoms(use_true_random=False),
    ),
    st.builds(
        lambda b, r: mutate(wire.frame_rpc(b), r),
        st.sampled_from(SEED_BODIES),
        st.randoms(use_true_random=False),
    ),
)


@fuzz_settings(300)
@given(raw_streams)
def test_every_byte_stream_gets_one_json_answer(live_daemon, registered, fuzz_counts, payload):
    fuzz_counts["rpc: raw frames"] += 1
    exchange(live_daemon.rpc_port, payload)
    _status_ok(live_daemon.rpc_port)


@fuzz_settings(300)
@given(st.data())
def test_every_request_object_gets_a_clean_answer(live_daemon, registered, fuzz_counts, data):
    request = data.draw(_requests_for(live_daemon.trace_root))
    body = orjson.dumps(request, option=orjson.OPT_NON_STR_KEYS)
    fuzz_counts["rpc: handler requests"] += 1
    exchange(live_daemon.rpc_port, wire.frame_rpc(body))
    registered.poll([4242])  # take a queued config, if any, so the next request can trigger again
    _status_ok(live_daemon.rpc_port)


def test_nothing_was_written_outside_the_trace_root(live_daemon, registered):
    """After the fuzzing above (same module daemon): the root's parent holds only the root."""
    parent = os.path.dirname(live_daemon.trace_root)
    assert os.listdir(parent) == [os.path.basename(live_daemon.trace_root)]
    assert not os.path.exists("/tmp/x/trace.json")


def test_mutator_is_deterministic():
    assert mutate(DYNO_BODY, random.Random(1)) == mutate(DYNO_BODY, random.Random(1))
