"""Failed token attempts: logged (rate-limited) and answered later, per peer address.

Why: with ``--token`` every request must carry the secret; without a cost per wrong guess a
client could try thousands a second (issue 32 measured ~3,500/s), and nothing said so in the
log. Each failure from an address makes the next failed answer to that address wait longer
(``STEP_S`` doubling up to ``MAX_DELAY_S``); the count is forgotten after ``FORGET_S`` without
a failure. Only *failed* answers wait, and they wait on the RPC loop's timer, not in a worker
thread or the loop (``RpcServer(penalty=...)``): other clients, even from the same address,
are served as before.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable

from kinetoscope.daemon.logsetup import RateLimitedLogger

log = logging.getLogger("kinetoscope.daemon.auth")

STEP_S = 0.05  # delay of the first failed answer from an address; doubles per failure
MAX_DELAY_S = 2.0
FORGET_S = 60.0  # an address without a failure for this long starts again at STEP_S
MAX_PEERS = 4096  # addresses remembered (least recently failed forgotten first)


def peer_host(peer: object) -> str:
    """The address part of a socket peer (``(host, port, ...)``) - the port changes per try."""
    if isinstance(peer, tuple) and peer:
        return str(peer[0])
    return str(peer)


class AuthThrottle:
    """Per-address count of failed token attempts -> how long to hold the next answer back."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._failures: OrderedDict[str, tuple[int, float]] = OrderedDict()
        self._rl = RateLimitedLogger(log)
        self.total = 0

    def failed(self, peer: object) -> float:
        """Record a failed attempt from ``peer``; return the seconds its answer waits."""
        host = peer_host(peer)
        now = self._clock()
        with self._lock:
            count, last = self._failures.pop(host, (0, now))
            count = 1 if now - last > FORGET_S else count + 1
            self._failures[host] = (count, now)
            while len(self._failures) > MAX_PEERS:
                self._failures.popitem(last=False)
            self.total += 1
        delay: float = min(MAX_DELAY_S, STEP_S * 2 ** min(count - 1, 16))
        self._rl.warning(
            "unauthorized",
            "RPC request from %s with a missing or wrong token (%d from that address in a row); "
            "answering after %.2f s",
            host,
            count,
            delay,
        )
        return delay
