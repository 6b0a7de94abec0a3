"""Webhook alerts, once per episode.

An **episode** of kind K for a job starts with the first recorded sample over K's threshold and
ends with the first later sample back under it; the webhook gets one POST when it starts (none
while it lasts, a new one for the next episode). Episodes live in ``fleet_alerts``: the row is
written before the POST and marked sent after it, so a crash in between re-sends it at the next
cycle (at least once; receivers can de-duplicate on ``alert_id``). The JSON body is a contract
(docs/autopilot.md, "Webhook").
"""

from __future__ import annotations

import logging
import threading
import urllib.error
import urllib.request
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor, wait
from typing import Any

import orjson

from kinetoscope import __version__
from kinetoscope.autopilot.policy import Alerts
from kinetoscope.store.fleet import FleetStore, utcnow

log = logging.getLogger("kinetoscope.autopilot")
SCHEMA = "kscope.autopilot.alert/1"


def breaches(summary: Mapping[str, Any], alerts: Alerts) -> dict[str, tuple[float | None, float]]:
    """Kind -> (value, threshold) of every alert whose threshold applies to ``summary``; kinds
    whose value is unknown are left out (neither opened nor closed)."""
    out: dict[str, tuple[float | None, float]] = {}
    checks = (
        ("gpu_busy_low", summary.get("gpu_busy_pct"), alerts.gpu_busy_below_pct, True),
        ("straggler_loss", summary.get("lost_fraction"), alerts.straggler_lost_above, False),
        ("mfu_low", summary.get("mfu"), alerts.mfu_below, True),
    )
    for kind, value, threshold, below in checks:
        if threshold is None or not isinstance(value, (int, float)):
            continue
        out[kind] = (
            (float(value), threshold)
            if (value < threshold if below else value > threshold)
            else (None, threshold)
        )
    return out


def evaluate(
    store: FleetStore, job_key: str, sample_id: str, summary: Mapping[str, Any], alerts: Alerts
) -> list[int]:
    """Open or close episodes for a recorded sample; returns the ids of episodes opened."""
    opened = []
    for kind, (value, threshold) in breaches(summary, alerts).items():
        if value is None:
            store.end_episode(job_key, kind)
            continue
        alert_id = store.start_episode(job_key, kind, sample_id, value, threshold)
        if alert_id is not None:
            opened.append(alert_id)
    return opened


def payload(alert: Mapping[str, Any], job: Mapping[str, Any] | None) -> dict[str, Any]:
    """The webhook's JSON body (docs/autopilot.md)."""
    job = job or {}
    opened = alert.get("opened")
    return {
        "schema": SCHEMA,
        "alert_id": alert["id"],
        "kind": alert["kind"],
        "job_key": alert["job_key"],
        "job_id": job.get("job_id"),
        "hosts": list(job.get("hosts") or []),
        "cmdline": job.get("cmdline"),
        "sample_id": alert["sample_id"],
        "trace_id": alert["sample_id"],
        "value": alert.get("value"),
        "threshold": alert.get("threshold"),
        "opened": opened.strftime("%Y-%m-%dT%H:%M:%SZ") if opened else None,
        "sent_at": utcnow().strftime("%Y-%m-%dT%H:%M:%SZ"),
        "kscope_version": __version__,
    }


def post_json(url: str, body: Mapping[str, Any], timeout_s: float) -> str | None:
    """POST ``body``; None on a 2xx answer, else why it failed."""
    req = urllib.request.Request(
        url,
        data=orjson.dumps(body),
        method="POST",
        headers={"Content-Type": "application/json", "User-Agent": f"kscope-autopilot/{__version__}"},
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            status = int(resp.status)
    except urllib.error.HTTPError as exc:
        return f"HTTP {exc.code}"
    except (urllib.error.URLError, OSError) as exc:
        return str(getattr(exc, "reason", exc))
    return None if 200 <= status < 300 else f"HTTP {status}"


def _body(store: FleetStore, alert: dict[str, Any]) -> dict[str, Any]:
    """The webhook body of ``alert`` (a hang alert carries its stacks and outlier ranks)."""
    body = payload(alert, store.job(alert["job_key"]))
    if alert["kind"] == "hang":  # the stacks and the outlier ranks (kinetoscope.autopilot.hang)
        from kinetoscope.autopilot.hang import alert_details

        body.update(alert_details(store.cat, alert))
    return body


MAX_SENDERS = 32  # webhook POSTs in flight at once
DEADLINE_MARGIN_S = 2.0  # the cycle waits for its POSTs at most timeout_s + this


def send_pending(store: FleetStore, alerts: Alerts) -> tuple[int, int]:
    """POST every unsent episode (at most ``max_attempts`` tries each); returns (sent, failed).

    The POSTs run concurrently (up to ``MAX_SENDERS``) under one deadline for the whole batch,
    ``timeout_s + DEADLINE_MARGIN_S``: a webhook that hangs costs the cycle that much once, not
    ``timeout_s`` per alert. A POST still unanswered at the deadline counts as failed (retried at
    the next cycle; its thread ends by its own socket timeout); one that had not started is not
    counted as an attempt. Catalog reads and writes stay in this thread."""
    if not alerts.webhook:
        return 0, 0
    pending = [(a, _body(store, a)) for a in store.unsent_alerts(alerts.max_attempts)]
    if not pending:
        return 0, 0
    url, timeout = alerts.webhook, alerts.timeout_s
    started: set[int] = set()
    lock = threading.Lock()

    def post(alert_id: int, body: Mapping[str, Any]) -> str | None:
        with lock:
            started.add(alert_id)
        try:
            return post_json(url, body, timeout)
        except Exception as exc:  # noqa: BLE001 - a bad answer (http.client errors) is a failed POST
            return f"{type(exc).__name__}: {exc}"

    pool = ThreadPoolExecutor(max_workers=min(MAX_SENDERS, len(pending)), thread_name_prefix="kscope-webhook")
    try:
        futures = {a["id"]: pool.submit(post, a["id"], body) for a, body in pending}
        wait(futures.values(), timeout=timeout + DEADLINE_MARGIN_S)
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
    sent = failed = 0
    for alert, _ in pending:
        fut = futures[alert["id"]]
        if fut.done() and not fut.cancelled():
            error = fut.result()
        else:
            with lock:
                if alert["id"] not in started:
                    continue  # never attempted: the next cycle sends it, no attempt used
            error = f"no answer within {timeout + DEADLINE_MARGIN_S:g} s"
        store.alert_attempt(alert["id"], sent=error is None)
        if error is None:
            sent += 1
            log.info(
                "alert %s sent",
                alert["id"],
                extra={"event": "alert_sent", "job_key": alert["job_key"], "kind": alert["kind"]},
            )
        else:
            failed += 1
            log.warning("alert %s not delivered to %s: %s", alert["id"], url, error)
    return sent, failed
