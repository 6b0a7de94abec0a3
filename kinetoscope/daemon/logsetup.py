"""Daemon logging: stderr, plain or JSON lines, and rate limiting for client-caused noise.

Why rate limiting: a misbehaving client (or a fuzzer) can send thousands of bad datagrams or
frames a second; logging each one would cost more CPU than serving the good ones and would
bury the useful lines. Each kind of complaint is logged at most ``burst`` times per
``interval_s``; the next line that gets through says how many were suppressed.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from typing import Any

import orjson

_STD_ATTRS = set(vars(logging.makeLogRecord({}))) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts (UTC, ISO 8601), level, logger, msg, plus any ``extra``."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _STD_ATTRS and not key.startswith("_"):
                out[key] = value
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return orjson.dumps(out, default=str).decode()


def configure_logging(level: str = "INFO", json_lines: bool = False) -> None:
    """Route the ``kinetoscope`` loggers to stderr (idempotent: replaces our own handler)."""
    root = logging.getLogger("kinetoscope")
    for h in list(root.handlers):
        if getattr(h, "_kscope", False):
            root.removeHandler(h)
    handler = logging.StreamHandler(sys.stderr)
    handler._kscope = True  # type: ignore[attr-defined]
    if json_lines:
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root.addHandler(handler)
    root.setLevel(level.upper())
    root.propagate = False


class RateLimitedLogger:
    """Log at most ``burst`` messages per key per ``interval_s``; count the rest."""

    def __init__(self, logger: logging.Logger, burst: int = 5, interval_s: float = 60.0) -> None:
        self.logger = logger
        self.burst = burst
        self.interval_s = interval_s
        self._lock = threading.Lock()
        self._window: dict[str, tuple[float, int, int]] = {}  # key -> (start, logged, suppressed)

    def _allow(self, key: str) -> tuple[bool, int]:
        now = time.monotonic()
        with self._lock:
            start, logged, suppressed = self._window.get(key, (now, 0, 0))
            if now - start >= self.interval_s:
                start, logged = now, 0
            if logged < self.burst:
                self._window[key] = (start, logged + 1, 0)
                return True, suppressed
            self._window[key] = (start, logged, suppressed + 1)
            return False, 0

    def _log(self, level: int, key: str, msg: str, args: tuple[object, ...], exc_info: bool = False) -> None:
        if not self.logger.isEnabledFor(level):
            return
        ok, suppressed = self._allow(key)
        if not ok:
            return
        if suppressed:
            msg += f" ({suppressed} similar messages suppressed)"
        self.logger.log(level, msg, *args, exc_info=exc_info)

    def info(self, key: str, msg: str, *args: object) -> None:
        self._log(logging.INFO, key, msg, args)

    def warning(self, key: str, msg: str, *args: object) -> None:
        self._log(logging.WARNING, key, msg, args)

    def debug(self, key: str, msg: str, *args: object) -> None:
        self._log(logging.DEBUG, key, msg, args)

    def exception(self, key: str, msg: str, *args: object) -> None:
        self._log(logging.ERROR, key, msg, args, exc_info=True)
