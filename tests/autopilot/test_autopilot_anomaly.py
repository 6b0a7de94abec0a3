"""Anomaly triggers: a job whose GPUs stay idle (from the daemons' Prometheus metrics, served here
over real HTTP on loopback as a GPU host's daemon serves them) is traced at once, not at its
schedule, and not again within the rate limit."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from sim_fleet import SimFleet

from kinetoscope.autopilot.anomaly import AnomalyDetector, AnomalyPolicy, parse_gpu_util
from kinetoscope.autopilot.policy import Policy, load_policy
from kinetoscope.autopilot.service import Autopilot, AutopilotConfig
from kinetoscope.errors import UsageError
from kinetoscope.store.fleet import FleetStore


def metrics_text(utils: list[float]) -> str:
    lines = [
        "# HELP kscope_gpu_utilization_percent GPU busy time share (NVML utilization.gpu)",
        "# TYPE kscope_gpu_utilization_percent gauge",
    ]
    lines += [
        f'kscope_gpu_utilization_percent{{gpu="{i}",host="sim",name="H100",uuid="GPU-{i}"}} {u}'
        for i, u in enumerate(utils)
    ]
    return "\n".join(lines) + "\n"


class MetricsServer:
    def __init__(self) -> None:
        self.utils = [10.0, 14.0]
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body = metrics_text(outer.utils).encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def port(self) -> int:
        return int(self.server.server_port)


@pytest.fixture()
def metrics() -> Iterator[MetricsServer]:
    m = MetricsServer()
    yield m
    m.server.shutdown()
    m.server.server_close()


def test_parse_gpu_util() -> None:
    assert parse_gpu_util(metrics_text([10.0, 30.0])) == 20.0
    assert parse_gpu_util('# no GPUs\nkscope_host_cpu_utilization_percent{host="h"} 50\n') is None


def test_low_for_a_duration_and_sudden_drop() -> None:
    det = AnomalyDetector(AnomalyPolicy(gpu_util_below_pct=30, for_s=60, drop_ratio=0.5))
    jobs = {"j": ["h:1"]}
    assert det.check(jobs, {"h:1": 20.0}, now=0) == {}
    assert det.check(jobs, {"h:1": 20.0}, now=59) == {}
    assert det.check(jobs, {"h:1": 20.0}, now=60) == {"j": ("low", 20.0)}
    assert det.check(jobs, {"h:1": 80.0}, now=61) == {}  # back up: the duration starts again
    assert det.check(jobs, {"h:1": 20.0}, now=100) == {}
    det2 = AnomalyDetector(AnomalyPolicy(drop_ratio=0.5))
    for t, u in enumerate([90.0, 92.0, 88.0]):
        assert det2.check(jobs, {"h:1": u}, now=t) == {}
    assert det2.check(jobs, {"h:1": 40.0}, now=3) == {"j": ("drop", 40.0)}
    assert det2.check(jobs, {}, now=4) == {}  # no metrics: no verdict


def test_anomaly_policy_section(tmp_path: Path) -> None:
    p = tmp_path / "p.toml"
    p.write_text("[anomaly]\ngpu_util_below_pct = 25\nfor_s = 120\nmetrics_port = 9100\n")
    pol = load_policy(p)
    assert (
        pol.anomaly == AnomalyPolicy(metrics_port=9100, gpu_util_below_pct=25.0, for_s=120.0)
        and pol.anomaly.enabled
    )
    p.write_text("[anomaly]\nthreshold = 3\n")
    with pytest.raises(UsageError, match="anomaly.threshold"):
        load_policy(p)


def test_an_idle_job_is_traced_now_and_rate_limited(metrics: MetricsServer, tmp_path: Path) -> None:
    policy = Policy(
        warmup_s=3600,
        min_age_s=0,
        trace_timeout_s=1,
        rpc_timeout_s=5,
        workers=4,
        anomaly=AnomalyPolicy(metrics_port=metrics.port, gpu_util_below_pct=30, for_s=0, min_gap_s=3600),
    )
    with SimFleet(2, procs_per_host=2, trace_root=str(tmp_path / "t")) as fleet:
        pilot = Autopilot(
            AutopilotConfig(
                hosts=fleet.addresses, catalog_url=str(tmp_path / "c.db"), policy=policy, instance="p"
            )
        )
        try:
            first = pilot.run_cycle()
            # both simulated hosts answer on 127.0.0.1, so both read the idle metrics: both jobs traced now
            assert sorted(first.anomalies.values()) == ["low", "low"] and len(first.started) == 2
            samples = FleetStore(pilot.catalog).samples()
            assert {s.request["trigger"] for s in samples} == {"anomaly:low"}
            assert all(s.request["gpu_utilisation"] == 12.0 for s in samples)
            second = pilot.run_cycle()  # still idle, but sampled within min_gap_s
            assert second.anomalies == {} and second.started == []
            metrics.utils = [95.0, 97.0]
            pilot.detector.policy = replace(pilot.detector.policy, min_gap_s=0)
            pilot.policy = replace(pilot.policy, anomaly=pilot.detector.policy)
            third = pilot.run_cycle()  # busy again: no anomaly, and the schedule is an hour away
            assert third.anomalies == {} and third.started == []
        finally:
            pilot.close()
