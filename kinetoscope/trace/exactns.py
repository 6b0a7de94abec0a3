"""Exact decimal microseconds -> integer nanoseconds, vectorised (numpy).

The typed decoder hands timestamps over as ``msgspec.Raw`` (the number's text) when float64
cannot hold them exactly (epoch-based microseconds with 3 decimals need 19 significant
digits). :func:`ns_from_texts` encodes the list of texts as one JSON array with msgspec (a C
loop), then parses every number with a few numpy passes, grouped by layout (length, number of
decimals, sign): each group is a fixed-width byte matrix whose digits are weighted by powers of
ten in two float64 matrix-vector products (each exact below 2**53) and recombined as integers.
Values it does not handle (missing, strings, exponents, more than 3 decimals, more than 19
digits) make it return None; the caller then converts value by value with the reference rule
(:func:`kinetoscope.trace.rules.exact_ns_text`).
"""

from __future__ import annotations

from typing import Any

import msgspec
import numpy as np

from kinetoscope.trace.rules import TS_LIMIT_NS

_ENC = msgspec.json.Encoder()
_SPLIT = 9  # digits in the low part (10**9 * 10**10 > any 19-digit value)
_COLS = np.arange(32)


def texts_blob(raws: Any) -> bytes:
    """``[t1,t2,...]``: the raw texts as one JSON array (missing values are empty)."""
    return _ENC.encode(raws)


def ns_from_texts(blob: bytes, n: int) -> np.ndarray | None:
    """Parse ``blob`` (:func:`texts_blob` of ``n`` texts) to int64 ns, or None (see module)."""
    a = np.frombuffer(blob, dtype=np.uint8)[1:-1]
    size = len(a)
    if n == 0 or size < 2 * n - 1:
        return None  # an empty (missing) value
    if (size + 1) % n == 0:  # every value may have the same width: one reshape, no gather
        w = (size + 1) // n - 1
        if 1 <= w <= 24:
            m: np.ndarray[Any, np.dtype[np.uint8]] = np.empty(size + 1, dtype=np.uint8)
            m[:size] = a
            m[size] = 44
            m = m.reshape(n, w + 1)
            if (m[:, w] == 44).all():
                m = m[:, :w]
                first = m[0]
                frac = w - 1 - int(np.flatnonzero(first == 46)[0]) if 46 in first else -1
                neg = bool(first[0] == 45)
                if (frac < 0 or (m[:, w - 1 - frac] == 46).all()) and (m[:, 0] == 45).all() == neg:
                    out = _group(m, frac, neg)
                    if out is not None:
                        return out
    return _general(a, n)


def _general(a: np.ndarray, n: int) -> np.ndarray | None:
    commas = np.flatnonzero(a == 44)
    if len(commas) != n - 1:
        return None  # a value that is not a number (strings and objects may hold commas)
    ends = np.empty(n, dtype=np.int64)
    ends[:-1] = commas
    ends[-1] = len(a)
    starts = np.empty(n, dtype=np.int64)
    starts[0] = 0
    starts[1:] = commas + 1
    lens = ends - starts
    if lens.min() <= 0 or lens.max() > 24:
        return None
    frac = np.full(n, -1, dtype=np.int64)
    dots = np.flatnonzero(a == 46)
    if len(dots):
        rows = np.searchsorted(starts, dots, side="right") - 1
        if len(rows) > 1 and not (np.diff(rows) > 0).all():
            return None  # two dots in one value
        frac[rows] = ends[rows] - dots - 1
    neg = (a[starts] == 45).astype(np.int64)
    key = (lens * 8 + frac + 1) * 2 + neg
    out = np.empty(n, dtype=np.int64)
    for k in np.unique(key).tolist():
        sel = np.flatnonzero(key == k)
        w = int(lens[sel[0]])
        m = a[starts[sel][:, None] + _COLS[:w]]
        got = _group(m, int(frac[sel[0]]), bool(neg[sel[0]]))
        if got is None:
            return None
        out[sel] = got
    return out


def _group(m: np.ndarray, frac: int, neg: bool) -> np.ndarray | None:
    """Rows of ``m`` (uint8, all the same layout: optional '-', digits, a '.' ``frac`` bytes
    from the end when ``frac >= 0``) -> int64 ns; None when a row is not of that layout, has
    more than 3 decimals, or the value does not fit."""
    w = m.shape[1]
    if frac > 3:
        return None
    cols = [j for j in range(w) if not (neg and j == 0) and not (frac >= 0 and j == w - 1 - frac)]
    nd = len(cols)
    if nd == 0:
        return None
    scale = 3 - max(frac, 0)  # decimals to append: ns = digits * 10**scale
    total = nd + scale
    if total > 19:
        return None
    # every byte outside the sign/dot columns is a digit
    d = m[:, cols] if len(cols) != w else m
    if not ((d >= 48) & (d <= 57)).all():
        return None
    hi_w = np.zeros(w)
    lo_w = np.zeros(w)
    for pos, j in enumerate(cols):
        e = total - 1 - pos  # power of ten of this digit in ns
        if e >= _SPLIT:
            hi_w[j] = 10.0 ** (e - _SPLIT)
        else:
            lo_w[j] = 10.0**e
    r = m @ np.stack((hi_w, lo_w), axis=1)  # sums of (byte value * weight), exact in float64
    hi = (r[:, 0] - 48.0 * hi_w.sum()).astype(np.uint64)
    lo = (r[:, 1] - 48.0 * lo_w.sum()).astype(np.uint64)
    v = hi * np.uint64(10**_SPLIT) + lo
    if total == 19 and int(v.max()) > TS_LIMIT_NS:
        return None
    out: np.ndarray[Any, Any] = v.astype(np.int64)
    if neg:
        np.negative(out, out=out)
    return out
