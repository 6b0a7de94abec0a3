"""Webhook alerts: a real HTTP receiver on loopback gets exactly one POST per episode, with the
documented JSON; an undeliverable alert is retried at the next cycle, not lost."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from kinetoscope.autopilot import alerts
from kinetoscope.autopilot.policy import Alerts
from kinetoscope.store.catalog import Catalog
from kinetoscope.store.fleet import FleetStore, SeenJob


class Receiver:
    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []
        self.fail = False
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                if outer.fail:
                    self.send_response(503)
                else:
                    outer.bodies.append(json.loads(body))
                    self.send_response(204)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_port}/hook"


@pytest.fixture()
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.server.shutdown()
    r.server.server_close()


def _job(store: FleetStore, key: str = "torch:node1:29500:run") -> str:
    store.upsert_jobs(
        [
            SeenJob(
                job_key=key,
                job_id="0",
                cmdline="python train.py",
                hosts=["node1:1778"],
                ranks=[{"host": "node1:1778", "hostname": "node1", "pid": 10, "rank": 0}],
                world_size=1,
                devices=1,
                opted_out=False,
                age_s=10,
            )
        ],
        warmup_s=0,
    )
    return key


def _record(store: FleetStore, key: str, n: int, busy: float) -> None:
    sid = f"kst-test-{n:04d}"
    assert store.claim(key, "p", sid, ["node1:1778"], 60, 0, {"pids": [10]})
    summary = {"gpu_busy_pct": busy, "devices": 1, "interval_s": 60.0}
    store.finish(sid, "recorded", summary=summary)
    alerts.evaluate(
        store,
        key,
        sid,
        summary,
        Alerts(webhook="http://x", gpu_busy_below_pct=30.0, straggler_lost_above=None),
    )


def test_one_alert_per_episode(receiver: Receiver, catalog_url: str) -> None:
    policy = Alerts(webhook=receiver.url, gpu_busy_below_pct=30.0, straggler_lost_above=None)
    with Catalog.open(catalog_url) as cat:
        store = FleetStore(cat)
        key = _job(store)
        for n, busy in enumerate([10.0, 12.0, 5.0]):  # one episode over three samples
            _record(store, key, n, busy)
            alerts.send_pending(store, policy)
        assert len(receiver.bodies) == 1
        _record(store, key, 3, 80.0)  # back above: the episode ends
        alerts.send_pending(store, policy)
        _record(store, key, 4, 20.0)  # a new episode
        alerts.send_pending(store, policy)
        alerts.send_pending(store, policy)
        assert len(receiver.bodies) == 2
        first, second = receiver.bodies
        assert first["schema"] == alerts.SCHEMA and first["kind"] == "gpu_busy_low"
        assert (first["job_key"], first["sample_id"], first["value"], first["threshold"]) == (
            key,
            "kst-test-0000",
            10.0,
            30.0,
        )
        assert first["hosts"] == ["node1:1778"] and second["sample_id"] == "kst-test-0004"
        episodes = store.alerts()
        assert [(e["sample_id"], e["closed"] is not None, e["sent"] is not None) for e in episodes] == [
            ("kst-test-0000", True, True),
            ("kst-test-0004", False, True),
        ]


def test_an_undelivered_alert_is_sent_at_the_next_cycle(receiver: Receiver, tmp_path: Path) -> None:
    policy = Alerts(webhook=receiver.url, gpu_busy_below_pct=30.0, straggler_lost_above=None)
    with Catalog.open(str(tmp_path / "c.db")) as cat:
        store = FleetStore(cat)
        key = _job(store)
        _record(store, key, 0, 10.0)
        receiver.fail = True
        assert alerts.send_pending(store, policy) == (0, 1)
        receiver.fail = False
        assert alerts.send_pending(store, policy) == (1, 0)
        assert alerts.send_pending(store, policy) == (0, 0)
        assert len(receiver.bodies) == 1 and store.alerts()[0]["attempts"] == 2
