"""One background selector loop that can be stopped promptly.

Both servers (IPC fabric, RPC) block in ``selectors.select``; a socketpair registered in the
selector wakes them on ``stop()`` so shutdown never waits for a timeout or a client."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable


class LoopThread:
    """A daemon thread running ``target`` until ``stopping`` is set, plus its wake-up socket."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.wake, self._wake_w = socket.socketpair()
        self.stopping = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, target: Callable[[], None]) -> None:
        self._thread = threading.Thread(target=target, name=self.name, daemon=True)
        self._thread.start()

    def poke(self) -> None:
        """Wake the loop (from another thread) without stopping it; see :meth:`drain_wake`."""
        try:
            self._wake_w.send(b"p", socket.MSG_DONTWAIT)
        except OSError:
            pass  # its buffer is full: the loop has wake-ups pending anyway

    def drain_wake(self) -> None:
        """Read the wake-up bytes (the loop calls this when ``wake`` is readable)."""
        try:
            while self.wake.recv(4096, socket.MSG_DONTWAIT):
                pass
        except OSError:
            pass

    def stop(self, timeout_s: float = 5.0) -> None:
        """Ask the loop to end, wake it and wait for it (the caller closes its own sockets)."""
        self.stopping.set()
        try:
            self._wake_w.send(b"x")
        except OSError:
            pass
        if self._thread is not None:
            self._thread.join(timeout=timeout_s)

    def close(self) -> None:
        self.wake.close()
        self._wake_w.close()
