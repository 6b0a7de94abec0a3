"""Anomaly triggers: trace a job now when its devices' utilisation, from the daemons' always-on
metrics, stays low or drops suddenly (docs/autopilot.md, "Anomaly triggers").

Each sweep scrapes every host's Prometheus endpoint (``http://<host>:<metrics_port>/metrics``,
the daemon's ``--metrics-port``) for ``kscope_gpu_utilization_percent`` and takes the mean over
the host's GPUs; a job's utilisation is the mean over its hosts (per host, not per process: NVML
does not say which process keeps a GPU busy). A job is made due at once when

* ``low``: its utilisation has been below ``gpu_util_below_pct`` for at least ``for_s`` seconds, or
* ``drop``: it is below ``drop_ratio`` × the mean of its own last sweeps (at least 3 of them),

and its last sample is at least ``min_gap_s`` old (the rate limit). The low-since times and the
history are kept in memory: after a restart the duration is counted again.
"""

from __future__ import annotations

import time
import urllib.error
import urllib.request
from collections import deque
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from statistics import fmean

from prometheus_client.parser import text_string_to_metric_families

from kinetoscope.collect.client import parse_host

GPU_UTIL = "kscope_gpu_utilization_percent"
HISTORY = 20


@dataclass(frozen=True)
class AnomalyPolicy:
    """``[anomaly]`` of the policy file; off unless a threshold is set."""

    metrics_port: int = 9778
    gpu_util_below_pct: float | None = None
    for_s: float = 300.0
    drop_ratio: float | None = None
    min_gap_s: float = 1800.0
    timeout_s: float = 3.0

    @property
    def enabled(self) -> bool:
        return self.metrics_port > 0 and (self.gpu_util_below_pct is not None or self.drop_ratio is not None)


def parse_gpu_util(text: str) -> float | None:
    """Mean ``kscope_gpu_utilization_percent`` over the GPUs of one scrape; None without GPUs."""
    values = [
        s.value
        for fam in text_string_to_metric_families(text)
        if fam.name == GPU_UTIL
        for s in fam.samples
        if s.name == GPU_UTIL
    ]
    return float(fmean(values)) if values else None


def scrape(address: str, port: int, timeout_s: float) -> float | None:
    """One host's GPU utilisation (None: no GPU metrics, or the endpoint did not answer)."""
    host = parse_host(address).host
    url = f"http://[{host}]:{port}/metrics" if ":" in host else f"http://{host}:{port}/metrics"
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:
            return parse_gpu_util(resp.read().decode("utf-8", "replace"))
    except (urllib.error.URLError, OSError, ValueError):
        return None


@dataclass
class AnomalyDetector:
    """Keeps per-job state between sweeps and says which jobs to trace now, and why."""

    policy: AnomalyPolicy
    low_since: dict[str, float] = field(default_factory=dict)
    history: dict[str, deque[float]] = field(default_factory=dict)

    def host_utilisation(self, addresses: Sequence[str], workers: int = 32) -> dict[str, float]:
        if not addresses:
            return {}
        with ThreadPoolExecutor(max_workers=max(1, min(workers, len(addresses)))) as pool:
            values = pool.map(lambda a: scrape(a, self.policy.metrics_port, self.policy.timeout_s), addresses)
            return {a: v for a, v in zip(addresses, values) if v is not None}

    def check(
        self, jobs: Mapping[str, Sequence[str]], host_util: Mapping[str, float], now: float | None = None
    ) -> dict[str, tuple[str, float]]:
        """``job key -> hosts`` and host utilisation -> ``job key -> (kind, utilisation)`` to trace now
        (before the rate limit, which needs the catalog: :meth:`FleetStore.make_due`)."""
        now = time.monotonic() if now is None else now
        p = self.policy
        out: dict[str, tuple[str, float]] = {}
        for key, hosts in jobs.items():
            seen = [host_util[h] for h in hosts if h in host_util]
            if not seen:
                continue
            util = fmean(seen)
            hist = self.history.setdefault(key, deque(maxlen=HISTORY))
            if p.drop_ratio is not None and len(hist) >= 3 and util < p.drop_ratio * fmean(hist):
                out[key] = ("drop", util)
            hist.append(util)
            if p.gpu_util_below_pct is not None and util < p.gpu_util_below_pct:
                since = self.low_since.setdefault(key, now)
                if now - since >= p.for_s:
                    out.setdefault(key, ("low", util))
            else:
                self.low_since.pop(key, None)
        return out
