"""Resource limits of the trace loader: how much JSON one file may inflate to, how large one
value (an event, a top-level key, a run of whitespace) may be, and how many events one file may
hold (the tables cost memory per event, ~130 bytes each, whatever the JSON size).

A hostile or broken file (a gzip bomb of whitespace, an event of gigabytes) must end in a clear
:class:`~kinetoscope.trace.errors.TraceError` naming the limit, not in exhausted memory. The
defaults admit every real trace we know of (the largest Kineto traces are a few GB of JSON;
their largest single events are well under a megabyte): see docs/trace-loading.md, "Limits".

Set them with ``$KSCOPE_MAX_TRACE_BYTES`` / ``$KSCOPE_MAX_VALUE_BYTES`` (a number of bytes, or
with a ``K``/``M``/``G``/``T`` suffix, powers of 1024), ``$KSCOPE_MAX_TRACE_EVENTS`` /
``$KSCOPE_MAX_GZIP_EVENTS_PER_MIB`` (counts, same suffixes), or ``kscope --max-trace-bytes`` /
``kscope --max-trace-events`` on the CLI.

**Events of a gzip file.** A gzip bomb of *valid events* (10.9 MB inflating to 40.8 M events)
stays under the byte limit yet costs gigabytes of tables. Real traces hold at most ~0.15 events
per compressed byte (the HTA test traces: 0.04-0.15), so a gzip file may hold at most
``max(GZIP_EVENTS_FLOOR, max_gzip_events_per_mib x its compressed MiB)`` events (default 512 Ki
per MiB, 0.5 per byte): its tables grow with the bytes on disk, never with the inflation ratio.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from kinetoscope.errors import UsageError

MAX_TRACE_ENV = "KSCOPE_MAX_TRACE_BYTES"
MAX_VALUE_ENV = "KSCOPE_MAX_VALUE_BYTES"
DEFAULT_MAX_TRACE_BYTES = 16 << 30  # inflated JSON of one file
DEFAULT_MAX_VALUE_BYTES = 256 << 20  # one event, top-level key or whitespace run
MAX_EVENTS_ENV = "KSCOPE_MAX_TRACE_EVENTS"
GZIP_EVENTS_ENV = "KSCOPE_MAX_GZIP_EVENTS_PER_MIB"
DEFAULT_MAX_EVENTS = 64 << 20  # entries of traceEvents in one file (~8 GB of tables)
DEFAULT_GZIP_EVENTS_PER_MIB = 512 << 10  # per MiB of a gzip file (real traces: <= 160 Ki per MiB)
GZIP_EVENTS_FLOOR = 2 << 20  # events any gzip file may hold, however small
MAX_KEY_BYTES = 1 << 20  # a top-level key string (real ones are a few bytes)

_SIZE_RE = re.compile(r"^\s*(\d+)\s*([KMGT]?)(?:I?B)?\s*$", re.IGNORECASE)
_UNITS = {"": 0, "K": 10, "M": 20, "G": 30, "T": 40}


def parse_size(text: str, what: str) -> int:
    """``"8G"`` -> 8 GiB; ``"1048576"`` -> 1 MiB. Raises UsageError naming ``what``."""
    m = _SIZE_RE.match(text)
    if m is None or int(m.group(1)) <= 0:
        raise UsageError(f"{what}: {text!r} is not a size (a positive number of bytes, or with K/M/G/T)")
    return int(m.group(1)) << _UNITS[m.group(2).upper()]


def fmt_size(n: int) -> str:
    for unit, shift in (("TiB", 40), ("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift} {unit}"
    return f"{n} bytes"


@dataclass(frozen=True)
class Limits:
    """``max_trace_bytes``: decompressed JSON bytes of one file. ``max_value_bytes``: the
    largest single event, top-level key or whitespace run (bytes held in memory at once).
    ``max_events``: entries of ``traceEvents`` in one file. ``max_gzip_events_per_mib``: for a
    gzip file, events per MiB of the compressed file (at least ``GZIP_EVENTS_FLOOR`` in all)."""

    max_trace_bytes: int = DEFAULT_MAX_TRACE_BYTES
    max_value_bytes: int = DEFAULT_MAX_VALUE_BYTES
    max_events: int = DEFAULT_MAX_EVENTS
    max_gzip_events_per_mib: int = DEFAULT_GZIP_EVENTS_PER_MIB

    @classmethod
    def from_env(cls) -> Limits:
        """The defaults, overridden by ``$KSCOPE_MAX_TRACE_BYTES`` / ``$KSCOPE_MAX_VALUE_BYTES`` /
        ``$KSCOPE_MAX_TRACE_EVENTS`` / ``$KSCOPE_MAX_GZIP_EVENTS_PER_MIB``."""

        def env(name: str, default: int) -> int:
            text = os.environ.get(name)
            return parse_size(text, name) if text else default

        return cls(
            env(MAX_TRACE_ENV, DEFAULT_MAX_TRACE_BYTES),
            env(MAX_VALUE_ENV, DEFAULT_MAX_VALUE_BYTES),
            env(MAX_EVENTS_ENV, DEFAULT_MAX_EVENTS),
            env(GZIP_EVENTS_ENV, DEFAULT_GZIP_EVENTS_PER_MIB),
        )

    def trace_hint(self) -> str:
        size = fmt_size(self.max_trace_bytes)
        return f"the {size} limit on decompressed JSON ({MAX_TRACE_ENV} / --max-trace-bytes)"

    def value_hint(self) -> str:
        return f"the {fmt_size(self.max_value_bytes)} limit on one value ({MAX_VALUE_ENV})"

    def event_cap(self, gzip_bytes: int | None) -> tuple[int, str]:
        """The most events a file may hold and the phrase naming that limit for an error.
        ``gzip_bytes``: the compressed size of a gzip file (None: plain JSON, whose events
        cost at least their bytes on disk)."""
        cap = self.max_events
        hint = f"the limit of {cap} events per file ({MAX_EVENTS_ENV} / kscope --max-trace-events)"
        if gzip_bytes is not None:
            dense = max(GZIP_EVENTS_FLOOR, (gzip_bytes * self.max_gzip_events_per_mib) >> 20)
            if dense < cap:
                cap = dense
                hint = (
                    f"the limit of {self.max_gzip_events_per_mib} events per MiB of a gzip file, {cap} for "
                    f"its {gzip_bytes} compressed bytes (a gzip bomb of events? {GZIP_EVENTS_ENV} or "
                    "kscope --max-trace-events raises it)"
                )
        return cap, hint


def set_max_trace_bytes(text: str) -> None:
    """``--max-trace-bytes``: validate and set ``$KSCOPE_MAX_TRACE_BYTES`` for this process and
    the worker processes it starts (they read the environment)."""
    os.environ[MAX_TRACE_ENV] = str(parse_size(text, "--max-trace-bytes"))


def set_max_trace_events(text: str) -> None:
    """``--max-trace-events``: validate and set ``$KSCOPE_MAX_TRACE_EVENTS`` for this process and
    its workers, and lift the gzip density limit (an explicit count admits that many events in
    any file, compressed or not)."""
    n = parse_size(text, "--max-trace-events")
    os.environ[MAX_EVENTS_ENV] = str(n)
    os.environ[GZIP_EVENTS_ENV] = str(n << 20)
