"""Issue 16 item 1: nothing the RPC port says can make the daemon (or a traced process) write
outside ``--trace-root`` - through a symlink below the root, at check time or at use, or
through a character that breaks a Kineto ``KEY=VALUE`` config line. Real daemon, real sockets."""

from __future__ import annotations

import os

import pytest
from daemon_helpers import rpc

from kinetoscope.daemon.paths import PathRefused, confine


@pytest.fixture()
def elsewhere(tmp_path):
    """A directory outside the trace root that must stay empty."""
    d = tmp_path / "elsewhere"
    d.mkdir()
    return d


def _registered(clients, pid: int = 8800):
    c = clients()
    assert c.poll([pid]) == ""
    return c


def test_trace_id_that_is_a_symlink_in_the_root_is_refused(daemon, clients, trace_root, elsewhere):
    os.symlink(elsewhere, os.path.join(trace_root, "link"))
    c = _registered(clients)
    res = rpc(daemon.rpc_port, {"fn": "kscopeTrace", "trace_id": "link", "all": True})
    assert res["status"] == "failed" and "symlink" in res["error"]
    assert list(elsewhere.iterdir()) == []  # no manifest.<host>.json written through the link
    assert c.poll([8800]) == ""  # no config (with a log file under the link) was queued


def test_trace_id_symlink_below_an_output_dir_is_refused(daemon, clients, trace_root, elsewhere):
    os.makedirs(os.path.join(trace_root, "sub"))
    os.symlink(elsewhere, os.path.join(trace_root, "sub", "evil"))
    c = _registered(clients)
    req = {"fn": "kscopeTrace", "trace_id": "evil", "output_dir": f"{trace_root}/sub", "all": True}
    res = rpc(daemon.rpc_port, req)
    assert res["status"] == "failed" and "symlink" in res["error"]
    assert list(elsewhere.iterdir()) == []
    assert c.poll([8800]) == ""


def test_symlink_to_inside_the_root_is_refused_too(daemon, trace_root):
    os.makedirs(os.path.join(trace_root, "real"))
    os.symlink(os.path.join(trace_root, "real"), os.path.join(trace_root, "alias"))
    res = rpc(daemon.rpc_port, {"fn": "kscopeTrace", "trace_id": "t1", "output_dir": f"{trace_root}/alias"})
    assert res["status"] == "failed" and "symlink" in res["error"]


def test_trace_dir_swapped_for_a_symlink_after_the_request_gets_no_manifest(
    daemon, clients, trace_root, elsewhere
):
    """The check at request time is not enough: the manifest write walks the path again."""
    c = _registered(clients)
    res = rpc(daemon.rpc_port, {"fn": "kscopeTrace", "trace_id": "swap", "all": True})
    assert res["status"] == "ok" and res["triggered"] == 1 and res["manifest"]
    trace_dir = res["trace_dir"]
    for name in os.listdir(trace_dir):
        os.unlink(os.path.join(trace_dir, name))
    os.rmdir(trace_dir)
    os.symlink(elsewhere, trace_dir)  # planted after the check
    with open(
        res["matched"][0]["path"], "w"
    ) as f:  # the file appears (through the link): the manifest changes
        f.write('{"traceEvents": []}')
    status = rpc(daemon.rpc_port, {"fn": "kscopeTraceStatus", "trace_id": "swap"})
    assert status["status"] == "ok" and status["manifest"] is None
    assert [p.name for p in elsewhere.iterdir()] == [os.path.basename(res["matched"][0]["path"])]
    c.close()


@pytest.mark.parametrize(
    "value",
    [
        "{root}/a=/etc/x.json",  # a second '=' makes Kineto stop parsing: default /tmp path
        "={root}/t.json",
    ],
)
def test_config_breaking_log_file_is_refused(daemon, clients, trace_root, value):
    c = _registered(clients)
    config = f"ACTIVITIES_LOG_FILE={value.format(root=trace_root)}\nPROFILE_START_TIME=0"
    reply = rpc(daemon.rpc_port, {"fn": "setKinetOnDemandRequest", "config": config, "pids": [0]})
    assert reply["status"] == "failed", reply
    assert c.poll([8800]) == ""


def test_malformed_line_before_the_log_file_is_refused(daemon, clients, trace_root):
    """Kineto aborts parsing at a line without exactly one '=': the log file after it is never
    read and the trace goes to /tmp/libkineto_activities_<pid>.json."""
    c = _registered(clients)
    config = f"PROFILE_START_TIME=0=1\nACTIVITIES_LOG_FILE={trace_root}/t.json"
    reply = rpc(daemon.rpc_port, {"fn": "setKinetOnDemandRequest", "config": config, "pids": [0]})
    assert reply["status"] == "failed" and "KEY=VALUE" in reply["error"]
    assert c.poll([8800]) == ""


def test_output_dir_with_equals_is_refused_cleanly(daemon, clients, trace_root):
    c = _registered(clients)
    res = rpc(
        daemon.rpc_port,
        {"fn": "kscopeTrace", "trace_id": "eq", "output_dir": f"{trace_root}/a=b", "all": True},
    )
    assert res["status"] == "failed" and "'='" in res["error"] and "internal" not in res["error"]
    assert c.poll([8800]) == ""


def test_writes_under_the_root_never_follow_symlinks(tmp_path, elsewhere):
    from kinetoscope.daemon.paths import ensure_dir_under, write_file_under

    root = str(tmp_path / "root")
    os.makedirs(f"{root}/d")
    os.symlink(elsewhere, f"{root}/d/l")
    with pytest.raises(PathRefused, match="symlink"):
        ensure_dir_under(root, f"{root}/d/l/x")
    with pytest.raises(PathRefused, match="symlink"):
        write_file_under(root, f"{root}/d/l/m.json", b"{}")
    with pytest.raises(PathRefused, match="symlink"):
        confine(f"{root}/d/l/m.json", root)
    os.symlink(f"{elsewhere}/target.json", f"{root}/d/m.json")
    write_file_under(root, f"{root}/d/m.json", b"{}")  # replaces the planted link, not its target
    assert not os.path.islink(f"{root}/d/m.json") and list(elsewhere.iterdir()) == []
    assert ensure_dir_under(root, f"{root}/d/new/er") == [f"{root}/d/new", f"{root}/d/new/er"]


@pytest.mark.parametrize("log_file", ["/r/t.json ", " /r/t.json", "/r/\x0bt.json", "/r/t\t"])
def test_built_config_refuses_values_kineto_would_change(log_file):
    """Found by tests/fuzz: Kineto trims blanks around a value, so the file written was not the
    one named; control characters are refused as in every other path."""
    from kinetoscope.protocol import kineto_config as kc

    with pytest.raises(ValueError):
        kc.build_config(log_file=log_file)


@pytest.mark.parametrize("sep", ["\r\n", "\n\x0b", "\n\x0c"])
def test_config_with_other_control_characters_is_refused(daemon, clients, trace_root, sep):
    """A second log-file line whose key only a whitespace-trimming parser would recognise."""
    c = _registered(clients)
    config = f"ACTIVITIES_LOG_FILE={trace_root}/ok.json{sep}ACTIVITIES_LOG_FILE\x0b=/etc/x.json"
    reply = rpc(daemon.rpc_port, {"fn": "setKinetOnDemandRequest", "config": config, "pids": [0]})
    assert reply["status"] == "failed" and "control characters" in reply["error"]
    assert c.poll([8800]) == ""
