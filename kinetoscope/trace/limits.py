"""Resource limits of the trace loader: how much JSON one file may inflate to, and how large one
value (an event, a top-level key, a run of whitespace) may be.

A hostile or broken file (a gzip bomb of whitespace, an event of gigabytes) must end in a clear
:class:`~kinetoscope.trace.errors.TraceError` naming the limit, not in exhausted memory. The
defaults admit every real trace we know of (the largest Kineto traces are a few GB of JSON;
their largest single events are well under a megabyte): see docs/trace-loading.md, "Limits".

Set them with ``$KSCOPE_MAX_TRACE_BYTES`` / ``$KSCOPE_MAX_VALUE_BYTES`` (a number of bytes, or
with a ``K``/``M``/``G``/``T`` suffix, powers of 1024), or ``--max-trace-bytes`` on the CLI.
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
    largest single event, top-level key or whitespace run (bytes held in memory at once)."""

    max_trace_bytes: int = DEFAULT_MAX_TRACE_BYTES
    max_value_bytes: int = DEFAULT_MAX_VALUE_BYTES

    @classmethod
    def from_env(cls) -> Limits:
        """The defaults, overridden by ``$KSCOPE_MAX_TRACE_BYTES`` / ``$KSCOPE_MAX_VALUE_BYTES``."""
        trace = os.environ.get(MAX_TRACE_ENV)
        value = os.environ.get(MAX_VALUE_ENV)
        return cls(
            parse_size(trace, MAX_TRACE_ENV) if trace else DEFAULT_MAX_TRACE_BYTES,
            parse_size(value, MAX_VALUE_ENV) if value else DEFAULT_MAX_VALUE_BYTES,
        )

    def trace_hint(self) -> str:
        size = fmt_size(self.max_trace_bytes)
        return f"the {size} limit on decompressed JSON ({MAX_TRACE_ENV} / --max-trace-bytes)"

    def value_hint(self) -> str:
        return f"the {fmt_size(self.max_value_bytes)} limit on one value ({MAX_VALUE_ENV})"


def set_max_trace_bytes(text: str) -> None:
    """``--max-trace-bytes``: validate and set ``$KSCOPE_MAX_TRACE_BYTES`` for this process and
    the worker processes it starts (they read the environment)."""
    os.environ[MAX_TRACE_ENV] = str(parse_size(text, "--max-trace-bytes"))
