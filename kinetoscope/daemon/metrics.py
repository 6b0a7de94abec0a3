"""Always-on host metrics and daemon self-metrics, exported for Prometheus.

Why: Dynolog's second job is a cheap always-on view of the host (CPU, memory, network, GPU)
next to the traces. Here a sampler thread reads psutil (and NVML when an NVIDIA driver is
present; absent -> GPU metrics silently off) every ``interval_s`` and a collector serves the
latest sample at scrape time, so scraping costs no /proc reads. The daemon's own counters
(polls, replies, reply latency, drops) show whether the IPC fabric is healthy.

Everything lives in a private ``CollectorRegistry`` so several daemons (tests) can coexist.
Metric names are documented in docs/daemon.md.
"""

from __future__ import annotations

import bisect
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import prometheus_client
import psutil
from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

log = logging.getLogger("kinetoscope.daemon.metrics")

LATENCY_BUCKETS = (1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 0.1)


class IpcStats(Collector):
    """The IPC loop's counters as plain integers, turned into metrics only at scrape time.

    Why not prometheus_client's Counter/Histogram: each ``inc()``/``observe()`` takes a lock and
    goes through several Python calls - a third of the daemon's per-poll CPU when measured.
    Only the IPC thread writes these; a scrape may see a poll's counters half-updated, which is
    harmless for monotonically growing totals.
    """

    def __init__(self) -> None:
        self.polls = 0
        self.contexts = 0
        self.replies = 0
        self.reply_errors = 0
        self.delivered = 0
        self.gc_removed = 0
        self.dropped: dict[str, int] = {}
        self.latency_counts = [0] * (len(LATENCY_BUCKETS) + 1)  # last = +Inf
        self.latency_sum = 0.0

    def observe_latency(self, seconds: float) -> None:
        self.latency_counts[bisect.bisect_left(LATENCY_BUCKETS, seconds)] += 1
        self.latency_sum += seconds

    def drop(self, reason: str) -> None:
        self.dropped[reason] = self.dropped.get(reason, 0) + 1

    def collect(self) -> Iterator[Metric]:
        for name, help_text, value in (
            ("kscope_daemon_ipc_polls", "'req' datagrams served", self.polls),
            ("kscope_daemon_ipc_contexts", "'ctxt' datagrams served", self.contexts),
            ("kscope_daemon_ipc_replies", "IPC replies sent", self.replies),
            (
                "kscope_daemon_ipc_reply_errors",
                "IPC replies that could not be sent (client gone/full)",
                self.reply_errors,
            ),
            ("kscope_daemon_configs_delivered", "Trace configs handed to a polling process", self.delivered),
            (
                "kscope_daemon_gc_removed_processes",
                "Processes forgotten after they stopped polling",
                self.gc_removed,
            ),
        ):
            yield CounterMetricFamily(name, help_text, value=value)
        fam = CounterMetricFamily(
            "kscope_daemon_ipc_dropped_datagrams", "Datagrams dropped without reply", labels=["reason"]
        )
        for reason, n in sorted(self.dropped.copy().items()):  # copy: C-level, atomic under the GIL
            fam.add_metric([reason], n)
        yield fam
        counts = list(self.latency_counts)
        buckets, running = [], 0
        for bound, n in zip((*map(str, LATENCY_BUCKETS), "+Inf"), counts):
            running += n
            buckets.append((bound, running))
        yield HistogramMetricFamily(
            "kscope_daemon_ipc_reply_latency_seconds",
            "Time from receiving a datagram to its reply being sent",
            buckets=buckets,
            sum_value=self.latency_sum,
        )


