"""kscope extension functions with real client processes (fake_kineto.py, no torch)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from daemon_helpers import rpc

from kinetoscope.daemon.registry import Registry

REPO = Path(__file__).resolve().parents[2]
FAKE = Path(__file__).with_name("fake_kineto.py")
RANK_ENV = {
    "RANK": "3",
    "LOCAL_RANK": "1",
    "WORLD_SIZE": "8",
    "GROUP_RANK": "1",
    "TORCHELASTIC_RUN_ID": "run-xyz",
    "MASTER_ADDR": "10.0.0.7",
    "MASTER_PORT": "29500",
    "SLURM_JOB_ID": "4242_7",
}


@pytest.fixture()
def spawn(sockdir):
    """Start fake_kineto processes; each in its own process group, killed with its children."""
    procs: list[subprocess.Popen] = []

    def _spawn(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen:
        full_env = {k: v for k, v in os.environ.items() if k not in RANK_ENV}
        full_env.update(env or {})
        full_env["PYTHONPATH"] = str(REPO)
        p = subprocess.Popen(
            [sys.executable, str(FAKE), sockdir, *args],
            env=full_env,
            stdout=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        procs.append(p)
        return p

    try:
        yield _spawn
    finally:
        for p in procs:
            try:
                os.killpg(p.pid, signal.SIGKILL)  # the launcher's ranks too
            except ProcessLookupError:
                pass
            p.wait(timeout=10)
            p.stdout.close()


def _wait_for(predicate, timeout: float = 10.0, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def _processes(port: int, **kw) -> list[dict]:
    return rpc(port, {"fn": "kscopeListProcesses", **kw})["processes"]


def test_process_info_from_proc(daemon, spawn):
    p = spawn("--lifetime", "20", env=RANK_ENV)
    procs = _wait_for(lambda: _processes(daemon.rpc_port), what="registration")
    (info,) = procs
    assert info["pid"] == p.pid and info["pids"][0] == p.pid and info["pids"][1] == os.getpid()
    assert info["job_id"] == "4242"  # kineto's strtoll of SLURM_JOB_ID
    assert (info["rank"], info["local_rank"], info["world_size"], info["group_rank"]) == (3, 1, 8, 1)
    assert (info["torchelastic_run_id"], info["master_addr"], info["master_port"]) == (
        "run-xyz",
        "10.0.0.7",
        29500,
    )
    assert info["slurm_job_id"] == "4242_7"
    assert str(FAKE) in info["cmdline"]
    assert info["is_launcher"] is False and info["alive"] is True and info["pending"] is False
    assert info["host_pid"] == p.pid
    assert set(info) >= {
        "pid", "pids", "job_id", "cmdline", "rank", "local_rank", "world_size", "group_rank",
        "torchelastic_run_id", "master_addr", "master_port", "slurm_job_id", "is_launcher",
        "last_poll_s_ago", "pending",
    }  # fmt: skip


def test_proc_is_read_once_per_process():
    calls = []

    def reader(pid, sender):
        calls.append(pid)
        return None

    reg = Registry(info_reader=reader)
    for _ in range(5):
        reg.poll(0, (10, 9), 3)
    reg.poll(0, (11, 9), 3)
    assert calls == [10, 11]


def test_kscope_trace_end_to_end_with_launcher(daemon, spawn, trace_root):
    launcher = spawn("--children", "2", "--lifetime", "30")
    procs = _wait_for(
        lambda: (ps := _processes(daemon.rpc_port)) and len(ps) == 3 and ps, what="launcher + 2 ranks"
    )
    by_pid = {p["pid"]: p for p in procs}
    assert by_pid[launcher.pid]["is_launcher"] is True
    ranks = sorted(p["rank"] for p in procs if not p["is_launcher"])
    assert ranks == [0, 1]

    res = rpc(
        daemon.rpc_port, {"fn": "kscopeTrace", "trace_id": "kst-test-1", "all": True, "duration_ms": 200}
    )
    assert res["status"] == "ok" and res["hostname"] == "testhost" and res["trace_id"] == "kst-test-1"
    trace_dir = os.path.join(trace_root, "kst-test-1")
    assert res["output_dir"] == trace_root and res["trace_dir"] == trace_dir
    assert res["triggered"] == 2
    assert res["config"].startswith("PROFILE_START_TIME=0\nACTIVITIES_DURATION_MSECS=200\n")
    matched = {m["pid"]: m for m in res["matched"]}
    assert matched[launcher.pid]["triggered"] is False and matched[launcher.pid]["reason"].startswith(
        "launcher"
    )
    for m in res["matched"]:
        if m["pid"] != launcher.pid:
            assert m["triggered"] is True and m["busy"] is False and m["reason"] is None
            assert m["log_file"] == f"{trace_dir}/rank-{m['rank']}.pt.trace.json"
            assert m["path"] == f"{trace_dir}/rank-{m['rank']}_{m['pid']}.pt.trace.json"

    manifest_path = os.path.join(trace_dir, "manifest.testhost.json")
    assert res["manifest"] == manifest_path
    manifest = json.loads(Path(manifest_path).read_text())
    assert manifest["kinetoscope_manifest"] == 1 and manifest["trace_id"] == "kst-test-1"
    assert manifest["config"] == res["config"]
    assert {f["rank"] for f in manifest["files"]} == {0, 1}
    assert all(f["complete"] is False and f["host"] == "testhost" for f in manifest["files"])

    def all_done():
        st = rpc(daemon.rpc_port, {"fn": "kscopeTraceStatus", "trace_id": "kst-test-1"})
        return st if st["all_complete"] else None

    st = _wait_for(all_done, what="both rank files")
    assert st["known"] is True and len(st["files"]) == 2
    for f in st["files"]:
        assert f["exists"] and f["complete"] and f["delivered"] and f["bytes"] > 0
        assert json.loads(Path(f["path"]).read_text())["trace_id"] == "kst-test-1"
        # what `kscope trace --wait` needs to tell dead/stalled from in progress (added fields)
        assert isinstance(f["delivered_s_ago"], float) and 0 <= f["delivered_s_ago"] < 60
        assert isinstance(f["last_poll_s_ago"], float) and f["last_poll_s_ago"] >= 0
        assert f["tmp_bytes"] is None  # renamed: no .tmp left
    # The rank processes exit after tracing (fake_kineto), the launcher reaps them.
    st = _wait_for(
        lambda: (
            (s := rpc(daemon.rpc_port, {"fn": "kscopeTraceStatus", "trace_id": "kst-test-1"}))
            and not any(f["alive"] for f in s["files"])
            and s
        ),
        what="ranks to exit",
    )
    manifest = json.loads(Path(manifest_path).read_text())
    assert all(f["complete"] and f["bytes"] > 0 for f in manifest["files"])  # refreshed by status


def test_kscope_trace_filters_and_options(daemon, spawn, trace_root):
    spawn("--lifetime", "20", "--stay", env={"SLURM_JOB_ID": "77"})
    other = spawn("--lifetime", "20", "--stay")
    _wait_for(lambda: len(_processes(daemon.rpc_port)) == 2, what="two processes")

    res = rpc(daemon.rpc_port, {"fn": "kscopeTrace", "trace_id": "t-job", "job_id": 77, "iterations": 5,
                                "iteration_roundup": 10, "record_shapes": True})  # fmt: skip
    assert [m["job_id"] for m in res["matched"]] == ["77"]
    assert res["config"] == (
        "PROFILE_START_ITERATION=0\nPROFILE_START_ITERATION_ROUNDUP=10\nACTIVITIES_ITERATIONS=5"
        "\nPROFILE_REPORT_INPUT_SHAPES=true\nPROFILE_WITH_STACK=false\nPROFILE_WITH_FLOPS=false\nPROFILE_WITH_MODULES=false"
    )
    (m,) = res["matched"]
    assert m["log_file"] == f"{trace_root}/t-job/testhost.pt.trace.json"  # rank unknown: host name

    res = rpc(daemon.rpc_port, {"fn": "kscopeTrace", "trace_id": "t-pid", "pids": [other.pid]})
    assert [m["pid"] for m in res["matched"]] == [other.pid]

    res = rpc(daemon.rpc_port, {"fn": "kscopeTrace", "trace_id": "t-none", "job_id": "999"})
    assert res["matched"] == [] and res["triggered"] == 0 and "2 processes registered" in res["registered"]
    assert not os.path.exists(os.path.join(trace_root, "t-none"))  # nothing created for nothing
    st = rpc(daemon.rpc_port, {"fn": "kscopeTraceStatus", "trace_id": "t-none"})
    assert st["known"] is False and st["files"] == []

    dup = rpc(daemon.rpc_port, {"fn": "kscopeTrace", "trace_id": "t-pid", "all": True})
    assert dup["status"] == "failed" and "already used" in dup["error"]


@pytest.mark.parametrize(
    "fields, why",
    [
        ({"output_dir": "/etc"}, "outside"),
        ({"output_dir": "{root}/../x"}, ".."),
        ({"output_dir": "x/y"}, "not absolute"),
        ({"profile_start_time_ms": 1000}, "in the past"),
        ({"iterations": 3, "profile_memory": True}, "iteration"),
        ({"duration_ms": 0}, ">= 1"),
        ({"iteration_roundup": 0, "iterations": 2}, ">= 1"),
    ],
)
def test_kscope_trace_refusals(daemon, trace_root, fields, why):
    fields = {k: v.format(root=trace_root) if isinstance(v, str) else v for k, v in fields.items()}
    res = rpc(daemon.rpc_port, {"fn": "kscopeTrace", "trace_id": "refused", **fields})
    assert res["status"] == "failed" and why in res["error"]
    # a refused request does not burn its trace id
    assert rpc(daemon.rpc_port, {"fn": "kscopeTrace", "trace_id": "refused"})["status"] == "ok"


def test_kscope_trace_busy_and_process_limit(daemon, spawn, trace_root):
    spawn("--children", "3", "--lifetime", "20", "--period", "5")  # slow pollers: configs stay pending
    _wait_for(lambda: len(_processes(daemon.rpc_port)) == 4, what="launcher + 3 ranks")
    res = rpc(daemon.rpc_port, {"fn": "kscopeTrace", "trace_id": "lim", "all": True, "process_limit": 2})
    assert res["triggered"] == 2
    reasons = sorted((m["reason"] or "triggered").split(" ")[0] for m in res["matched"])
    assert reasons == ["launcher", "limit", "triggered", "triggered"]
    res2 = rpc(daemon.rpc_port, {"fn": "kscopeTrace", "trace_id": "lim2", "all": True})
    reasons = sorted((m["reason"] or "triggered").split(" ")[0] for m in res2["matched"])
    assert reasons == ["busy", "busy", "launcher", "triggered"]
    procs = _processes(daemon.rpc_port)
    assert sum(p["pending"] for p in procs) == 3
    assert {p["pending_trace_id"] for p in procs if p["pending"]} == {"lim", "lim2"}


def _handlers(trace_root: str):
    from kinetoscope.daemon.handlers import RpcHandlers
    from kinetoscope.daemon.metrics import DaemonMetrics
    from kinetoscope.daemon.traces import TraceBook

    registry = Registry(info_reader=lambda pid, sender: None)
    h = RpcHandlers(
        registry=registry, book=TraceBook(), metrics=DaemonMetrics(), hostname="h", trace_root=trace_root
    )
    return registry, h


def test_duration_trace_dropped_by_kineto_is_sent_again_once_it_polls_idle(tmp_path):
    """Kineto that took a duration config and polls idle (type 3) 3 s later with no file dropped
    it (torch 2.13's late-tick 'Not starting tracing'): the status call queues it again, up to
    twice. A busy poll (type 1), a written file or an iteration request are left alone."""
    registry, h = _handlers(str(tmp_path))
    for pid in (11, 12, 13):
        registry.poll(7, (pid, 1), 3)

    def status(trace_id):
        return {f.pid: f for f in h.kscope_trace_status({"trace_id": trace_id}).files}

    h.kscope_trace({"trace_id": "d-1", "all": True, "duration_ms": 300})
    got = {pid: registry.poll(7, (pid, 1), 3) for pid in (11, 12, 13)}  # all three pick it up
    assert all("ACTIVITIES_DURATION_MSECS=300" in text for text in got.values())
    record = h.book.get("d-1")
    for tf in record.files:
        tf.pending.delivered_at -= 4.0  # picked up 4 s ago (the polls below come after that)
        if tf.process.pid == 12:
            Path(tf.path).write_text("{}")  # 12 finished its trace
    registry.poll(7, (11, 1), 3)  # 11: idle again, no file -> dropped
    registry.poll(7, (12, 1), 3)  # 12: idle, but its file is there
    registry.poll(7, (13, 1), 1)  # 13: busy (tracing)
    st = status("d-1")
    assert {pid: f.retries for pid, f in st.items()} == {11: 1, 12: 0, 13: 0}
    assert st[11].delivered is False and st[11].delivered_s_ago is None  # queued again
    assert "REQUEST_TRACE_ID=d-1" in registry.poll(7, (11, 1), 3)  # and picked up again
    for _ in range(3):  # dropped again and again: at most twice
        next(f for f in record.files if f.process.pid == 11).pending.delivered_at -= 4.0
        registry.poll(7, (11, 1), 3)
        status("d-1")
        registry.poll(7, (11, 1), 3)
    assert status("d-1")[11].retries == 2

    h.kscope_trace({"trace_id": "i-1", "pids": [13], "iterations": 5})
    registry.poll(7, (13, 1), 3)
    h.book.get("i-1").files[0].pending.delivered_at -= 30.0
    registry.poll(7, (13, 1), 3)  # waiting idle for its iteration: normal
    assert status("i-1")[13].retries == 0
