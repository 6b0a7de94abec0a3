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
    # the rank's issuing thread waited for the transfer to end (``collectives`` ``waited``): a
    # pipeline schedule waits for its sends before it goes on, and that time is a wait
    "waited": pl.Boolean(),
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
    "local": pl.Boolean(),  # the peer is its rank in a group whose ranks no event records
    "waited": pl.Boolean(),  # ``LINK_SCHEMA``
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
    peers: list[int | None] = []
    local: list[bool] = []
    for p, g in zip(
        (_peer(x) for x in ops["concrete_inputs"].to_list()), sr["pg_ranks"].to_list(), strict=True
    ):
        members = sorted(int(x) for x in g.split(",")) if g else None
        if p is not None and members is not None and 0 <= p < len(members):
            peers.append(members[p])
            local.append(False)
        else:
            peers.append(p)
            local.append(True)
    waited = pl.col("waited").fill_null(False) if "waited" in sr.columns else pl.lit(False)
    out = sr.select("arrival", "end", waited.alias("waited")).with_columns(
        pl.Series("is_send", [P2P_OPS[n] == "send" for n in ops["name"].to_list()], dtype=pl.Boolean),
        pl.Series("peer", peers, dtype=pl.Int64),
        pl.Series("local", local, dtype=pl.Boolean),
    )
    return out.filter(pl.col("peer").is_not_null()).select(list(PEER_SCHEMA)).cast(PEER_SCHEMA)  # type: ignore[arg-type]


def p2p_links(peers: Mapping[int, pl.DataFrame | None], offsets: Mapping[int, int]) -> pl.DataFrame:
    """Every link both sides hold (module docstring), times on the aligned clock. ``peers``:
    each rank's ``rank_peers``; ``offsets``: ns added to each rank's times.

    Peers given as ranks in a group no event records (gloo traces name no group) are read
    three ways: as global ranks (the default group), in contiguous blocks of the group's size
    (``r // n * n + p``: the inner dimension of a device mesh), or strided (``r % s + p * s``,
    ``s = ranks / n``: the outer one); the reading with the most links both sides hold wins."""
    have = {r: f for r, f in peers.items() if f is not None and f.height}
    if not have:
        return pl.DataFrame(schema=LINK_SCHEMA)
    if not any(bool(f["local"].any()) for f in have.values()):
        return _links(have, offsets)
    n = max(int(f["peer"].fill_null(0).to_numpy().max(initial=0)) for f in have.values()) + 1
    world = max(have) + 1
    best = _links(have, offsets)
    for mapping in (_block, _strided):
        if world % n:
            break
        moved = {
            r: f.with_columns(
                peer=pl.when("local").then(mapping(r, pl.col("peer"), n, world)).otherwise("peer")
            )
            for r, f in have.items()
        }
        found = _links(moved, offsets)
        if found.height > best.height:
            best = found
    return best


def _block(r: int, p: pl.Expr, n: int, world: int) -> pl.Expr:
    return p + (r // n) * n


def _strided(r: int, p: pl.Expr, n: int, world: int) -> pl.Expr:
    s = world // n
    return p * s + (r % s)


def _links(peers: Mapping[int, pl.DataFrame], offsets: Mapping[int, int]) -> pl.DataFrame:
    """``p2p_links`` with the peers as given."""
    frames = []
    for r, f in peers.items():
        off = int(offsets.get(r, 0))
        frames.append(
            f.filter(pl.col("peer") != r).with_columns(
                pl.col("arrival") + off,
                pl.col("end") + off,
                pl.lit(r, dtype=pl.Int64).alias("rank"),
                pl.when(pl.col("is_send"))
                .then(pl.lit(r, dtype=pl.Int64))
                .otherwise(pl.col("peer"))
                .alias("src"),
                pl.when(pl.col("is_send"))
                .then(pl.col("peer"))
                .otherwise(pl.lit(r, dtype=pl.Int64))
                .alias("dst"),
            )
        )
    df = (
        pl.concat(frames)
        .sort("rank", "arrival")
        .with_columns(k=pl.int_range(pl.len(), dtype=pl.Int64).over("rank", "src", "dst"))
        .with_columns(instance=pl.format("p2p@{}>{}#{}", pl.col("src"), pl.col("dst"), pl.col("k")))
    )
    both = df.group_by("instance").agg(pl.col("is_send").sum().alias("_s"), pl.len().alias("_n"))
    keep = both.filter((pl.col("_n") == 2) & (pl.col("_s") == 1)).select("instance")
    return df.join(keep, on="instance").select(list(LINK_SCHEMA)).sort("rank", "arrival")
