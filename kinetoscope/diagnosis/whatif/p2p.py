"""Point-to-point links of a pipeline job: each send paired with its peer's receive.

A pipeline stage waits for its upstream neighbour's activations (and the downstream one's
gradients); without these links a replay cannot tell a stage that waited from a stage that
worked, and the ranks a slowed worker held back look slow themselves. The peer of a transfer is
not on the communication event (an NCCL ``SendRecv`` kernel, a ``gloo:send`` annotation) but on
the host op that issued it: ``c10d::send`` / ``c10d::recv_`` record their arguments when the
profiler records input shapes (``Concrete Inputs``: tensors, group, peer, tag), the peer being
its rank *in the op's process group*.

Per rank, the k-th issuing op (time order) is paired with the k-th ``sendrecv`` instance of its
collectives (same count required: otherwise the rank's transfers get no peer). The peer's global
rank is its position in the instance's recorded group ranks (c10d numbers a group's ranks in
sorted order); with no recorded group the peer is taken as global (the default group). A *link*
``p2p@<src>><dst>#<k>`` is the k-th transfer from ``src`` to ``dst``: the sender's k-th send to
``dst`` and the receiver's k-th receive from ``src``. Only links both sides hold are kept, which
also drops peers misread from a subgroup without recorded ranks.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import polars as pl

from kinetoscope.trace.model import Trace

P2P_OPS = {"c10d::send": "send", "c10d::recv_": "recv"}
LINK_SCHEMA: dict[str, pl.DataType] = {
    "rank": pl.Int64(),
    "instance": pl.String(),
    "arrival": pl.Int64(),
    "end": pl.Int64(),
    "is_send": pl.Boolean(),
}


def _peer(text: str | None) -> int | None:
    """The peer argument (third concrete input) of a ``c10d::send``/``recv_`` op."""
    if not text:
        return None
    found = re.findall(r'"(-?\d*)"', text)
    if len(found) < 3 or not found[2].lstrip("-").isdigit():
        return None
    return int(found[2])


PEER_SCHEMA: dict[str, pl.DataType] = {
    "arrival": pl.Int64(),
    "end": pl.Int64(),
    "is_send": pl.Boolean(),
    "peer": pl.Int64(),
}


def rank_peers(trace: Trace, colls: pl.DataFrame) -> pl.DataFrame:
    """One rank's transfers with their direction and global peer (``PEER_SCHEMA``, the rank's
    own clock); empty when its issuing ops do not pair one to one with its ``sendrecv``
    instances (``colls``: ``collectives.extract_collectives`` of the trace)."""
    ev = trace.events
    if ev.is_empty() or "concrete_inputs" not in ev.columns or colls.is_empty():
        return pl.DataFrame(schema=PEER_SCHEMA)
    ops = ev.filter(pl.col("name").is_in(list(P2P_OPS)) & (pl.col("kind") == "cpu_op")).sort("ts")
    sr = colls.filter(pl.col("coll") == "sendrecv").sort("arrival", "end")
    if ops.is_empty() or ops.height != sr.height:
        return pl.DataFrame(schema=PEER_SCHEMA)
    peers = []
    for p, g in zip((_peer(x) for x in ops["concrete_inputs"].to_list()), sr["pg_ranks"].to_list(), strict=True):
        members = sorted(int(x) for x in g.split(",")) if g else None
        peers.append(members[p] if p is not None and members and 0 <= p < len(members) else p)
    out = sr.select("arrival", "end").with_columns(
        pl.Series("is_send", [P2P_OPS[n] == "send" for n in ops["name"].to_list()], dtype=pl.Boolean),
        pl.Series("peer", peers, dtype=pl.Int64),
    )
    return out.filter(pl.col("peer").is_not_null()).select(list(PEER_SCHEMA)).cast(PEER_SCHEMA)  # type: ignore[arg-type]


def p2p_links(peers: Mapping[int, pl.DataFrame | None], offsets: Mapping[int, int]) -> pl.DataFrame:
    """Every link both sides hold (module docstring), times on the aligned clock. ``peers``:
    each rank's ``rank_peers``; ``offsets``: ns added to each rank's times."""
    frames = []
    for r, f in peers.items():
        if f is None or f.is_empty():
            continue
        off = int(offsets.get(r, 0))
        frames.append(
            f.filter(pl.col("peer") != r).with_columns(
                pl.col("arrival") + off,
                pl.col("end") + off,
                pl.lit(r, dtype=pl.Int64).alias("rank"),
                pl.when(pl.col("is_send")).then(pl.lit(r, dtype=pl.Int64)).otherwise(pl.col("peer")).alias("src"),
                pl.when(pl.col("is_send")).then(pl.col("peer")).otherwise(pl.lit(r, dtype=pl.Int64)).alias("dst"),
            )
        )
    if not frames:
        return pl.DataFrame(schema=LINK_SCHEMA)
    df = (
        pl.concat(frames)
        .sort("rank", "arrival")
        .with_columns(k=pl.int_range(pl.len(), dtype=pl.Int64).over("rank", "src", "dst"))
        .with_columns(instance=pl.format("p2p@{}>{}#{}", pl.col("src"), pl.col("dst"), pl.col("k")))
    )
    both = df.group_by("instance").agg(pl.col("is_send").sum().alias("_s"), pl.len().alias("_n"))
    keep = both.filter((pl.col("_n") == 2) & (pl.col("_s") == 1)).select("instance")
    return df.join(keep, on="instance").select(list(LINK_SCHEMA)).sort("rank", "arrival")
