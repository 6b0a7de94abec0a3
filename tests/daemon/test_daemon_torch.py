"""A real CPU PyTorch process registers with the daemon and is traced over real TCP.

The process polls during `import torch` and then every second (KINETO_CONFIG sets
ON_DEMAND_CONFIG_UPDATE_INTERVAL_SECS=1). A duration trace starts ~7 s after the config
arrives (5 s warmup + controller ticks), so each trace takes ~10 s.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from daemon_helpers import rpc

pytest.importorskip("torch")
pytestmark = pytest.mark.torch

REPO = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).with_name("torch_worker.py")


def _wait_for(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def test_real_torch_process_is_traced_by_dyno_request_then_kscope_trace(
    daemon, sockdir, trace_root, tmp_path
):
    kineto_conf = tmp_path / "kineto.conf"
    kineto_conf.write_text("ON_DEMAND_CONFIG_UPDATE_INTERVAL_SECS=1\n")
    env = dict(os.environ)
    env.update(
        KINETO_USE_DAEMON="1",
        KINETO_IPC_SOCKET_DIR=sockdir,
        KINETO_CONFIG=str(kineto_conf),
        PYTHONPATH=str(REPO),
        RANK="0",
        WORLD_SIZE="1",
    )
    env.pop("SLURM_JOB_ID", None)
    log = open(tmp_path / "worker.log", "w")
    proc = subprocess.Popen(
        [sys.executable, str(WORKER), "--lifetime", "90"], env=env, stdout=log, stderr=subprocess.STDOUT
    )
    try:
        procs = _wait_for(
            lambda: rpc(daemon.rpc_port, {"fn": "kscopeListProcesses"})["processes"], 30, "registration"
        )
        assert procs[0]["pid"] == proc.pid and procs[0]["rank"] == 0

        # 1) exactly what `dyno gputrace` sends
        log_file = f"{trace_root}/dyno/trace.json"
        config = (
            f"ACTIVITIES_LOG_FILE={log_file}\nPROFILE_START_TIME=0\nACTIVITIES_DURATION_MSECS=300"
            "\nPROFILE_REPORT_INPUT_SHAPES=false\nPROFILE_WITH_STACK=false\nPROFILE_WITH_FLOPS=false"
            "\nPROFILE_WITH_MODULES=false"
        )
        res = rpc(
            daemon.rpc_port,
            {"fn": "setKinetOnDemandRequest", "config": config, "job_id": 0, "pids": [0], "process_limit": 3},
        )
        assert res["activityProfilersTriggered"] == [proc.pid]
        out = Path(f"{trace_root}/dyno/trace_{proc.pid}.json")
        _wait_for(out.exists, 45, f"{out}")
        doc = json.loads(out.read_text())
        assert doc["traceEvents"]
        # the REQUEST_TRACE_ID the daemon generated is the trace's top-level trace_id
        assert doc["trace_id"].isdigit()

        # 2) the kscope extension: per-rank file name, manifest, status until complete
        res = rpc(
            daemon.rpc_port, {"fn": "kscopeTrace", "trace_id": "kst-torch-1", "all": True, "duration_ms": 300}
        )
        assert res["triggered"] == 1
        path = res["matched"][0]["path"]
        assert path == f"{trace_root}/kst-torch-1/rank-0_{proc.pid}.pt.trace.json"
        st = _wait_for(
            lambda: (
                (s := rpc(daemon.rpc_port, {"fn": "kscopeTraceStatus", "trace_id": "kst-torch-1"}))[
                    "all_complete"
                ]
                and s
            ),
            45,
            "kscope trace",
        )
        (f,) = st["files"]
        assert f["delivered"] and f["exists"] and f["complete"] and f["alive"] and f["bytes"] > 1000
        assert json.loads(Path(path).read_text())["trace_id"] == "kst-torch-1"
        manifest = json.loads(Path(f"{trace_root}/kst-torch-1/manifest.testhost.json").read_text())
        assert manifest["files"][0]["complete"] is True and manifest["files"][0]["rank"] == 0
    finally:
        proc.kill()
        proc.wait(timeout=30)
        log.close()
