"""Clock alignment across ranks, and matching of collective instances between ranks.

Why: every host stamps its trace with its own clock; across hosts they differ by hundreds of µs
or more (attention-gym#487), the same order as the arrival skew we want to measure.

Everything is relative to a **reference rank** (the rank with the most collective instances,
ties: the lowest rank). Aligned time of rank r = its own time + ``offset[r]`` (ns).

Matching (``match_instances``), each rank against the reference, per collective type
(``collectives.normalize_collective``):

1. **seq** -- when both ranks recorded sequence numbers (``Seq`` arg, newer PyTorch), instances
   with the same ``(process group, collective, seq)`` are the same collective. Exact.
2. **end time** -- otherwise. Collectives complete (nearly) together on every rank, so every
   pair of same-type instances votes for the offset ``end_ref - end_r``. The windows of width
   ``w`` (half the 25th percentile of the spacing between consecutive collective ends on the
   reference, clamped to [20 µs, 50 ms]) with the most votes are candidate offsets (up to 8, plus
   0). For each candidate, each instance of r is paired with the reference instance nearest in
   shifted end time; the *lag* (difference of ordinals) is smoothed with a running mode over 7
   instances, so a collective missing on one side shifts the lag by one from there on instead of
   derailing the match; pairs are made one-to-one. The winning candidate has the most
   **causally consistent** pairs (below), then the most votes, then the smallest |offset|
   (clocks are normally NTP-close). The offset is then refined to the median end difference of
   the consistent pairs and the pairing redone. This survives missing collectives, different
   trace windows (one rank starting a step later), interleaved collective types, and the wide
   end-time jitter of gloo (ms) where pure voting picks a one-step shift. At each candidate,
   constant ordinal lags (the ones the end-time pairing found, and their neighbours) are tried
   too and kept when more pairs are causal: ends of two gloo buckets cross by ms, and the few
   crossed pairs used to let a one-step shift win against the correct offset for a persistent
   straggler (whose correct pairs have little slack), making it look early.
   When the offset is known -- ranks on the reference's host share its clock -- pairs are made
   at that offset only, and a pair is causal when its bounds hold it.

Causality: a blocking collective (all-reduce, all-gather, reduce-scatter, all-to-all, barrier)
cannot complete on any rank before every rank has arrived. A pair (reference instance, rank-r
instance) therefore bounds the offset: ``arrival_ref - end_r <= offset <= end_ref - arrival_r``.
A pair is *consistent* with an offset if the offset lies in its bounds (tolerance ``w/2``);
non-blocking types (send/recv, broadcast) are consistent when their end difference is within
``w/2``. Inconsistent pairs are mismatches (or a different process group) and are not used.

Offset (``align_clocks``):

* ``measured`` = median of ``end_ref - end_r`` over the consistent pairs, clipped into the
  intersection of their causality bounds (``lower_bound_us``, ``upper_bound_us``);
* **ranks on the same host share one clock** (Kineto stamps host events with the host's wall
  clock): when host names are known, ranks on the reference's host get offset 0
  (``method="same_host"``) and ranks of another host get the median of that host's measured
  offsets (``"host_median"``); otherwise the rank's own measurement applies
  (``"collectives"``). The measured value is always reported: on one host it should be ~0
  within the residual, which is a check of the method;
* ``residual_us`` = median |end_ref - (end_r + offset)| over the consistent pairs: what
  disagreement of collective end times remains after alignment (transfer jitter + clock error).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import polars as pl

BLOCKING = frozenset({"allreduce", "allgather", "reducescatter", "alltoall", "barrier"})
_MIN_W = 20_000  # ns
_MAX_W = 50_000_000  # ns
_MAX_PAIRS = 4_000_000

# One row per (rank, instance of that rank) matched to an instance of the reference rank.
PAIRS_SCHEMA: dict[str, pl.DataType] = {
    "rank": pl.Int64(),
    "group": pl.String(),  # the instance's process group (``groups.assign_groups``; "*": job-wide)
    "coll": pl.String(),
    "ordinal": pl.Int64(),
    "ref_ordinal": pl.Int64(),
}

CLOCK_SCHEMA: dict[str, pl.DataType] = {
    "rank": pl.Int64(),
    "host": pl.String(),
    "offset_us": pl.Float64(),
    "measured_us": pl.Float64(),
    "lower_bound_us": pl.Float64(),
    "upper_bound_us": pl.Float64(),
    "matched": pl.Int64(),
    "residual_us": pl.Float64(),
    "method": pl.String(),
    "aligned_via": pl.Int64(),  # the rank it was paired with (the reference, or a rank sharing a group)
}


@dataclass
class ClockAlignment:
    reference: int | None
    offsets: dict[int, int] = field(default_factory=dict)  # ns to add to each rank's times
    table: pl.DataFrame = field(default_factory=lambda: pl.DataFrame(schema=CLOCK_SCHEMA))
    pairs: pl.DataFrame = field(default_factory=lambda: pl.DataFrame(schema=PAIRS_SCHEMA))
    match_method: str = "none"  # seq | end_time | none
    window_ns: int = 0
    notes: list[str] = field(default_factory=list)

    def unaligned_ranks(self) -> list[int]:
        """Ranks whose clock nothing placed (method ``unaligned``: left as is)."""
        return sorted(int(r) for r in self.table.filter(pl.col("method") == "unaligned")["rank"].to_list())

    def residual_us(self) -> float | None:
        """Median over non-reference ranks of their residual (µs)."""
        t = self.table.filter(pl.col("method") != "reference")
        vals = [v for v in t["residual_us"].to_list() if v is not None]
        return float(np.median(vals)) if vals else None


def _window(colls: pl.DataFrame) -> int:
    """Voting window: half the 25th percentile of the spacing between consecutive ends."""
    ends = np.sort(colls["end"].to_numpy())
    if ends.size < 2:
        return _MAX_W
    gaps = np.diff(ends)
    gaps = gaps[gaps > 0]
    if gaps.size == 0:
        return _MIN_W
    return int(np.clip(0.5 * np.percentile(gaps, 25), _MIN_W, _MAX_W))


def _candidate_diffs(e_ref: np.ndarray, e_r: np.ndarray) -> np.ndarray:
    n, m = e_ref.size, e_r.size
    if n == 0 or m == 0:
        return np.empty(0, dtype=np.int64)
    if n * m <= _MAX_PAIRS:
        diffs: np.ndarray = (e_ref[:, None] - e_r[None, :]).ravel()
        return diffs
    band = max(1, _MAX_PAIRS // max(n, m) // 2)  # only pairs at similar relative positions
    out = []
    for j in range(m):
        i0 = int(j * n / m)
        out.append(e_ref[max(0, i0 - band) : min(n, i0 + band + 1)] - e_r[j])
    return np.concatenate(out)


def vote_offsets(diffs: np.ndarray, width: int, k: int = 8) -> list[tuple[int, int]]:
    """Up to ``k`` candidate ``(offset, votes)``: centres of the ``width``-ns windows holding the
    most candidate offsets, at least ``width`` apart, best first (ties: smallest |offset|)."""
    if diffs.size == 0:
        return []
    d = np.sort(diffs)
    hi = np.searchsorted(d, d + width, side="right")
    counts = hi - np.arange(d.size)
    centers = (d + d[hi - 1]) // 2
    order = np.lexsort((np.abs(centers), -counts))
    out: list[tuple[int, int]] = []
    for idx in order:
        c = int(centers[idx])
        if all(abs(c - o) >= width for o, _ in out):
            out.append((c, int(counts[idx])))
            if len(out) >= k:
                break
    return out


def _running_mode(lags: np.ndarray, half: int = 3) -> np.ndarray:
    """Each lag replaced by the most common lag of the ``2 half + 1`` around it (kept when it
    is one of the most common; else the most common nearest to it, the smaller at a tie).
    Vectorised: O(m half^2)."""
    m = lags.size
    if m == 0:
        empty: np.ndarray = lags.copy()
        return empty
    width = 2 * half + 1
    pad = np.concatenate([np.zeros(half, dtype=lags.dtype), lags, np.zeros(half, dtype=lags.dtype)])
    valid_row = np.concatenate([np.zeros(half, bool), np.ones(m, bool), np.zeros(half, bool)])
    win = np.lib.stride_tricks.sliding_window_view(pad, width)
    valid = np.lib.stride_tricks.sliding_window_view(valid_row, width)
    same = (win[:, :, None] == win[:, None, :]) & valid[:, None, :]
    counts = np.where(valid, same.sum(axis=2), -1)
    best = counts.max(axis=1)
    own = counts[:, half]
    dist = np.abs(win - lags[:, None]).astype(np.int64)
    score = np.where(
        counts == best[:, None], dist * (1 << 32) + (win.astype(np.int64) + (1 << 31)), np.iinfo(np.int64).max
    )
    pick = win[np.arange(m), np.argmin(score, axis=1)]
    out: np.ndarray = np.where(own == best, lags, pick).astype(lags.dtype)
    return out


def _pair_by_lag(e_ref: np.ndarray, e_r: np.ndarray, offset: int) -> list[tuple[int, int]]:
    """One-to-one (i_ref, j_r) pairs of same-type instances, both arrays in arrival (ordinal)
    order. Each instance of r looks up the reference instance nearest in shifted end time; the
    difference of their positions (the lag) is smoothed by a running mode, and the pair is made
    in arrival order with that lag, so two nearly concurrent collectives whose end times cross
    (two gloo worker threads) are not swapped."""
    n, m = e_ref.size, e_r.size
    if n == 0 or m == 0:
        return []
    order = np.argsort(e_ref, kind="stable")
    sorted_ends = e_ref[order]
    shifted = e_r + offset
    pos = np.searchsorted(sorted_ends, shifted)
    left = np.clip(pos - 1, 0, n - 1)
    right = np.clip(pos, 0, n - 1)
    near_sorted = np.where(
        np.abs(sorted_ends[left] - shifted) <= np.abs(sorted_ends[right] - shifted), left, right
    )
    nearest = order[near_sorted]
    lags = _running_mode(nearest - np.arange(m))
    cand = np.arange(m) + lags
    ok = (cand >= 0) & (cand < n)
    js = np.flatnonzero(ok)
    is_ = cand[ok]
    resid = np.abs(e_ref[is_] - shifted[js])
    # one-to-one: each reference instance keeps its nearest (then first) rank-r instance
    order = np.lexsort((js, resid, is_))
    first = np.ones(order.size, dtype=bool)
    first[1:] = is_[order][1:] != is_[order][:-1]
    keep = order[first]
    return list(zip(is_[keep].tolist(), js[keep].tolist(), strict=True))


@dataclass
class _Typed:
    """The instances of one (group, collective type) on the reference and on another rank, in
    arrival order (``ordinal``)."""

    e_ref: np.ndarray
    a_ref: np.ndarray
    o_ref: np.ndarray
    e_r: np.ndarray
    a_r: np.ndarray
    o_r: np.ndarray
    blocking: bool
    group: str = "*"


def _group_col(df: pl.DataFrame) -> pl.DataFrame:
    """``df`` with a ``group`` column (``"*"``: job-wide) when it has none."""
    return df if "group" in df.columns else df.with_columns(pl.lit("*").alias("group"))


def _by_type(ref: pl.DataFrame, other: pl.DataFrame) -> dict[str, _Typed]:
    """Per (group, collective type) both ranks hold: their instances (key ``coll`` for the
    job-wide group, ``coll@group`` otherwise)."""
    ref, other = _group_col(ref), _group_col(other)
    out = {}
    a_parts = {k: d for k, d in ref.sort("ordinal").partition_by(["group", "coll"], as_dict=True).items()}
    b_parts = {k: d for k, d in other.sort("ordinal").partition_by(["group", "coll"], as_dict=True).items()}
    for key in sorted(set(a_parts) & set(b_parts), key=lambda k: (str(k[1]), str(k[0]))):
        g, c = str(key[0]), str(key[1])
        a, b = a_parts[key], b_parts[key]
        out[c if g == "*" else f"{c}@{g}"] = _Typed(
            a["end"].to_numpy(),
            a["arrival"].to_numpy(),
            a["ordinal"].to_numpy(),
            b["end"].to_numpy(),
            b["arrival"].to_numpy(),
            b["ordinal"].to_numpy(),
            c in BLOCKING,
            g,
        )
    return out


@dataclass
class Pairing:
    """Instances of one rank paired with the reference's, with per-pair evidence."""

    offset: int
    colls: list[str]
    ref_ordinal: np.ndarray
    ordinal: np.ndarray
    d: np.ndarray  # end_ref - end_r (ns)
    lo: np.ndarray  # causality lower bound on the offset (blocking) or d
    hi: np.ndarray  # causality upper bound on the offset (blocking) or d
    causal: np.ndarray  # bool: causally consistent with the best offset region (ranks candidates)
    matched: np.ndarray  # bool: causal and ends within 10 sigma: the same collective instance
    consistent: np.ndarray  # bool: causal and ends within 5 sigma: used to estimate the offset

    @property
    def n_causal(self) -> int:
        return int(self.causal.sum())

    @property
    def n_consistent(self) -> int:
        return int(self.consistent.sum())


