"""Hosts that only pipeline transfers join, placed by the transfers' causal bounds
(``diagnosis.clock_links``). The real job is in ``test_groups.py``; here, timelines built with a
known clock offset, so each bound and the result can be checked exactly."""

from __future__ import annotations

import polars as pl

from kinetoscope.diagnosis.clock import CLOCK_SCHEMA, ClockAlignment
from kinetoscope.diagnosis.clock_links import transfer_offsets
from kinetoscope.diagnosis.whatif.p2p import LINK_SCHEMA

MS = 1_000_000


def _clock(methods: dict[int, str]) -> ClockAlignment:
    rows = [
        {"rank": r, "host": None, "offset_us": 0.0, "method": m, "matched": 0}
        for r, m in sorted(methods.items())
    ]
    table = pl.DataFrame(rows).with_columns(
        [pl.lit(None, dtype=dt).alias(c) for c, dt in CLOCK_SCHEMA.items() if c not in rows[0]]
    )
    return ClockAlignment(
        reference=0,
        offsets=dict.fromkeys(methods, 0),
        table=table.select(list(CLOCK_SCHEMA)),
        window_ns=20_000,
    )


def _links(transfers: list[tuple[int, int, float, float]], skew: dict[int, float]) -> pl.DataFrame:
    """Transfers (src, dst, true issue time, true receive end), each side stamped by its own
    clock: true time + ``skew`` of its rank (ns)."""
    rows = []
    for k, (src, dst, issue, done) in enumerate(transfers):
        inst = f"p2p@{src}>{dst}#{k}"
        rows.append(
            {
                "rank": src,
                "instance": inst,
                "arrival": int(issue + skew[src]),
                "end": int(issue + skew[src]),
                "is_send": True,
            }
        )
        rows.append(
            {
                "rank": dst,
                "instance": inst,
                "arrival": int(done - 1e5 + skew[dst]),
                "end": int(done + skew[dst]),
                "is_send": False,
            }
        )
    return pl.DataFrame(rows, schema=LINK_SCHEMA)


def _pipeline(steps: int, latency: float = 50_000.0) -> list[tuple[int, int, float, float]]:
    """Rank 0 sends forward to rank 1 and rank 1 back, each step; the receiver waits, so its
    receive ends ``latency`` after the issue."""
    out = []
    for s in range(steps):
        t = s * 100 * MS
        out.append((0, 1, t, t + latency))
        out.append((1, 0, t + 40 * MS, t + 40 * MS + latency))
    return out


def test_a_host_joined_both_ways_is_placed_between_its_bounds() -> None:
    hosts = {0: "a", 1: "b"}
    links = _links(_pipeline(20), {0: 0.0, 1: 7 * MS})  # host b's clock reads 7 ms ahead
    found = transfer_offsets(links, _clock({0: "reference", 1: "unaligned"}), hosts)
    assert set(found) == {"b"}
    assert abs(found["b"] + 7 * MS) <= 50_000  # within the one-way latency of the truth


def test_a_host_joined_one_way_only_stays_unaligned() -> None:
    hosts = {0: "a", 1: "b"}
    forward = [t for t in _pipeline(20) if t[0] == 0]
    links = _links(forward, {0: 0.0, 1: 7 * MS})
    assert transfer_offsets(links, _clock({0: "reference", 1: "unaligned"}), hosts) == {}


def test_bounds_that_contradict_each_other_place_nothing() -> None:
    """Every forward transfer's receive ends 4.95 ms before its send was issued, read at any
    offset the backward transfers allow (beyond the window's tolerance): not causal."""
    hosts = {0: "a", 1: "b"}
    bad = [(s, d, i, e - 5 * MS) if s == 0 else (s, d, i, e) for s, d, i, e in _pipeline(20)]
    links = _links(bad, {0: 0.0, 1: 0.0})  # lower bound +4.95 ms, upper bound +0.05 ms
    found = transfer_offsets(links, _clock({0: "reference", 1: "unaligned"}), hosts)
    assert found == {}


def test_a_chain_of_hosts_is_placed_host_by_host() -> None:
    """Host c is joined only to host b, b only to a: b is placed against a, then c against b."""
    hosts = {0: "a", 1: "b", 2: "c"}
    chain = _pipeline(20) + [(1 + s, 2 - s, t + 5 * MS, e + 5 * MS) for s, _d, t, e in _pipeline(20)]
    links = _links(chain, {0: 0.0, 1: 7 * MS, 2: -3 * MS})
    found = transfer_offsets(links, _clock({0: "reference", 1: "unaligned", 2: "unaligned"}), hosts)
    assert set(found) == {"b", "c"}
    assert abs(found["b"] + 7 * MS) <= 50_000 and abs(found["c"] - 3 * MS) <= 100_000
