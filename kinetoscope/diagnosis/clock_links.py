"""Clock offsets of hosts that no process group joins, bounded by pipeline transfers.

Why: collectives align clocks (``clock``), but a pipeline whose hosts hold whole stages of every
replica has no collective that crosses hosts: only its sends and receives do. A transfer bounds
the offset ``x`` of the receiver's host one way: the receive cannot end before the send was
issued (``recv_end + x >= send_issue``); transfers the other way bound it from above
(``recv_end >= send_issue + x``). Transfers in both directions (activations forward, gradients
back) bracket ``x``; its estimate is the middle of the bracket. The bounds are tight where the
receiver was already waiting, which a pipeline's receives usually are. The bracket is taken at
the ``EDGE`` quantiles (the 95th percentile of the lower bounds, the 5th of the upper ones), not
at the extremes: a transfer at a trace window's edge can be paired with the wrong one (observed:
one of 64 upper bounds 0.25 ms past all the others).

A host is placed only when it has bounds both ways and they agree, within half the clock's
matching window (``ClockAlignment.window_ns``, the tolerance collectives are held to: process
clocks on one host differ by a fraction of a ms): a mis-paired transfer that breaks causality
leaves the host unaligned rather than wrongly placed.
Hosts are placed one at a time, each against the ranks already placed, so a chain of hosts joined
only by transfers is placed host by host.
"""

from __future__ import annotations

from collections.abc import Mapping

import polars as pl

from kinetoscope.diagnosis.clock import ClockAlignment

EDGE = 0.05  # the share of bounds at either end of the bracket set aside (module docstring)


def transfer_offsets(
    links: pl.DataFrame, clock: ClockAlignment, hosts: Mapping[int, str | None]
) -> dict[str, float]:
    """Offsets (ns, onto the reference's clock) of the hosts whose ranks ``clock`` left
    unaligned, from pipeline transfers (``whatif.p2p.p2p_links``: rank, instance, arrival, end,
    is_send, on ``clock.offsets``); empty when none can be placed (module docstring)."""
    if links.is_empty() or clock.table.is_empty():
        return {}
    off = {int(r): float(o) for r, o in clock.offsets.items()}
    unaligned = set(clock.unaligned_ranks())
    pending = {h for r in unaligned if (h := hosts.get(r)) is not None}
    if not pending:
        return {}
    placed = {r: o for r, o in off.items() if r not in unaligned}
    pairs = _pairs(links, off)
    found: dict[str, float] = {}
    while pending:
        step = _place_one(pairs, placed, pending, hosts, clock.window_ns / 2.0)
        if step is None:
            break
        host, x = step
        found[host] = x
        pending.discard(host)
        placed.update({r: x for r, h in hosts.items() if h == host})
    return found


def _pairs(links: pl.DataFrame, off: Mapping[int, float]) -> pl.DataFrame:
    """One row per transfer: sender, its issue time, receiver, its end, on their own clocks."""
    raw = links.with_columns(
        (pl.col("arrival") - pl.col("rank").replace_strict(off, default=0.0)).alias("_a"),
        (pl.col("end") - pl.col("rank").replace_strict(off, default=0.0)).alias("_e"),
    )
    send = raw.filter(pl.col("is_send")).select(
        "instance", pl.col("rank").alias("src"), pl.col("_a").alias("issue")
    )
    recv = raw.filter(~pl.col("is_send")).select(
        "instance", pl.col("rank").alias("dst"), pl.col("_e").alias("done")
    )
    return send.join(recv, on="instance")


def _place_one(
    pairs: pl.DataFrame,
    placed: Mapping[int, float],
    pending: set[str],
    hosts: Mapping[int, str | None],
    tolerance: float,
) -> tuple[str, float] | None:
    """The first pending host (in name order) whose transfers with placed ranks bound its offset
    both ways, consistently within ``tolerance`` (ns), and that offset; None when no host can be
    placed."""
    for host in sorted(pending):
        mine = [r for r, h in hosts.items() if h == host]
        lo = pairs.filter(pl.col("dst").is_in(mine) & pl.col("src").is_in(list(placed)))
        hi = pairs.filter(pl.col("src").is_in(mine) & pl.col("dst").is_in(list(placed)))
        if lo.is_empty() or hi.is_empty():
            continue
        at = pl.col("src").replace_strict(dict(placed), default=None, return_dtype=pl.Float64)
        lower = lo.select((pl.col("issue") + at - pl.col("done")).quantile(1.0 - EDGE, "lower")).item()
        at = pl.col("dst").replace_strict(dict(placed), default=None, return_dtype=pl.Float64)
        upper = hi.select((pl.col("done") + at - pl.col("issue")).quantile(EDGE, "higher")).item()
        if lower is not None and upper is not None and lower <= upper + tolerance:
            return host, (float(lower) + float(upper)) / 2.0
    return None
