"""The autopilot's policy: what to trace, how often, how many at once, when to alert.

Read from a TOML file (``--policy FILE``); every key is optional and falls back to the default in
:class:`Policy` (the table in docs/autopilot.md). An unknown key or a value of the wrong type is a
one-line :class:`~kinetoscope.errors.UsageError` naming the file and the key, so a typo never
silently leaves a default in force.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import tomllib

from kinetoscope.autopilot.anomaly import AnomalyPolicy
from kinetoscope.autopilot.hang import HangPolicy
from kinetoscope.errors import UsageError


@dataclass(frozen=True)
class Alerts:
    """Thresholds of the webhook alerts (``[alerts]``); an alert is sent once per episode."""

    webhook: str | None = None  # URL that receives the POST; None = no alerts
    gpu_busy_below_pct: float | None = 30.0  # GPU busy share under this
    straggler_lost_above: float | None = 0.10  # step time lost to stragglers above this fraction
    mfu_below: float | None = None  # model FLOPs utilisation under this fraction (0-1)
    timeout_s: float = 5.0
    max_attempts: int = 5


@dataclass(frozen=True)
class Policy:
    """Scheduling of automatic traces (``[autopilot]`` or top level of the TOML file)."""

    warmup_s: float = 300.0  # first trace this long after a job is first seen
    interval_s: float = 3600.0  # then one every interval
    min_age_s: float = (
        0.0  # never trace a job younger than this (as its daemon saw it), even with a shorter warmup_s
    )
    iterations: int = 10  # iterations per trace (aligned windows across ranks)
    max_in_flight: int = 8  # traces in flight across the whole fleet
    per_host: int = 1  # traces in flight per host
    sweep_interval_s: float = 60.0  # between discovery sweeps (service mode)
    trace_timeout_s: float = 300.0  # how long to wait for a trace's files
    lease_s: float = 900.0  # a job's lease; another instance may take it after this
    rpc_timeout_s: float = 5.0
    workers: int = 64  # threads that talk to daemons
    backoff_base_s: float = 30.0  # a down daemon is retried after this, doubling per failure
    backoff_max_s: float = 1800.0
    opt_out_values: tuple[str, ...] = ("off", "0", "false", "no")  # KSCOPE_AUTOPILOT values that opt out
    devices_per_rank: int = 1  # GPUs per rank, for wasted GPU-seconds
    announced_max_age_s: float = 120.0  # --announced: daemons whose last heartbeat is at most this old
    stale_after_s: float = 3600.0  # a job not seen for this long has ended, even if its host is down
    max_timestamp_anomalies: int = 0  # a sample with more device events stamped before launch is unusable
    alerts: Alerts = field(default_factory=Alerts)
    anomaly: AnomalyPolicy = field(default_factory=AnomalyPolicy)
    hang: HangPolicy = field(default_factory=HangPolicy)


_ALERT_KEYS = {f.name for f in fields(Alerts)}
_ANOMALY_KEYS = {f.name for f in fields(AnomalyPolicy)}
_HANG_KEYS = {f.name for f in fields(HangPolicy)}
_POLICY_KEYS = {f.name for f in fields(Policy)} - {"alerts", "anomaly", "hang"}


def _coerce(path: str, key: str, value: Any, default: Any) -> Any:
    """``value`` checked against the type of ``default`` (None defaults take a number or a string)."""
    where = f"policy {path}: {key}"
    if isinstance(default, bool):
        if not isinstance(value, bool):
            raise UsageError(f"{where} must be true or false, got {value!r}")
        return value
    if isinstance(default, int) and not isinstance(default, bool):
        if (
            isinstance(value, bool)
            or not isinstance(value, int)
            or (value < 0 and not key.endswith("metrics_port"))
        ):
            raise UsageError(f"{where} must be a non-negative integer, got {value!r}")
        return value
    if isinstance(default, float) or (default is None and not key.endswith("webhook")):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
            raise UsageError(f"{where} must be a non-negative number, got {value!r}")
        return float(value)
    if isinstance(default, tuple):
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise UsageError(f"{where} must be a list of strings, got {value!r}")
        return tuple(v.lower() for v in value)
    if not isinstance(value, str):
        raise UsageError(f"{where} must be a string, got {value!r}")
    return value


def _section(path: str, data: dict[str, Any], allowed: set[str], base: Any, prefix: str) -> Any:
    changes: dict[str, Any] = {}
    for key, value in data.items():
        if key not in allowed:
            raise UsageError(
                f"policy {path}: unknown key {prefix + key!r} (known: {', '.join(sorted(allowed))})"
            )
        changes[key] = _coerce(path, prefix + key, value, getattr(base, key))
    return replace(base, **changes)


def parse_policy(data: dict[str, Any], path: str = "<policy>") -> Policy:
    """A :class:`Policy` from the parsed TOML (keys at top level or under ``[autopilot]``)."""
    top = dict(data.get("autopilot", {})) if isinstance(data.get("autopilot"), dict) else {}
    top.update({k: v for k, v in data.items() if k not in ("autopilot", "alerts", "anomaly", "hang")})
    for name in ("alerts", "anomaly", "hang"):
        if not isinstance(data.get(name, {}), dict):
            raise UsageError(f"policy {path}: [{name}] must be a table")
    policy = _section(path, top, _POLICY_KEYS, Policy(), "")
    alerts = _section(path, data.get("alerts", {}), _ALERT_KEYS, Alerts(), "alerts.")
    anomaly = _section(path, data.get("anomaly", {}), _ANOMALY_KEYS, AnomalyPolicy(), "anomaly.")
    if policy.iterations < 1 or policy.max_in_flight < 1 or policy.per_host < 1 or policy.workers < 1:
        raise UsageError(f"policy {path}: iterations, max_in_flight, per_host and workers must be at least 1")
    if alerts.webhook is not None and not alerts.webhook.startswith(("http://", "https://")):
        raise UsageError(
            f"policy {path}: alerts.webhook must be an http:// or https:// URL, got {alerts.webhook!r}"
        )
    hang = _section(path, data.get("hang", {}), _HANG_KEYS, HangPolicy(), "hang.")
    out: Policy = replace(policy, alerts=alerts, anomaly=anomaly, hang=hang)
    return out


def load_policy(path: str | Path | None) -> Policy:
    """The policy in ``path`` (TOML), or the defaults when ``path`` is None."""
    if path is None:
        return Policy()
    p = Path(path)
    try:
        data = tomllib.loads(p.read_text(encoding="utf-8"))
    except OSError as exc:
        raise UsageError(f"cannot read policy {p}: {exc.strerror or exc}") from exc
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise UsageError(f"policy {p} is not valid TOML: {exc}") from exc
    return parse_policy(data, str(p))
