"""Pairing one rank's collective instances with the reference rank's (``diagnosis.clock``)."""

from __future__ import annotations

import polars as pl

from kinetoscope.diagnosis.clock import match_instances
from kinetoscope.diagnosis.collectives import COLLECTIVES_SCHEMA

MS = 1_000_000
US = 1_000
STEP = 110 * MS


def _allreduces(rank: int, ends: list[int]) -> pl.DataFrame:
    """Two gloo buckets per step, issued 10 ms before they end, in issue (ordinal) order."""
    rows = [
        {
            "rank": rank,
            "ordinal": k,
            "coll": "allreduce",
            "pg": "default",
            "pg_ranks": None,
            "lane": "tid 1",
            "seq": None,
            "arrival": e - 10 * MS,
            "end": e,
            "nelems": 1,
            "signal": "backend_annotation",
            "name": "gloo:all_reduce",
        }
        for k, e in enumerate(ends)
    ]
    return pl.DataFrame(rows, schema=COLLECTIVES_SCHEMA)


def test_crossing_buckets_at_the_trace_start_are_all_paired() -> None:
    # Gloo's two worker threads record a step's two buckets ending in either order. Here the
    # other rank's buckets end crossed (the second first) in the first two steps, which puts
    # both of its first step's ends nearest the reference's second bucket. The smoothing of
    # the pairing's lag has only the trace's first few instances to go on there; it used to
    # give the first bucket its neighbour's lag, and the one-to-one step then dropped it, so
    # the first step looked incomplete and was left out of the straggler analysis (a rank
    # that stalled in it was missed: cpu-rotating-w5-n4-s81, beside two CPU burners).
    steps = range(16)
    ref = _allreduces(0, [e for k in steps for e in (k * STEP, k * STEP + 30 * US)])
    crossed = [k * STEP + d for k in steps for d in ((200 * US, 160 * US) if k < 2 else (5 * US, 35 * US))]
    other = _allreduces(1, crossed)
    pairing, method = match_instances(ref, other, width=50 * MS, known_offset=0)
    assert method == "end_time" and pairing is not None
    pairs = sorted(zip(pairing.ref_ordinal.tolist(), pairing.ordinal.tolist(), strict=True))
    assert pairs == [(k, k) for k in range(32)]
    assert bool(pairing.causal.all())


def test_a_rank_whose_window_starts_a_step_later_is_paired_with_its_own_collectives() -> None:
    # One all-reduce per 45 ms step on one host (known offset 0). The reference is a straggler:
    # it arrives 1 ms before each end; the other rank, on a small model, arrives 3 ms after the
    # previous all-reduce ends. Its window starts a step later: its instance k is the
    # reference's k + 1. Paired k with k instead, every pair is still causal (its bounds hold
    # the offset within the tolerance), and there is one pair more (the windows overlap more):
    # counting pairs chose it, and the rank read a step late at every collective (the
    # early-trace CI failure). Its ends, a step from the reference's, give it away.
    step = 45 * MS
    ref_ends = [k * step for k in range(10)]
    other_ends = [(k + 1) * step + 400 * US for k in range(10)]
    ref = _allreduces(0, ref_ends).with_columns(arrival=pl.col("end") - 1 * MS)
    other = _allreduces(1, other_ends).with_columns(arrival=pl.col("end") - step + 3 * MS)
    pairing, method = match_instances(ref, other, width=20 * MS, known_offset=0)
    assert method == "end_time" and pairing is not None
    pairs = sorted(zip(pairing.ref_ordinal.tolist(), pairing.ordinal.tolist(), strict=True))
    assert pairs == [(k + 1, k) for k in range(9)]