def _stab(lo: np.ndarray, hi: np.ndarray, near: float) -> tuple[int, int, int]:
    """The offset region covered by the most intervals ``[lo_k, hi_k]``: (count, x1, x2).
    Among equally covered regions, the one nearest ``near``."""
    if lo.size == 0:
        return 0, 0, 0
    ts = np.concatenate([lo, hi])
    kinds = np.concatenate([np.zeros(lo.size, dtype=np.int64), np.ones(hi.size, dtype=np.int64)])
    order = np.lexsort((kinds, ts))  # opens before closes at equal positions (closed intervals)
    ts, kinds = ts[order], kinds[order]
    depth = np.cumsum(np.where(kinds == 0, 1, -1))
    best = int(depth.max())
    starts = np.flatnonzero((depth == best) & (kinds == 0))
    regions = [(int(ts[k]), int(ts[k + 1]) if k + 1 < ts.size else int(ts[k])) for k in starts]
    x1, x2 = min(
        regions, key=lambda r: 0 if r[0] <= near <= r[1] else min(abs(r[0] - near), abs(r[1] - near))
    )
    return best, x1, x2


def _consistent(
    d: np.ndarray, lo: np.ndarray, hi: np.ndarray, tight_ends: bool = True, at: tuple[int, int] | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(causal, matched, consistent) masks over candidate pairs.

    ``causal``: the pair's causality interval covers the offset region covered by the most
    intervals (``_stab``). The other two also require an end difference close to the median ``m`` of those pairs, with
    ``s`` = 1.4826 x their MAD of end differences (a real match ends together):
    ``matched``: ``|d - m| <= max(10 s, 1 ms)`` (pairs used as the same collective instance);
    only for device kernels (``tight_ends``): NCCL kernels end within µs of each other on every
    rank, while gloo's worker threads record completion after their last receive and, on a
    loaded host, can lag by tens of ms, so there ``matched = causal``;
    ``consistent``: ``|d - m| <= max(5 s, 50 µs)`` (pairs used to estimate the offset).
    ``at = (offset, tol)``: the offset is known (same host): ``causal`` = the pair's interval
    holds it, within ``tol``."""
    if d.size == 0:
        z = np.zeros(0, dtype=bool)
        return z, z, z
    if at is not None:
        ok = (lo - at[1] <= at[0]) & (hi + at[1] >= at[0])
    else:
        _count, x1, x2 = _stab(lo, hi, float(np.median(d)))
        ok = (lo <= x1) & (hi >= x2)
    if not ok.any():
        z = np.zeros(d.size, dtype=bool)
        return z, z, z
    med = float(np.median(d[ok]))
    scale = 1.4826 * float(np.median(np.abs(d[ok] - med)))
    dev = np.abs(d - med)
    matched = ok & (dev <= max(10 * scale, 1_000_000)) if tight_ends else ok
    return ok, matched, ok & (dev <= max(5 * scale, 50_000))


def _pair_const(n: int, m: int, lag: int) -> tuple[np.ndarray, np.ndarray]:
    """(i_ref, j_r) = (j + lag, j): every instance of r with the reference instance ``lag``
    positions later (same type, arrival order)."""
    j = np.arange(max(0, -lag), max(max(0, -lag), min(m, n - lag)), dtype=np.int64)
    return j + lag, j


_Piece = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]


def _piece(t: _Typed, offset: int, tol: int, lag: int | None) -> _Piece:
    """One key's pairs: reference ordinals, rank-r ordinals, end differences and causality
    bounds (vectorised)."""
    if lag is None:
        made = _pair_by_lag(t.e_ref, t.e_r, offset)
        i = np.array([p[0] for p in made], dtype=np.int64)
        j = np.array([p[1] for p in made], dtype=np.int64)
    else:
        i, j = _pair_const(t.e_ref.size, t.e_r.size, lag)
    d = (t.e_ref[i] - t.e_r[j]).astype(np.int64)
    lo = (t.a_ref[i] - t.e_r[j]).astype(np.int64) if t.blocking else d - tol
    hi = (t.e_ref[i] - t.a_r[j]).astype(np.int64) if t.blocking else d + tol
    return t.o_ref[i].astype(np.int64), t.o_r[j].astype(np.int64), d, lo, hi


def _pairing(
    typed: dict[str, _Typed],
    offset: int,
    tol: int,
    tight_ends: bool = True,
    lags: dict[str, int] | None = None,
    known: bool = False,
    cache: dict[tuple[str, int, int | None], _Piece] | None = None,
) -> Pairing:
    """Pairs at candidate ``offset`` (by end-time lags, ``_pair_by_lag``), or with one constant
    ordinal lag per key when ``lags`` is given. ``cache``: pieces already made for (key,
    offset, lag), so that trying one key's lag re-pairs that key alone (linear in events)."""
    cache = {} if cache is None else cache
    colls: list[str] = []
    parts: list[_Piece] = []
    for c, t in typed.items():
        if lags is not None and c not in lags:
            continue
        lag = None if lags is None else lags[c]
        ck = (c, offset if lag is None else 0, lag)
        if ck not in cache:
            cache[ck] = _piece(t, offset, tol, lag)
        piece = cache[ck]
        colls += [c] * piece[0].size
        parts.append(piece)
    if parts:
        ro_, o_, d_, lo_, hi_ = (np.concatenate([p[k] for p in parts]) for k in range(5))
    else:
        ro_ = o_ = d_ = lo_ = hi_ = np.zeros(0, dtype=np.int64)
    causal, matched, consistent = _consistent(d_, lo_, hi_, tight_ends, at=(offset, tol) if known else None)
    return Pairing(offset, colls, ro_, o_, d_, lo_, hi_, causal, matched, consistent)


def _lags_of(p: Pairing) -> dict[str, list[int]]:
    """Per collective type, the ordinal lags of a pairing, most common first (ties: smallest |lag|)."""
    out: dict[str, list[int]] = {}
    if not p.colls:
        return out
    colls = np.array(p.colls)
    lag = p.ref_ordinal - p.ordinal
    for c in sorted(set(p.colls)):
        vals, counts = np.unique(lag[colls == c], return_counts=True)
        order = sorted(range(vals.size), key=lambda k: (-counts[k], abs(int(vals[k]))))
        out[c] = [int(vals[k]) for k in order]
    return out


def _unpaired(p: Pairing, typed: dict[str, _Typed]) -> bool:
    """Whether some key of ``p`` pairs fewer instances than both ranks hold."""
    made = dict(zip(*np.unique(np.array(p.colls), return_counts=True), strict=True)) if p.colls else {}
    return any(int(made.get(c, 0)) < min(t.e_ref.size, t.e_r.size) for c, t in typed.items())


def _best_pairing(
    typed: dict[str, _Typed], offset: int, tol: int, tight: bool, known: bool = False
) -> Pairing:
    """At one candidate (or known) offset: the end-time-lag pairing, or a constant-lag pairing
    when that has more causal pairs.

    End times of nearly concurrent collectives (two gloo buckets) cross by ms on a loaded host,
    so the nearest-end lag flips between neighbours; and a persistent straggler leaves correct
    pairs little slack (its arrival is a transfer time before the common end), so a few crossed
    pairs made the correct offset lose to a one-step shift on a real 4-rank run. Per type, the
    lags the end-time pairing found and their neighbours are tried as constant lags (arrival
    order kept), greedily type by type; the end-time pairing stays when it is as good (it
    handles a collective missing on one side). They are tried too when every pair has one lag
    but an instance was left unpaired: at the edge of the trace the running mode can give the
    first of two crossing buckets its neighbour's lag, and the one-to-one step then drops it
    (a stall in the first traced step was lost with it). Each key's pairs are made once per lag
    (``_pairing``'s cache)."""
    cache: dict[tuple[str, int, int | None], _Piece] = {}
    p = _pairing(typed, offset, tol, tight, known=known, cache=cache)
    seen = _lags_of(p)
    if not seen or (all(len(v) == 1 for v in seen.values()) and not _unpaired(p, typed)):
        return p
    lags = {c: v[0] for c, v in seen.items()}
    best = _pairing(typed, offset, tol, tight, lags=lags, known=known, cache=cache)
    for c, vals in seen.items():
        tries = sorted(
            {x for v in vals for x in (v - 1, v, v + 1)},
            key=lambda x: (vals.index(x) if x in vals else len(vals), abs(x)),
        )
        for lag in tries[:9]:  # the three most common lags and their neighbours at most
            if lag == lags[c]:
                continue
            q = _pairing(typed, offset, tol, tight, lags={**lags, c: lag}, known=known, cache=cache)
            if _better(q, best, tol, known):
                best, lags = q, {**lags, c: lag}
    return best if _better(best, p, tol, known) else p


# On one clock a blocking collective's recorded end is never before any member's recorded arrival
# (the op starts before the rank takes part; the end is stamped once the work is done): the
# bounds of a true pair hold the known offset to the recording's precision.
_STRICT_NS = 100_000


def _per_instance(p: Pairing) -> dict[tuple[str, int], tuple[bool, bool, int]]:
    """Rank r's paired instances, keyed (pairing key, ordinal): (causal within ``_STRICT_NS``,
    causal, |end difference - offset|)."""
    dev = np.abs(p.d - p.offset)
    strict = (p.lo - _STRICT_NS <= p.offset) & (p.hi + _STRICT_NS >= p.offset)
    return {
        (c, int(o)): (bool(t), bool(k), int(x))
        for c, o, t, k, x in zip(
            p.colls, p.ordinal.tolist(), strict.tolist(), p.causal.tolist(), dev.tolist(), strict=True
        )
    }


def _better(q: Pairing, p: Pairing, tol: int, known: bool) -> bool:
    """Whether pairing ``q`` explains rank r's instances better than ``p`` (both at one offset):
    more causal pairs.

    When the offset is known (one host's clock), they are compared on the instances of r that
    both pair: more pairs whose bounds hold the offset exactly (``_STRICT_NS``: a pair one step
    off on a loaded host is causal within the tolerance, its end stamped late by the gloo
    worker, but its partner arrived after that end); then more causal pairs; else, as many,
    ends clearly nearer the offset (median |end
    difference - offset| smaller by more than ``tol`` and than half of ``p``'s: a real match
    ends together, a match one instance off ends an instance spacing apart); else more causal
    pairs in all. Counting all pairs first favoured the lag under which the two windows overlap
    most: a rank whose trace started a step after the reference's was paired a step off (every
    pair causal on a small model, whose ranks arrive a few ms after the previous collective
    ends) and looked a step late at every collective. At a candidate offset each pairing's
    causal pairs hold an offset region of their own, not the candidate, so there the count
    alone decides (the candidates are then weighed against each other, ``match_instances``)."""
    if not known:
        return q.n_causal > p.n_causal
    a, b = _per_instance(q), _per_instance(p)
    common = a.keys() & b.keys()
    for col in (0, 1):  # strictly causal, then causal within the tolerance
        ca, cb = sum(a[k][col] for k in common), sum(b[k][col] for k in common)
        if ca != cb:
            return ca > cb
    if common:
        ra = float(np.median([a[k][2] for k in common]))
        rb = float(np.median([b[k][2] for k in common]))
        if abs(ra - rb) > max(tol, 0.5 * max(ra, rb)):
            return ra < rb
    return q.n_causal > p.n_causal


def match_instances(
    ref: pl.DataFrame, other: pl.DataFrame, width: int, known_offset: int | None = None
) -> tuple[Pairing | None, str]:
    """Pair the instances of the same collective on the reference and another rank.

    ``known_offset``: the clocks' offset when known (ranks on one host share a clock): pairs
    are made at that offset only (no voting), so the offset cannot be mistaken for a step shift.

    Returns the pairing and the method: ``seq``, ``end_time`` or ``none`` (module docstring)."""
    if ref.height == 0 or other.height == 0:
        return None, "none"
    ref, other = _group_col(ref), _group_col(other)
    if ref["seq"].null_count() < ref.height and other["seq"].null_count() < other.height:
        j = ref.filter(pl.col("seq").is_not_null()).join(
            other.filter(pl.col("seq").is_not_null()),
            on=["group", "pg", "coll", "seq"],
            how="inner",
            suffix="_r",
        )
        if j.height:
            blk = j["coll"].is_in(list(BLOCKING)).to_numpy()
            d = (j["end"] - j["end_r"]).to_numpy()
            lo = np.where(blk, (j["arrival"] - j["end_r"]).to_numpy(), d - width // 2)
            hi = np.where(blk, (j["end"] - j["arrival_r"]).to_numpy(), d + width // 2)
            ones = np.ones(d.size, dtype=bool)
            keys = j.select(
                pl.when(pl.col("group") == "*")
                .then(pl.col("coll"))
                .otherwise(pl.format("{}@{}", pl.col("coll"), pl.col("group")))
            ).to_series()
            pairing = Pairing(
                int(np.median(d)),
                keys.to_list(),
                j["ordinal"].to_numpy(),
                j["ordinal_r"].to_numpy(),
                d,
                lo,
                hi,
                ones,
                ones,
                _consistent(d, lo, hi)[2],
            )
            return pairing, "seq"
    typed = _by_type(ref, other)
    if not typed:
        return None, "none"
    tight = bool((ref["signal"] == "kernel").all() and (other["signal"] == "kernel").all())
    if known_offset is not None:
        return _best_pairing(typed, int(known_offset), width // 2, tight, known=True), "end_time"
    diffs = np.concatenate([_candidate_diffs(t.e_ref, t.e_r) for t in typed.values()])
    cands = dict(vote_offsets(diffs, width))
    if not cands:
        return None, "none"
    if all(abs(c) >= width for c in cands):
        cands[0] = 0
    best: tuple[tuple[int, int, int], Pairing] | None = None
    for c, votes in cands.items():
        p = _best_pairing(typed, c, width // 2, tight)
        key = (p.n_causal, votes, -abs(c))
        if best is None or key > best[0]:
            best = (key, p)
    assert best is not None
    p = best[1]
    if p.n_consistent:
        refined = int(np.median(p.d[p.consistent]))
        p2 = _best_pairing(typed, refined, width // 2, tight)
        if p2.n_causal >= p.n_causal:
            p = p2
    return p, "end_time"


def _measure(p: Pairing | None) -> dict[str, float | int | None]:
    if p is None or p.n_consistent == 0:
        return {"measured": None, "lo": None, "hi": None, "matched": 0, "d": None}
    d = p.d[p.consistent]
    lo = float(p.lo[p.consistent].max())
    hi = float(p.hi[p.consistent].min())
    m = float(np.median(d))
    if lo <= hi:
        m = min(max(m, lo), hi)
    return {"measured": m, "lo": lo, "hi": hi, "matched": int(d.size), "d": d}


_BIAS_NOTE_NS = 100_000  # a reference end bias worth a note (100 us: the verdicts' absolute floor)


def _reference_end_bias(
    ranks: list[int], reference: int, hosts: dict[int, str | None], est: dict[int, dict[str, Any]]
) -> float:
    """How much later (ns) the reference rank's collectives end than those of the other ranks
    on its host: the median of their measured offsets, which share its clock and so measure only
    the difference of their ends (0 with fewer than two such ranks: one cannot tell which of two
    ends late). Other hosts are measured against the reference's ends; a reference with a slow
    link (its ends ~9 ms late) shifted every other host by as much, so its late ends vanished
    and its host's other ranks looked early (``docs/diagnosis.md`` §3)."""
    host = hosts.get(reference)
    if host is None:
        return 0.0
    mates = [
        float(est[r]["measured"])
        for r in ranks
        if r != reference and hosts.get(r) == host and est[r]["measured"] is not None
    ]
    return float(np.median(mates)) if len(mates) >= 2 else 0.0


def _split(key: str) -> tuple[str, str]:
    """A pairing key (``coll`` or ``coll@group``) as (group, coll)."""
    c, _, g = key.partition("@")
    return (g or "*"), c


def _groups_of(c: pl.DataFrame) -> set[str]:
    return (
        set(c["group"].drop_nulls().to_list())
        if "group" in c.columns and c.height
        else ({"*"} if c.height else set())
    )


def _in(c: pl.DataFrame, groups: set[str]) -> pl.DataFrame:
    """The instances of ``c`` in ``groups``."""
    if "group" not in c.columns:
        return c if "*" in groups else c.clear()
    return c.filter(pl.col("group").is_in(sorted(groups)))


def _plan(colls: dict[int, pl.DataFrame], reference: int) -> tuple[list[int], dict[int, int], dict[str, int]]:
    """Breadth-first over the process groups from the reference: the order ranks are aligned
    in, each rank's parent (an aligned rank it shares a group with; the reference for every
    rank of a job-wide group) and each group's reference (its first aligned member).

    Ranks that share no group, directly or through others, with the reference (a job whose
    collectives fall into separate sets of ranks: data-parallel groups of pipeline stages whose
    transfers carry no group) are walked the same way from the lowest of them: their groups get
    a reference of their own, so that their instances are still compared within the group; the
    walk's first rank has no parent (its offset is its host's, else unknown)."""
    members: dict[str, list[int]] = {}
    for r in sorted(colls):
        for g in _groups_of(colls[r]):
            members.setdefault(g, []).append(r)
    order: list[int] = []
    parent: dict[int, int] = {}
    gref: dict[str, int] = {}
    seen: set[int] = set()
    for root in [reference, *sorted(colls)]:
        if root in seen:
            continue
        seen.add(root)
        order.append(root)
        k = len(order) - 1
        while k < len(order):
            r = order[k]
            k += 1
            for g in sorted(_groups_of(colls[r]), key=lambda g: (g != "*", -len(members[g]), g)):
                gref.setdefault(g, r)
                for q in members[g]:
                    if q not in seen:
                        seen.add(q)
                        parent[q] = r
                        order.append(q)
    return order, parent, gref


def _shifted(e: dict[str, Any], by: float) -> dict[str, Any]:
    """A measurement against a parent, moved onto the reference's clock (``by``: the parent's offset)."""
    if e["measured"] is None or not by:
        return e
    return {
        **e,
        "measured": float(e["measured"]) + by,
        "lo": None if e["lo"] is None else float(e["lo"]) + by,
        "hi": None if e["hi"] is None else float(e["hi"]) + by,
        "d": None if e["d"] is None else e["d"] + by,
    }


def _self_rows(c: pl.DataFrame, r: int, groups: set[str]) -> list[tuple[int, str, str, int, int]]:
    """A group reference's own instances, each its own reference instance."""
    c = _group_col(_in(c, groups))
    return [(r, g, k, o, o) for g, k, o in c.select("group", "coll", "ordinal").iter_rows()]


def _pair_rows(r: int, p: Pairing | None, groups: set[str]) -> list[tuple[int, str, str, int, int]]:
    """The matched pairs of ``p`` in ``groups`` as pair rows of rank ``r``."""
    if p is None:
        return []
    out = []
    for k in np.flatnonzero(p.matched):
        g, c = _split(p.colls[k])
        if g in groups:
            out.append((r, g, c, int(p.ordinal[k]), int(p.ref_ordinal[k])))
    return out


def align_clocks(
    colls: dict[int, pl.DataFrame],
    hosts: dict[int, str | None] | None = None,
    *,
    reference: int | None = None,
    same_host_shares_clock: bool = True,
    host_offsets: Mapping[str, float] | None = None,
) -> ClockAlignment:
    """Offsets putting every rank on the reference rank's clock (see module docstring).

    ``colls`` maps rank -> its collective instances (``collectives.COLLECTIVES_SCHEMA``, with the
    ``group`` of ``groups.assign_groups`` when known). Each rank is paired with its parent of
    ``_plan`` on the groups they share (a job-wide group: the reference, as without groups), and
    its offset is the parent's plus the measured one; the pairs that define the instances are
    then each group's members against the group's reference. ``host_offsets``: the offsets (ns)
    of hosts no collective placed, found otherwise (``clock_links``: pipeline transfers); their
    ranks are placed there (method ``transfers``) and their groups' members measured through
    them."""
    hosts = hosts or {}
    ranks = sorted(colls)
    if not ranks:
        return ClockAlignment(reference=None)
    if reference is None:
        reference = max(ranks, key=lambda r: (colls[r].height, -r))
    ref = colls[reference]
    width = _window(ref) if ref.height else _MAX_W
    res = ClockAlignment(reference=reference, window_ns=width)
    known_clocks = _Clocks(reference, hosts, same_host_shares_clock, dict(host_offsets or {}))
    est: dict[int, dict[str, Any]] = {}
    pair_rows: list[tuple[int, str, str, int, int]] = []
    methods = set()
    order, parent, gref = _plan(colls, reference)
    via: dict[int, int | None] = {reference: None}
    covered: set[tuple[int, str]] = set()
    for g, owner in gref.items():
        pair_rows += _self_rows(colls[owner], owner, {g})
        covered.add((owner, g))
    for r in order:
        if r == reference:
            est[r] = {"measured": 0.0, "lo": None, "hi": None, "matched": ref.height, "d": None}
            continue
        par = parent.get(r)
        via[r] = par
        if par is None or (
            est.get(par, {}).get("measured") is None and known_clocks.host_offset(par) is None
        ):
            est[r] = _measure(None)
            continue
        shared = _groups_of(colls[par]) & _groups_of(colls[r])
        base, known = known_clocks.base_and_known(r, par, est)
        p, method = match_instances(_in(colls[par], shared), _in(colls[r], shared), width, known_offset=known)
        if method != "none":
            methods.add(method)
        est[r] = _shifted(_measure(p), base)
        mine = {g for g in shared if gref.get(g) == par}
        pair_rows += _pair_rows(r, p, mine)
        covered |= {(r, g) for g in mine}
    res.match_method = "seq" if methods == {"seq"} else ("end_time" if methods else "none")

    bias = _reference_end_bias(ranks, reference, hosts, est) if same_host_shares_clock else 0.0
    if abs(bias) >= _BIAS_NOTE_NS:
        res.notes.append(
            f"reference rank {reference}'s collectives end {bias / 1000.0:.0f} us after those of the other "
            f"ranks on its host: the other hosts are aligned on its host's median end"
        )
    by_host: dict[str, list[float]] = {}
    for r in ranks:
        h, m = hosts.get(r), est[r]["measured"]
        if h is not None and m is not None and r != reference:
            by_host.setdefault(h, []).append(float(m))
    rows = []
    unaligned: set[int] = set()
    for r in ranks:
        e = est[r]
        h = hosts.get(r)
        applied, method = known_clocks.applied(r, e, by_host, bias)
        if method == "unaligned":
            unaligned.add(r)
            res.notes.append(
                f"rank {r}: no collective matched reference rank {reference}; its clock is left as is"
            )
        res.offsets[r] = int(round(applied))
        rows.append(_clock_row(r, h, e, applied, method, r == reference, via.get(r)))
    res.table = pl.DataFrame(rows, schema=CLOCK_SCHEMA, orient="row")
    clock_hosts = hosts if same_host_shares_clock else {}
    pair_rows += _group_pairs(colls, gref, covered, res.offsets, width, unaligned, clock_hosts)
    res.pairs = pl.DataFrame(pair_rows, schema=PAIRS_SCHEMA, orient="row")
    return res


def _clock_row(
    r: int, h: str | None, e: dict[str, Any], applied: float, method: str, is_reference: bool, via: int | None
) -> dict[str, Any]:
    """Rank ``r``'s row of the clock table (``CLOCK_SCHEMA``; µs): its applied and measured
    offsets, bounds, matches, the residual of its matched pairs and how it was aligned."""
    d = e.get("d")
    resid = (
        0.0 if is_reference else (float(np.median(np.abs(d - applied))) / 1000.0 if d is not None else None)
    )
    return {
        "rank": r,
        "host": h,
        "offset_us": applied / 1000.0,
        "measured_us": None if e["measured"] is None else float(e["measured"]) / 1000.0,
        "lower_bound_us": None if e["lo"] is None else float(e["lo"]) / 1000.0,
        "upper_bound_us": None if e["hi"] is None else float(e["hi"]) / 1000.0,
        "matched": int(e["matched"] or 0),
        "residual_us": resid,
        "method": method,
        "aligned_via": via,
    }


@dataclass(frozen=True)
class _Clocks:
    """What is known of the ranks' clocks before any pairing: the reference's host shares its
    clock (with ``same_host``), and ``host_offsets`` places whole hosts (``align_clocks``)."""

    reference: int
    hosts: dict[int, str | None]
    same_host: bool
    host_offsets: dict[str, float]

    def host_offset(self, r: int) -> float | None:
        """Rank ``r``'s offset known from its host: 0 on the reference's host, a placed host's
        offset, else None."""
        h = self.hosts.get(r)
        if r == self.reference or (self.same_host and h is not None and h == self.hosts.get(self.reference)):
            return 0.0
        return self.host_offsets.get(h) if h is not None else None

    def base_and_known(self, r: int, par: int, est: dict[int, dict[str, Any]]) -> tuple[float, int | None]:
        """For rank ``r`` measured against its parent ``par``: the parent's offset to the
        reference (known from its host, else measured), and the offset ``r`` is known to have
        against the parent (from its host, or sharing the parent's host clock), else None."""
        par_off = self.host_offset(par)
        base = par_off if par_off is not None else float(est[par]["measured"])
        own = self.host_offset(r)
        if own is not None:
            return base, int(round(own - base))
        h = self.hosts.get(r)
        same = self.same_host and h is not None and h == self.hosts.get(par)
        return base, (0 if same else None)

    def applied(
        self, r: int, e: dict[str, Any], by_host: dict[str, list[float]], bias: float
    ) -> tuple[float, str]:
        """(offset applied to rank ``r`` in ns, how it was chosen: ``reference``, ``same_host``,
        ``transfers``, ``host_median``, ``collectives`` or ``unaligned``); ``e`` is its estimate."""
        h = self.hosts.get(r)
        if r == self.reference:
            return 0.0, "reference"
        if self.same_host and h is not None and h == self.hosts.get(self.reference):
            return 0.0, "same_host"
        if h is not None and h in self.host_offsets:
            return float(self.host_offsets[h]), "transfers"
        if self.same_host and h is not None and len(by_host.get(h, [])) > 1:
            return float(np.median(by_host[h])) - bias, "host_median"
        if e["measured"] is not None:
            return float(e["measured"]) - (bias if h is not None else 0.0), "collectives"
        return 0.0, "unaligned"


def _group_pairs(
    colls: dict[int, pl.DataFrame],
    gref: dict[str, int],
    covered: set[tuple[int, str]],
    offsets: dict[int, int],
    width: int,
    unaligned: set[int],
    clock_hosts: dict[int, str | None],
) -> list[tuple[int, str, str, int, int]]:
    """Pair rows of the members of each group that were aligned through another group: paired
    with the group's reference on that group alone, at the offsets now known (one pairing per
    (rank, group): linear in the job's instances). Where either side's offset is not known
    (``unaligned``: a rank that shares no group with the reference's) the two are paired only
    when they read one host's clock (the same named host in ``clock_hosts``); otherwise their arrivals are on clocks nothing relates,
    and the rank's instances of that group are left out (its clock note says so)."""
    rows: list[tuple[int, str, str, int, int]] = []
    for r in sorted(colls):
        for g in sorted(_groups_of(colls[r])):
            owner = gref.get(g)
            if owner is None or (r, g) in covered or r == owner:
                continue
            one_clock = clock_hosts.get(r) is not None and clock_hosts.get(r) == clock_hosts.get(owner)
            if (r in unaligned or owner in unaligned) and not one_clock:
                continue
            known = int(offsets.get(r, 0) - offsets.get(owner, 0))
            p, _method = match_instances(
                _in(colls[owner], {g}), _in(colls[r], {g}), width, known_offset=known
            )
            rows += _pair_rows(r, p, {g})
    return rows