class DaemonMetrics:
    """The daemon's own metrics, in a private registry; IPC-side counters live in ``ipc``."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        # The "<name>_created" timestamp series only add noise to a daemon's scrape.
        prometheus_client.disable_created_metrics()  # type: ignore[no-untyped-call]  # untyped in prometheus_client
        self.registry = registry or CollectorRegistry(auto_describe=True)
        r = self.registry
        self.ipc = IpcStats()
        r.register(self.ipc)
        self.registered = Gauge(
            "kscope_daemon_registered_processes",
            "Processes currently registered (polled recently)",
            registry=r,
        )
        self.contexts = Gauge(
            "kscope_daemon_ipc_context_registrations", "'ctxt' registrations kept (bounded)", registry=r
        )
        self.rpc_pending = Gauge(
            "kscope_daemon_rpc_pending_connections",
            "RPC connections whose request is still being read",
            registry=r,
        )
        self.rpc_requests = Counter(
            "kscope_daemon_rpc_requests", "RPC requests by function and outcome", ["fn", "status"], registry=r
        )
        self.triggered = Counter(
            "kscope_daemon_traces_triggered", "Processes given a trace config by an RPC request", registry=r
        )
        self.info = Gauge(
            "kscope_daemon_info", "Constant 1, labelled with versions", ["version", "hostname"], registry=r
        )


# ---------------------------------------------------------------------------------------
# Per-process metrics (labelled with job, pod and namespace: docs/deploy.md §6)
# ---------------------------------------------------------------------------------------
PROCESS_LABELS = ("pid", "host_pid", "rank", "job", "job_source", "pod", "namespace")


@dataclass(frozen=True)
class ProcessRow:
    """One registered process as the per-process metrics show it (label values are strings;
    "" where unknown, as Prometheus has no null)."""

    labels: tuple[str, ...]  # in PROCESS_LABELS order
    polls: int
    last_poll_age_s: float
    tracing: bool


class ProcessMetrics(Collector):
    """``kscope_daemon_process_*`` series, one per registered process, built at scrape time from
    the registry (``rows``), so the labels a cluster already groups by (``job``, ``pod``,
    ``namespace``) are the ones the daemon derived for that process (protocol/jobident.py)."""

    def __init__(self, rows: Callable[[], list[ProcessRow]]) -> None:
        self._rows = rows

    def collect(self) -> Iterator[Metric]:
        info = GaugeMetricFamily(
            "kscope_daemon_process_info",
            "Constant 1 per registered process, with its labels",
            labels=PROCESS_LABELS,
        )
        polls = CounterMetricFamily(
            "kscope_daemon_process_polls", "Polls received from this process", labels=PROCESS_LABELS
        )
        age = GaugeMetricFamily(
            "kscope_daemon_process_last_poll_age_seconds",
            "Seconds since this process last polled",
            labels=PROCESS_LABELS,
        )
        tracing = GaugeMetricFamily(
            "kscope_daemon_process_tracing",
            "1 while the process reports it is tracing",
            labels=PROCESS_LABELS,
        )
        for row in self._rows():
            labels = list(row.labels)
            info.add_metric(labels, 1)
            polls.add_metric(labels, row.polls)
            age.add_metric(labels, row.last_poll_age_s)
            tracing.add_metric(labels, 1 if row.tracing else 0)
        yield from (info, polls, age, tracing)


# ---------------------------------------------------------------------------------------
# Host sampling
# ---------------------------------------------------------------------------------------
@dataclass
class GpuSample:
    index: int
    uuid: str
    name: str
    values: dict[str, float] = field(default_factory=dict)


@dataclass
class HostSample:
    taken_at: float = 0.0
    cpu_percent: dict[str, float] = field(default_factory=dict)
    cpu_utilization: float | None = None
    cpu_seconds: dict[str, float] = field(default_factory=dict)
    load: tuple[float, float, float] | None = None
    memory: dict[str, float] = field(default_factory=dict)
    net: dict[str, dict[str, int]] = field(default_factory=dict)
    uptime_s: float | None = None
    gpus: list[GpuSample] = field(default_factory=list)


_NET_FIELDS = {
    "bytes_recv": ("receive", "bytes"),
    "bytes_sent": ("transmit", "bytes"),
    "packets_recv": ("receive", "packets"),
    "packets_sent": ("transmit", "packets"),
    "errin": ("receive", "errors"),
    "errout": ("transmit", "errors"),
    "dropin": ("receive", "drops"),
    "dropout": ("transmit", "drops"),
}
_GPU_GAUGES = {
    "utilization_percent": "GPU busy time share (NVML utilization.gpu)",
    "memory_utilization_percent": "GPU memory controller busy share (NVML utilization.memory)",
    "memory_used_bytes": "GPU memory in use",
    "memory_total_bytes": "GPU memory size",
    "power_watts": "GPU power draw",
    "temperature_celsius": "GPU core temperature",
    "sm_clock_mhz": "GPU SM clock",
}


class _Nvml:
    """NVML when available; ``None`` from ``open()`` otherwise (no driver, no GPU, no library)."""

    def __init__(self, pynvml: Any, handles: list[tuple[int, Any, str, str]]) -> None:
        self.nv = pynvml
        self.handles = handles

    @classmethod
    def open(cls) -> _Nvml | None:
        try:
            import pynvml

            pynvml.nvmlInit()
            handles = []
            for i in range(pynvml.nvmlDeviceGetCount()):
                h = pynvml.nvmlDeviceGetHandleByIndex(i)
                uuid = pynvml.nvmlDeviceGetUUID(h)
                name = pynvml.nvmlDeviceGetName(h)
                handles.append(
                    (
                        i,
                        h,
                        uuid.decode() if isinstance(uuid, bytes) else uuid,
                        name.decode() if isinstance(name, bytes) else name,
                    )
                )
            log.info("NVML: %d GPUs", len(handles))
            return cls(pynvml, handles)
        except Exception as exc:  # library missing, no driver, ...: GPU metrics are simply off
            log.debug("NVML unavailable, GPU metrics off: %s", exc)
            return None

    def sample(self) -> list[GpuSample]:
        nv = self.nv
        out = []
        for i, h, uuid, name in self.handles:
            g = GpuSample(i, uuid, name)
            for key, fn in (
                ("util", partial(nv.nvmlDeviceGetUtilizationRates, h)),
                ("mem", partial(nv.nvmlDeviceGetMemoryInfo, h)),
                ("power", partial(nv.nvmlDeviceGetPowerUsage, h)),
                ("temp", partial(nv.nvmlDeviceGetTemperature, h, nv.NVML_TEMPERATURE_GPU)),
                ("clock", partial(nv.nvmlDeviceGetClockInfo, h, nv.NVML_CLOCK_SM)),
            ):
                try:
                    v = fn()
                except Exception:
                    continue
                if key == "util":
                    g.values["utilization_percent"] = float(v.gpu)
                    g.values["memory_utilization_percent"] = float(v.memory)
                elif key == "mem":
                    g.values["memory_used_bytes"] = float(v.used)
                    g.values["memory_total_bytes"] = float(v.total)
                elif key == "power":
                    g.values["power_watts"] = v / 1000.0
                elif key == "temp":
                    g.values["temperature_celsius"] = float(v)
                else:
                    g.values["sm_clock_mhz"] = float(v)
            out.append(g)
        return out

    def close(self) -> None:
        try:
            self.nv.nvmlShutdown()
        except Exception:
            pass


class HostSampler(Collector):
    """Samples the host every ``interval_s`` on a thread; ``collect()`` serves the latest."""

    def __init__(
        self, interval_s: float = 10.0, hostname: str | None = None, enable_gpu: bool = True
    ) -> None:
        self.interval_s = interval_s
        self.hostname = hostname or socket.gethostname()
        self._enable_gpu = enable_gpu
        self._nvml: _Nvml | None = None
        self._latest = HostSample()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._enable_gpu:
            self._nvml = _Nvml.open()
        psutil.cpu_times_percent(interval=None)  # prime the since-last-call deltas
        self.sample_now()
        self._thread = threading.Thread(target=self._run, name="kscope-metrics", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self._nvml is not None:
            self._nvml.close()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.sample_now()
            except Exception:  # pragma: no cover - keep sampling on the next tick
                log.exception("host metrics sample failed")

    def sample_now(self) -> HostSample:
        s = HostSample(taken_at=time.time())
        pct = psutil.cpu_times_percent(interval=None)._asdict()
        s.cpu_percent = {k: float(v) for k, v in pct.items()}
        idle = pct.get("idle", 0.0) + pct.get("iowait", 0.0)
        s.cpu_utilization = max(0.0, 100.0 - idle)
        s.cpu_seconds = {k: float(v) for k, v in psutil.cpu_times()._asdict().items()}
        try:
            s.load = os.getloadavg()
        except OSError:
            s.load = None
        vm = psutil.virtual_memory()
        s.memory = {
            "total_bytes": vm.total,
            "available_bytes": vm.available,
            "used_bytes": vm.total - vm.available,
            "used_percent": vm.percent,
            "swap_used_bytes": psutil.swap_memory().used,
        }
        s.net = {nic: c._asdict() for nic, c in psutil.net_io_counters(pernic=True).items()}
        s.uptime_s = time.time() - psutil.boot_time()
        if self._nvml is not None:
            s.gpus = self._nvml.sample()
        with self._lock:
            self._latest = s
        return s

    @property
    def latest(self) -> HostSample:
        with self._lock:
            return self._latest

    def collect(self) -> Iterator[Metric]:
        s = self.latest
        if not s.taken_at:
            return
        host = [self.hostname]
        g = GaugeMetricFamily(
            "kscope_host_cpu_utilization_percent",
            "CPU busy share, all cores (100 - idle - iowait)",
            labels=["host"],
        )
        g.add_metric(host, s.cpu_utilization or 0.0)
        yield g
        g = GaugeMetricFamily(
            "kscope_host_cpu_percent",
            "CPU time share by mode over the last interval",
            labels=["host", "mode"],
        )
        for mode, v in s.cpu_percent.items():
            g.add_metric([self.hostname, mode], v)
        yield g
        c = CounterMetricFamily(
            "kscope_host_cpu_seconds", "CPU seconds by mode, all cores, since boot", labels=["host", "mode"]
        )
        for mode, v in s.cpu_seconds.items():
            c.add_metric([self.hostname, mode], v)
        yield c
        if s.load is not None:
            g = GaugeMetricFamily(
                "kscope_host_load_average", "Run-queue load average", labels=["host", "period"]
            )
            for period, v in zip(("1m", "5m", "15m"), s.load):
                g.add_metric([self.hostname, period], v)
            yield g
        for key, value in s.memory.items():
            g = GaugeMetricFamily(
                f"kscope_host_memory_{key}", f"Host memory: {key.replace('_', ' ')}", labels=["host"]
            )
            g.add_metric(host, float(value))
            yield g
        if s.uptime_s is not None:
            g = GaugeMetricFamily("kscope_host_uptime_seconds", "Seconds since boot", labels=["host"])
            g.add_metric(host, s.uptime_s)
            yield g
        families: dict[str, CounterMetricFamily] = {}
        for nic, counters in s.net.items():
            for src, (direction, unit) in _NET_FIELDS.items():
                name = f"kscope_host_network_{direction}_{unit}"
                fam = families.get(name)
                if fam is None:
                    fam = families[name] = CounterMetricFamily(
                        name,
                        f"Network {unit} {'received' if direction == 'receive' else 'transmitted'}",
                        labels=["host", "interface"],
                    )
                fam.add_metric([self.hostname, nic], float(counters.get(src, 0)))
        yield from families.values()
        if s.gpus:
            for key, help_text in _GPU_GAUGES.items():
                g = GaugeMetricFamily(f"kscope_gpu_{key}", help_text, labels=["host", "gpu", "uuid", "name"])
                for gpu in s.gpus:
                    if key in gpu.values:
                        g.add_metric([self.hostname, str(gpu.index), gpu.uuid, gpu.name], gpu.values[key])
                yield g


@dataclass
class MetricsExporter:
    """The Prometheus HTTP endpoint (``/metrics``) on ``addr:port``; port 0 = ephemeral."""

    registry: CollectorRegistry
    addr: str
    port: int
    _server: Any = None
    _thread: threading.Thread | None = None

    def start(self) -> int:
        from prometheus_client import start_http_server

        self._server, self._thread = start_http_server(self.port, addr=self.addr, registry=self.registry)
        self.port = self._server.server_port
        return self.port

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
