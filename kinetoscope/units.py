"""Numbers, sizes and durations as people read them: the one place that formats them.

Why one module: the HTML report, the web app and the command line show the same quantities
(bytes, milliseconds, fractions); formatting them in one place keeps a value looking the same
everywhere. It sits at the bottom of the package (it imports nothing from Kinetoscope), so any
layer may use it.

Terms: a *missing* value is ``None`` or anything that is not a finite number; durations in the
analysis documents are microseconds (``us``) and are shown in milliseconds. Two placeholders for
missing values exist because two audiences expect them: :data:`MISSING` (an en dash, for the
HTML report and the web app) and ``"-"`` (plain ASCII, for terminal tables).
"""

from __future__ import annotations

import math
from datetime import datetime
from typing import Any

MISSING = "–"  # en dash: HTML report and web app
MISSING_TEXT = "-"  # ASCII: terminal tables
US_PER_MS = 1000.0
_BYTE_UNITS = ("B", "KiB", "MiB", "GiB", "TiB")


def finite(v: Any) -> float | None:
    """``v`` as a float when it is a finite int or float (not a bool), else None."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    f = float(v)
    return f if math.isfinite(f) else None


def us_to_ms(us: Any) -> float | None:
    """Microseconds -> milliseconds; None when ``us`` is missing."""
    v = finite(us)
    return None if v is None else v / US_PER_MS


def fmt_num(v: Any, digits: int = 2) -> str:
    """A table value: ints with thousands separators, floats with ``digits`` decimals (whole
    floats as ints, tiny ones with 3 significant digits), bools as yes/no, missing as an en dash."""
    if v is None:
        return MISSING
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, int):
        return f"{v:,}"
    if isinstance(v, float):
        if not math.isfinite(v):
            return MISSING
        if v != 0 and abs(v) < 10**-digits:
            return f"{v:.3g}"
        if float(v).is_integer() and abs(v) < 1e15:
            return f"{int(v):,}"
        return f"{v:,.{digits}f}"
    return str(v)


def fmt_fixed(v: Any, digits: int = 2) -> str:
    """Floats with exactly ``digits`` decimals and thousands separators; other values as they
    are (``str``); None as an en dash."""
    if v is None:
        return MISSING
    if isinstance(v, float):
        return f"{v:,.{digits}f}"
    return str(v)


def fmt_compact(v: Any) -> str:
    """Terminal tables of large quantities: whole numbers without decimals, others with one;
    thousands separators; None and NaN as ``-``."""
    if v is None:
        return MISSING_TEXT
    if isinstance(v, float):
        if math.isnan(v):
            return MISSING_TEXT
        return f"{v:,.0f}" if float(v).is_integer() else f"{v:,.1f}"
    if isinstance(v, int):
        return f"{v:,}"
    return str(v)


def fmt_signed(v: float) -> str:
    """A change with its sign (``+1,234``, ``-0.5``): one decimal unless whole."""
    if isinstance(v, float) and not float(v).is_integer():
        return f"{v:+,.1f}"
    return f"{v:+,.0f}"


def fmt_pct(frac: Any, digits: int = 1) -> str:
    """A fraction (0.25) as a percentage (``25.0 %``); ``n/a`` when missing."""
    v = finite(frac)
    return "n/a" if v is None else f"{100 * v:.{digits}f} %"


def fmt_ms(us: Any) -> str:
    """Microseconds shown as milliseconds (``1,234.57 ms``); ``n/a`` when missing."""
    v = us_to_ms(us)
    return "n/a" if v is None else f"{v:,.2f} ms"


def fmt_bytes(n: Any, *, missing: str = MISSING, thousands: bool = True) -> str:
    """A size in binary units (``512 B``, ``1.5 MiB``; TiB is the largest unit).

    ``thousands`` puts separators in the number (``1,023.9 KiB``; the report and the web app);
    terminal tables of file sizes leave them out. ``missing`` is shown for None or a non-number.
    """
    v = finite(n)
    if v is None:
        return missing
    sep = "," if thousands else ""
    for unit in _BYTE_UNITS:
        if abs(v) < 1024 or unit == "TiB":
            return f"{v:{sep}.0f} {unit}" if unit == "B" else f"{v:{sep}.1f} {unit}"
        v /= 1024
    raise AssertionError("unreachable: TiB is the last unit")  # pragma: no cover


def fmt_datetime(v: Any) -> str:
    """A timestamp to the second (``2026-01-31 12:00:00``); other values as they are; None as
    an en dash."""
    if v is None:
        return MISSING
    if isinstance(v, datetime):
        return v.strftime("%Y-%m-%d %H:%M:%S")
    return str(v)
