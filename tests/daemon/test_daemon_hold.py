"""A queued config is held back from a process whose earlier iteration trace has not written its
file: Kineto (torch 2.13) ignores a config that arrives while an iteration request waits for its
start iteration ("another profile request is pending"), so delivering it then loses it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from daemon_helpers import rpc

from kinetoscope.daemon import registry as registry_mod
from kinetoscope.daemon.registry import PendingConfig, Registry
from kinetoscope.protocol.wire import CONFIG_ACTIVITIES

IDLE = 3  # torch 2.13 polls EVENTS|ACTIVITIES when idle
PIDS = (10, 9)


def _queue(reg: Registry, trace_id: str, ends_with: str | None) -> PendingConfig:
    (match,) = reg.trigger(
        job_id=None,
        pids=[10],
        limit=None,
        include_launchers=True,
        make_config=lambda p: PendingConfig(f"CONFIG {trace_id}", trace_id, ends_with=ends_with),
    )
    assert match.pending is not None
    return match.pending


@pytest.fixture()
def reg() -> Registry:
    r = Registry(info_reader=lambda pid, sender: None)
    r.poll(0, PIDS, IDLE)  # registers the process
    return r


def test_config_waits_until_the_earlier_iteration_trace_is_written(reg: Registry, tmp_path: Path) -> None:
    first_file = tmp_path / "rank-0_10.pt.trace.json"
    _queue(reg, "t1", str(first_file))
    assert reg.poll(0, PIDS, IDLE) == "CONFIG t1\n"
    second = _queue(reg, "t2", str(tmp_path / "t2.json"))
    assert reg.poll(0, PIDS, IDLE) == "" and second.held_by == "t1" and second.delivered_at is None
    first_file.write_text("{}")
    assert reg.poll(0, PIDS, IDLE) == "CONFIG t2\n" and second.held_by is None
    assert second.delivered_at is not None


def test_a_busy_poll_never_takes_a_config(reg: Registry) -> None:
    _queue(reg, "t1", None)
    assert reg.poll(0, PIDS, IDLE & ~CONFIG_ACTIVITIES) == ""
    assert reg.poll(0, PIDS, IDLE) == "CONFIG t1\n"


def test_duration_traces_and_dyno_configs_hold_nothing_back(reg: Registry) -> None:
    _queue(reg, "t1", None)  # no final file to wait for
    assert reg.poll(0, PIDS, IDLE) == "CONFIG t1\n"
    _queue(reg, "t2", None)
    assert reg.poll(0, PIDS, IDLE) == "CONFIG t2\n"


def test_the_hold_ends_after_its_limit_even_without_the_file(
    reg: Registry, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Kineto may have dropped the earlier config on receipt; then no file will ever come."""
    _queue(reg, "t1", str(tmp_path / "never.json"))
    assert reg.poll(0, PIDS, IDLE) == "CONFIG t1\n"
    _queue(reg, "t2", None)
    assert reg.poll(0, PIDS, IDLE) == ""
    later = time.time() + registry_mod.HOLD_BEHIND_UNFINISHED_S + 1
    monkeypatch.setattr(registry_mod.time, "time", lambda: later)
    assert reg.poll(0, PIDS, IDLE) == "CONFIG t2\n"


REPO = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).with_name("torch_worker.py")


def _status(port: int, trace_id: str) -> dict:
    return rpc(port, {"fn": "kscopeTraceStatus", "trace_id": trace_id})


def _wait(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := predicate():
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def _span_us(path: str) -> tuple[float, float]:
    events = [e for e in json.loads(Path(path).read_text())["traceEvents"] if e.get("ph") == "X"]
    return min(e["ts"] for e in events), max(e["ts"] + e.get("dur", 0) for e in events)


@pytest.mark.torch
def test_a_second_iteration_trace_sent_while_the_first_waits_is_traced_after_it(
    daemon, sockdir: str, tmp_path: Path
) -> None:
    """A real CPU PyTorch process: trace 1 waits for an iteration that is a multiple of 2000
    (several seconds away); trace 2 is sent meanwhile. Both files are written, trace 2's
    events after trace 1's (read from the files)."""
    pytest.importorskip("torch")
    conf = tmp_path / "kineto.conf"
    conf.write_text("ON_DEMAND_CONFIG_UPDATE_INTERVAL_SECS=1\n")
    env = {**os.environ, "KINETO_USE_DAEMON": "1", "KINETO_IPC_SOCKET_DIR": sockdir}
    env.update(KINETO_CONFIG=str(conf), PYTHONPATH=str(REPO), RANK="0", WORLD_SIZE="1")
    env.pop("SLURM_JOB_ID", None)
    with open(tmp_path / "worker.log", "w") as log:
        proc = subprocess.Popen(
            [sys.executable, str(WORKER), "--lifetime", "120"], env=env, stdout=log, stderr=log
        )
        try:
            _wait(
                lambda: rpc(daemon.rpc_port, {"fn": "kscopeListProcesses"})["processes"], 30, "registration"
            )
            first = {"fn": "kscopeTrace", "all": True, "iterations": 5, "iteration_roundup": 2000}
            assert rpc(daemon.rpc_port, {**first, "trace_id": "kst-hold-1"})["triggered"] == 1
            _wait(
                lambda: _status(daemon.rpc_port, "kst-hold-1")["files"][0]["delivered"],
                30,
                "trace 1 picked up",
            )
            second = {"fn": "kscopeTrace", "all": True, "iterations": 5, "trace_id": "kst-hold-2"}
            assert rpc(daemon.rpc_port, second)["triggered"] == 1
            done = [
                _wait(lambda t=t: (s := _status(daemon.rpc_port, t))["all_complete"] and s, 90, t)
                for t in ("kst-hold-1", "kst-hold-2")
            ]
        finally:
            proc.kill()
            proc.wait(timeout=30)
    first_span, second_span = (_span_us(s["files"][0]["path"]) for s in done)
    assert second_span[0] >= first_span[1]
