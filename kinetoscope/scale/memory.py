"""Can this machine hold a trace? Checked before a rank file is loaded, so that a trace too big
for the memory that is free is a clear error naming the figures, never an OOM kill.

Terms: *JSON bytes* is the uncompressed size of the trace (a ``.json.gz`` file's gzip trailer
holds it, modulo 4 GiB); the *load estimate* is what loading and analysing it takes at peak:
``LOAD_BASE_BYTES + factor x JSON bytes``. The factor is the measured peak of loading and
analysing one trace in one process, rounded up (docs/performance.md "One huge trace"):
``LOAD_FACTOR`` when the map loads only what its analyses declare they read (the default
document: 0.81x for a 2 GB trace, parse workers included), ``LOAD_FACTOR_WHOLE`` when it loads
every table and column (an analysis that does not declare its reads), or runs a heavy analysis
(call graph, critical path, memory, ...: measured only with every analysis over the whole trace,
2.66x above the interpreter for a 407 MB trace); the base covers the interpreter and Polars.
*Available* is ``psutil.virtual_memory().available``, or ``$KSCOPE_MEMORY_AVAILABLE`` (bytes, or
with a K/M/G suffix) where the host's figure is not this process's to use (a container limit, a
box shared with others).
"""

from __future__ import annotations

import os
import struct

from kinetoscope.errors import UsageError

LOAD_FACTOR = 1.0
LOAD_FACTOR_WHOLE = 2.9
LOAD_BASE_BYTES = 300 << 20
GIB = float(1 << 30)
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def json_bytes(path: str) -> int:
    """Uncompressed JSON size of a trace file (``.gz``: from the gzip trailer, unwrapped)."""
    size = os.path.getsize(path)
    with open(path, "rb") as fh:
        if fh.read(2) != b"\x1f\x8b" or size < 18:
            return size
        fh.seek(-4, os.SEEK_END)
        isize = int(struct.unpack("<I", fh.read(4))[0])
    while isize < size:  # ISIZE is modulo 2**32: a > 4 GiB JSON wraps around
        isize += 1 << 32
    return isize


def available_bytes() -> int:
    """Memory this process may use now (module docstring)."""
    text = os.environ.get("KSCOPE_MEMORY_AVAILABLE", "").strip().upper().removesuffix("B").removesuffix("I")
    if text:
        unit = text[-1] if text[-1] in _UNITS else ""
        try:
            return int(float(text[: len(text) - len(unit)]) * _UNITS[unit])
        except ValueError:
            raise UsageError(f"$KSCOPE_MEMORY_AVAILABLE: {text!r} is not a size like 8G or 512M") from None
    import psutil  # type: ignore[import-untyped, unused-ignore]

    return int(psutil.virtual_memory().available)


def size_text(n: int) -> str:
    """``n`` bytes for a person: MiB below 1 GiB, else GiB with two decimals."""
    return f"{n / (1 << 20):.0f} MiB" if n < (1 << 30) else f"{n / GIB:.2f} GiB"


def check_fits(path: str, *, whole: bool = False) -> str | None:
    """``None`` when loading ``path`` fits the available memory, else why not (one line).
    ``whole``: every table and column is loaded, or a heavy analysis runs (``LOAD_FACTOR_WHOLE``,
    module docstring)."""
    raw = json_bytes(path)
    need = LOAD_BASE_BYTES + int((LOAD_FACTOR_WHOLE if whole else LOAD_FACTOR) * raw)
    have = available_bytes()
    if need <= have:
        return None
    return (
        f"{path}: not loaded: a {size_text(raw)} JSON trace needs about {size_text(need)} of memory to "
        f"load and analyse, and {size_text(have)} is available here; run it where more memory is free "
        "(another machine, or a Ray cluster with --ray-address)"
    )
