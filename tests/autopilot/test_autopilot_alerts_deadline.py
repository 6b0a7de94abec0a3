"""Issue 32, item 12: webhook POSTs of one cycle run concurrently under one deadline, so a
hanging webhook costs the cycle about ``timeout_s`` once, not once per alert."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from kinetoscope.autopilot import alerts
from kinetoscope.autopilot.policy import Alerts
from kinetoscope.store.catalog import Catalog
from kinetoscope.store.fleet import FleetStore

from .test_autopilot_alerts import _job, _record


class HangingWebhook:
    """A real HTTP listener that reads each request and never answers: it counts the POSTs
    that reached it (their request line) and holds the connections open."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.posts = 0
        self.conns: list[socket.socket] = []
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.sock.getsockname()[1]}/hook"

    def _accept(self) -> None:
        self.sock.settimeout(0.2)
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            self.conns.append(conn)
            threading.Thread(target=self._read, args=(conn,), daemon=True).start()

    def _read(self, conn: socket.socket) -> None:
        conn.settimeout(30)
        try:
            if conn.recv(65536).startswith(b"POST "):
                with self.lock:
                    self.posts += 1
        except OSError:
            pass

    def close(self) -> None:
        self.stop.set()
        self.thread.join(5)
        for c in self.conns:
            c.close()
        self.sock.close()


@pytest.fixture()
def hanging() -> Iterator[HangingWebhook]:
    h = HangingWebhook()
    yield h
    h.close()


def test_a_hanging_webhook_costs_the_cycle_once_not_per_alert(
    hanging: HangingWebhook, tmp_path: Path
) -> None:
    """Regression: 6 alerts to a webhook that never answers took 6 x timeout_s (3.7 s -> 34.6 s a
    cycle). Now every alert is attempted (the listener sees 6 POSTs) and the cycle takes about
    one timeout; the bound asserted, 5 x timeout_s, is far above that and below the serial 6 x."""
    timeout_s = 3.0
    policy = Alerts(
        webhook=hanging.url, gpu_busy_below_pct=30.0, straggler_lost_above=None, timeout_s=timeout_s
    )
    with Catalog.open(str(tmp_path / "c.db")) as cat:
        store = FleetStore(cat)
        for j in range(6):
            key = _job(store, f"torch:node1:{29500 + j}:run")
            _record(store, key, j, 10.0)
        t0 = time.monotonic()
        assert alerts.send_pending(store, policy) == (0, 6)
        elapsed = time.monotonic() - t0
        assert hanging.posts == 6
        assert elapsed < 5 * timeout_s, elapsed
        assert [a["attempts"] for a in store.alerts()] == [1] * 6  # each counted once, retried later
