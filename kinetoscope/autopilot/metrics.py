"""Prometheus metrics of the autopilot itself (a private registry; ``--metrics-port`` serves it)."""

from __future__ import annotations

import prometheus_client
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


class AutopilotMetrics:
    """Counters and gauges named in docs/autopilot.md ("Metrics")."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        prometheus_client.disable_created_metrics()  # type: ignore[no-untyped-call]  # untyped in prometheus_client
        self.registry = registry or CollectorRegistry(auto_describe=True)
        r = self.registry
        self.jobs_known = Gauge(
            "kscope_autopilot_jobs_known", "Running jobs known to the autopilot", registry=r
        )
        self.jobs_opted_out = Gauge(
            "kscope_autopilot_jobs_opted_out", "Running jobs with KSCOPE_AUTOPILOT=off", registry=r
        )
        self.hosts_down = Gauge(
            "kscope_autopilot_hosts_down", "Daemons that did not answer the last sweep", registry=r
        )
        self.queue_depth = Gauge(
            "kscope_autopilot_queue_depth", "Jobs due for a sample and not yet started", registry=r
        )
        self.in_flight = Gauge(
            "kscope_autopilot_samples_in_flight",
            "Samples triggered and not finished (fleet-wide)",
            registry=r,
        )
        self.samples = Counter(
            "kscope_autopilot_samples_total",
            "Samples finished, by outcome and reason",
            ["state", "reason"],
            registry=r,
        )
        self.anomalies = Counter(
            "kscope_autopilot_anomaly_triggers_total",
            "Jobs made due by an anomaly, by kind",
            ["kind"],
            registry=r,
        )
        self.alerts = Counter(
            "kscope_autopilot_alerts_total", "Webhook alerts, by result", ["result"], registry=r
        )
        self.sweep_seconds = Histogram(
            "kscope_autopilot_sweep_duration_seconds",
            "Duration of one discovery sweep",
            buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 3, 5, 10, 30),
            registry=r,
        )
        self.cycle_seconds = Histogram(
            "kscope_autopilot_cycle_duration_seconds",
            "Duration of one full cycle",
            buckets=(0.1, 0.5, 1, 5, 10, 30, 60, 120, 300, 600),
            registry=r,
        )

    def serve(self, port: int, addr: str = "127.0.0.1") -> int:
        """Start the ``/metrics`` HTTP server; returns its port (``0`` picks a free one)."""
        server, _thread = prometheus_client.start_http_server(port, addr=addr, registry=self.registry)
        return int(server.server_port)
