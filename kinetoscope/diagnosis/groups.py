"""Process groups: which ranks take part in each collective instance.

A job with more than one kind of parallelism (data x tensor x pipeline) runs each collective in
a *process group*: the tensor-parallel all-reduce among the few ranks of one tensor-parallel
group, the gradient reduce-scatter among the data-parallel replicas of one shard, and so on. An
instance is complete when every *member of its group* arrived, clocks are aligned on pairs of
the same group, and a rank is compared with the members of its groups only.

``assign_groups`` gives every collective instance of every rank a ``group``: the member ranks
as ``"0,4,8,12"``, or ``"*"`` (every rank of the job: DDP's default group, and whatever cannot be
told apart). In order of preference:

``recorded``
    the trace names the group's ranks (``Process Group Ranks`` on ``record_param_comms`` or the
    communication kernel), or names the group (``Process Group Name``) and the trace's
    ``distributedInfo.pg_config`` lists that group's ranks.
``named``
    the events name the group but no trace lists its ranks: the members are the ranks with
    instances of that name (c10d names groups by a counter every rank advances alike).
``inferred``
    nothing names the group (gloo traces taken on demand carry neither names nor ranks): each
    process group runs its work on its own worker threads (gloo) or stream (NCCL), so a rank's
    collectives are split into *lanes* (a gloo group's pair of worker threads is one lane:
    ``_lane_ids``), and a lane's members are the ranks whose collectives end together with its own.
    Per other rank ``q``, the median distance from each of the lane's ends to ``q``'s nearest
    end; sorted, the members are the ranks before the first jump by ``INFER_RATIO`` (3x) or more
    (from at most ``INFER_TOL_NS``, 5 ms; distances under ``INFER_FLOOR_NS`` count as that) that
    also clears the members' own jitter: the first rank left out must typically (median) be
    farther than the members are in nearly every instance (their ``INFER_REACH_Q``-th
    percentile, 90th). The ranks of one instance finish it together, other groups ms apart; the
    ranks of one gloo group also finish in ring order, a fraction of a ms apart with ms of
    jitter on a loaded host, and the jitter test keeps that order from reading as two groups.
    No such jump: every rank.
    Ranks on several hosts (several clocks, any number of hosts): each host's clock shift
    against the first host's is found first (``_across_hosts``: hosts placed one at a time where
    their ends and the placed ranks' coincide best, then each shift corrected to the one under
    which the most lanes of the whole split are confirmed by their members), then the lanes are
    split once on the shifted ends; membership needs no common clock, only which ranks finish
    each instance of a sequence together. Hosts no shift places share no group with the others:
    they are split on their own clocks, unless a group would hold every rank of a host (one
    group spanning the hosts, as DDP, whose clocks were not lined up: job-wide). Lanes left
    without a group their members agree on are completed by whether ranks' collectives overlap
    in time (``_complete_partition``, ``group_fill``). Used when the lanes give a consistent split
    (each member's lane has the same members, and no group of one rank: a rank whose ends are
    apart from everyone's has a slow link, not a group of its own); otherwise every instance is
    ``"*"``, as before groups were known.

Point-to-point ``sendrecv`` instances of a recorded group of more than two ranks get no group
(null: left out of instance matching and clock alignment): a send pairs two ranks of a pipeline
group, not the whole group. Without recorded groups they get none either where the job's groups
were inferred (more than two ranks: matched job-wide by their order, they would pair a rank's
transfer with its peer's other one); otherwise they stay job-wide, as before.

``ordinal`` is renumbered per (group, collective type) in arrival order, so that the k-th
all-reduce of a tensor-parallel group is matched with the k-th of that group on its peers.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import numpy as np
import polars as pl

from kinetoscope.diagnosis import group_fill

JOB_WIDE = "*"
INFER_TOL_NS = 5_000_000
INFER_RATIO = 3.0
INFER_FLOOR_NS = 50_000
INFER_REACH_Q = 90.0
# Hosts' clocks are searched for an offset within this much of the first host's.
INFER_SKEW_NS = 2_000_000_000
# Ends of a lane scored per candidate host offset, and ranks per aligned host tried (cost bound).
_SHIFT_SAMPLE = 64
_SHIFT_RANKS = 8
_SHIFT_TRIES = 16
# A host's clock shift is corrected within this much of where it was placed, in these steps.
_REFINE_NS = 4_000_000
_REFINE_STEP_NS = 500_000
_REFINE_ROUNDS = 3
# Hosts that share no group are kept this far apart (ns) when split together: no end of one
# comes near another's.
_APART_NS = 10**13
# A lane needs this many instances to be placed by inference.
_MIN_LANE = 3
# Confirmed groups of more ranks than this are not tested for overlap (cost: every pair).
_REFUTE_MAX_RANKS = 64

# A rank's collectives as (arrivals, ends), in order of end (``_span``).
Span = tuple[np.ndarray, np.ndarray]


@dataclass
class GroupInfo:
    """The job's process groups: members per group key, how each was found, and notes."""

    members: dict[str, list[int]] = field(default_factory=dict)
    source: dict[str, str] = field(default_factory=dict)  # recorded | named | inferred | job
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> list[dict[str, object]]:
        return [
            {"group": g, "ranks": self.members[g], "source": self.source.get(g, "job")}
            for g in sorted(self.members, key=lambda g: (g != JOB_WIDE, len(self.members[g]), g))
        ]


def group_members(group: str, ranks: list[int]) -> list[int]:
    """The member ranks of a group key (``"*"``: ``ranks``)."""
    if group == JOB_WIDE:
        return list(ranks)
    return [int(x) for x in group.split(",") if x]


def assign_groups(
    colls: dict[int, pl.DataFrame], hosts: dict[int, str | None] | None = None
) -> tuple[dict[int, pl.DataFrame], GroupInfo]:
    """Every rank's collectives with a ``group`` column and ``ordinal`` renumbered per (group,
    type) (module docstring), and the job's groups."""
    ranks = sorted(colls)
    info = GroupInfo()
    everyone = ",".join(map(str, ranks))
    if not ranks:
        return colls, info
    recorded = _recorded(colls, everyone)
    lanes = _infer_lanes(colls, recorded, hosts or {}, info)
    pairs_only = len(ranks) > 2 and any(lanes.values())  # groups inferred: a send/recv is no job-wide
    out: dict[int, pl.DataFrame] = {}
    for r in ranks:
        c = colls[r]
        if c.is_empty():
            out[r] = c.with_columns(pl.lit(None, dtype=pl.String).alias("group"))
            continue
        g = pl.coalesce(
            pl.col("_rec"),
            pl.col("lane").replace_strict(lanes.get(r, {}), default=None, return_dtype=pl.String),
            pl.lit(JOB_WIDE),
        )
        src = recorded[r]
        for kind in ("recorded", "named"):
            for grp in src.filter(pl.col("_src") == kind)["_rec"].drop_nulls().unique().to_list():
                info.source.setdefault(grp, kind)
        c = src.with_columns(group=g).drop("_rec", "_src")
        c = c.with_columns(
            group=pl.when(pl.col("group") == everyone).then(pl.lit(JOB_WIDE)).otherwise(pl.col("group"))
        ).with_columns(
            # a send/recv pairs two ranks of its group, not the group: no group instance; nor a
            # job-wide one where the job's groups are known (it would pair transfers by order)
            group=pl.when(
                (pl.col("coll") == "sendrecv")
                & pl.when(pl.col("group") == JOB_WIDE)
                .then(pl.lit(pairs_only))
                .otherwise(pl.col("group").str.count_matches(",").gt(1))
            )
            .then(None)
            .otherwise(pl.col("group"))
        )
        c = c.sort("arrival", "end").with_columns(
            ordinal=pl.int_range(pl.len(), dtype=pl.Int64).over("group", "coll")
        )
        out[r] = c
    for c in out.values():
        for g in c["group"].drop_nulls().unique().to_list():
            info.members.setdefault(g, group_members(g, ranks))
            info.source.setdefault(g, "job" if g == JOB_WIDE else "inferred")
    return out, info


def _recorded(colls: dict[int, pl.DataFrame], everyone: str) -> dict[int, pl.DataFrame]:
    """Per rank, ``_rec``: the group's ranks where recorded, else where the group is named
    (members: the ranks with instances of that name), else null; ``_src`` says which."""
    del everyone
    named: dict[str, set[int]] = {}
    for r, c in colls.items():
        if c.is_empty():
            continue
        for pg in c.filter(pl.col("pg_ranks").is_null() & _has_name())["pg"].unique().to_list():
            named.setdefault(pg, set()).add(r)
    by_name = {pg: ",".join(map(str, sorted(rs))) for pg, rs in named.items()}
    out = {}
    for r, c in colls.items():
        if c.is_empty():
            out[r] = c
            continue
        name = pl.col("pg").replace_strict(by_name, default=None, return_dtype=pl.String)
        out[r] = c.with_columns(
            _rec=pl.coalesce(pl.col("pg_ranks"), pl.when(_has_name()).then(name)),
            _src=pl.when(pl.col("pg_ranks").is_not_null())
            .then(pl.lit("recorded"))
            .when(_has_name())
            .then(pl.lit("named")),
        )
    return out


def _has_name() -> pl.Expr:
    """The ``pg`` column holds a recorded group name (not a fallback: a stream or "default")."""
    return ~pl.col("pg").str.starts_with("stream ") & (pl.col("pg") != "default")


def _lane_ids(c: pl.DataFrame) -> dict[str, str]:
    """A rank's lanes, merged where they are one group's workers. Gloo runs each group's queue
    on a pair of threads its constructor creates one after the other, and groups are created
    one at a time, so of the threads that run collectives the two of one group are neighbours
    in thread-id order: with an even number of them, they are merged in pairs in that order.
    Thread ids come from one counter for the whole host, so other processes' threads fall
    between a pair (8 ranks starting at once on a loaded host: ids up to 12 apart). An odd
    number means a group's other thread ran nothing in the window: then only ids at most 2
    apart are merged, in pairs."""
    lanes = sorted(set(c["lane"].drop_nulls().to_list()))
    tids = sorted(int(x[4:]) for x in lanes if x.startswith("tid ") and x[4:].isdigit())
    out = {x: x for x in lanes}
    k = 0
    while k < len(tids):
        if k + 1 < len(tids) and (len(tids) % 2 == 0 or tids[k + 1] - tids[k] <= 2):
            out[f"tid {tids[k + 1]}"] = f"tid {tids[k]}"
            k += 2
        else:
            k += 1
    return out


def _infer_lanes(
    colls: dict[int, pl.DataFrame],
    recorded: dict[int, pl.DataFrame],
    hosts: dict[int, str | None],
    info: GroupInfo,
) -> dict[int, dict[str, str]]:
    """Per rank, lane -> inferred members (``"0,2,4"``) for the instances no trace names
    (module docstring), or {} when inference does not apply or does not give a consistent split."""
    ranks = sorted(colls)
    todo: dict[int, pl.DataFrame] = {}
    for r in ranks:
        c = recorded.get(r)
        if c is None or c.is_empty():
            continue
        u = c.filter(pl.col("_rec").is_null() & (pl.col("coll") != "sendrecv"))
        if u.height:
            merge = _lane_ids(u)
            todo[r] = u.with_columns(_lane=pl.col("lane").replace_strict(merge, default=pl.col("lane")))
    if len(todo) < 3:
        return {}
    by_host: dict[str | None, list[int]] = {}
    for r in sorted(todo):
        by_host.setdefault(hosts.get(r), []).append(r)
    if len(by_host) == 1:
        return _memberships(todo) or {}
    # no shift gives a split joining hosts (a job of one group, as DDP): job-wide, as on one host
    return _across_hosts(todo, by_host) or {}


def _memberships(todo: dict[int, pl.DataFrame], one_clock: bool = True) -> dict[int, dict[str, str]] | None:
    """Per rank, lane -> members for ranks on one clock (module docstring), or None when the
    lanes do not give a consistent split. ``one_clock``: the ranks share a host's clock (not
    shifted onto one by inference), so whether two ranks' collectives overlap can refute a
    group the ends read (``_complete_partition``)."""
    found, sizes = _split(todo)
    _complete_partition(found, todo, sizes, one_clock)
    return found if _consistent(found) else None


def _split(todo: dict[int, pl.DataFrame]) -> tuple[dict[int, dict[str, str]], dict[tuple[int, str], int]]:
    """Per rank, raw lane -> the members ``_lane_members`` finds (before completion and the
    consistency check), and each merged lane's instance count."""
    ends = {r: np.sort(t["end"].to_numpy()) for r, t in todo.items()}
    found: dict[int, dict[str, str]] = {}
    sizes: dict[tuple[int, str], int] = {}
    for r, t in todo.items():
        found[r] = {}
        for (lane,), sub in t.group_by("_lane"):
            if sub.height < _MIN_LANE:
                continue
            members = _lane_members(r, np.sort(sub["end"].to_numpy()), ends)
            sizes[(r, str(lane))] = sub.height
            for raw in sub["lane"].unique().to_list():
                found[r][raw] = members
    return found, sizes


def _agreement(todo: dict[int, pl.DataFrame], hosts: list[list[int]]) -> tuple[int, int]:
    """How well a split of ranks at trial clock shifts holds together: over the (rank, lane)s
    whose members every member confirms (holds the same set; groups of one and of every rank do
    not count), their other members, summed (a shift that lines a lane up with more of its
    group scores higher than one that pairs it with a single rank), and how many of those lanes
    join ranks of different hosts. Graded, so that a shift that puts one host right scores
    higher even while other hosts are still off."""
    found, _sizes = _split(todo)
    held = {r: set(v.values()) for r, v in found.items()}
    host_of = {r: k for k, rs in enumerate(hosts) for r in rs}
    n, ok, across = len(todo), 0, 0
    for lanes in found.values():
        for m in set(lanes.values()):
            qs = [int(x) for x in m.split(",")]
            if 1 < len(qs) < n and all(m in held.get(q, set()) for q in qs):
                ok += len(qs) - 1
                across += len({host_of.get(q) for q in qs}) > 1
    return ok, across


def _across_hosts(
    todo: dict[int, pl.DataFrame], by_host: dict[str | None, list[int]]
) -> dict[int, dict[str, str]] | None:
    """Memberships of ranks on several hosts (several clocks): first each host's clock shift
    (ns, against the first host's), then one split (``_memberships``) of every rank on the
    shifted ends. None when a host shares no group with the others or the split is not
    consistent.

    The shifts form a spanning tree from the first host: hosts are placed one at a time, each
    at the candidate shift (``_candidate_shifts``) under which its ranks' collectives and the
    placed ranks' coincide best (``_mismatch``). A host none of whose lanes comes near a placed
    rank's (it shares no group with the placed hosts) waits for the others and is tried again;
    when a round places none, inference gives up. No split is needed to place a host, so a
    group whose other members are on hosts not placed yet does not mislead it. Cost: per host,
    its candidates, each a comparison of lane ends with rank ends (linear in the placed ranks).
    Membership needs no common clock: only which ranks finish each instance of a sequence
    together (a shift off by whole steps lines up the same sequences).

    Hosts that no round places share no group with the placed ones (a pipeline whose hosts
    hold whole stages: only its transfers cross them). They are split on their own clocks,
    kept apart from each other (``_apart``)."""
    order = list(by_host)
    placed = {r: todo[r] for r in by_host[order[0]]}
    waiting = order[1:]
    while waiting:
        left = []
        for h in waiting:
            new = {q: todo[q] for q in by_host[h]}
            d = _host_shift(placed, new)
            if d is None:
                left.append(h)
            else:
                placed |= {q: _shifted(t, d) for q, t in new.items()}
        if len(left) == len(waiting):
            break
        waiting = left
    joined = [h for h in order if h not in waiting]
    placed = _refine(placed, [by_host[h] for h in joined])
    if not waiting:
        return _memberships(placed, one_clock=False)
    return _apart(placed, [by_host[h] for h in waiting], todo)


def _apart(
    placed: dict[int, pl.DataFrame], hosts: list[list[int]], todo: dict[int, pl.DataFrame]
) -> dict[int, dict[str, str]] | None:
    """Memberships when ``hosts`` share no group with the ``placed`` ranks or with each other:
    each is moved ``_APART_NS`` further from the others' clock, so no end of one coincides
    with another's, and the whole is split at once. None (job-wide) when a group holds every
    rank of one part: the ranks of a host that all finish together may be one group spanning
    the hosts (as DDP) whose clocks placement did not line up, and splitting it by host would
    make up groups."""
    moved = dict(placed)
    parts = [set(placed)]
    for k, rs in enumerate(hosts, 1):
        moved |= {q: _shifted(todo[q], -k * _APART_NS) for q in rs}
        parts.append(set(rs))
    found = _memberships(moved, one_clock=False)
    if found is None:
        return None
    groups = {frozenset(int(x) for x in m.split(",")) for lanes in found.values() for m in lanes.values()}
    return None if any(g == part for g in groups for part in parts) else found


def _shifted(t: pl.DataFrame, d: int) -> pl.DataFrame:
    """A rank's collectives on a clock ``d`` ns behind its own."""
    return t.with_columns(pl.col("arrival") - d, pl.col("end") - d)


def _refine(placed: dict[int, pl.DataFrame], hosts: list[list[int]]) -> dict[int, pl.DataFrame]:
    """The placed ranks with each host's shift (but the first's) corrected within
    ``_REFINE_NS`` in steps of ``_REFINE_STEP_NS``: collectives of one group end ms apart on
    gloo, so a host placed against a few ranks can be off by that much, and only the split of
    every rank says which of the nearby shifts puts the groups together (``_agreement``; ties:
    the shift as placed). Hosts in turn, ``_REFINE_ROUNDS`` rounds at most, until none moves.
    Not when the placed split confirms no group short of every rank (a job of one group, as
    DDP: its ends all coincide as placed, and moving hosts apart would only make up groups)."""
    steps = sorted(range(-_REFINE_NS, _REFINE_NS + 1, _REFINE_STEP_NS), key=abs)
    score = _agreement(placed, hosts)
    if not score[0]:
        return placed
    for _round in range(_REFINE_ROUNDS):
        moved = False
        for rs in hosts[1:]:
            for k in steps[1:]:
                trial = placed | {q: _shifted(placed[q], k) for q in rs}
                got = _agreement(trial, hosts)
                if got > score:
                    placed, score, moved = trial, got, True
        if not moved:
            break
    return placed


def _lanes_of(ranks: dict[int, pl.DataFrame]) -> list[tuple[int, np.ndarray]]:
    """(rank, sorted ends) of each lane of ``_MIN_LANE`` instances or more."""
    out = []
    for r, t in ranks.items():
        for _k, sub in t.group_by("_lane"):
            if sub.height >= _MIN_LANE:
                out.append((r, np.sort(sub["end"].to_numpy())))
    return out


def _host_shift(placed: dict[int, pl.DataFrame], new: dict[int, pl.DataFrame]) -> int | None:
    """The clock shift (ns) of a new host's ranks onto the placed ranks' clock: of the
    candidates, the one with the smallest ``_mismatch``; None when no lane then comes within
    ``INFER_TOL_NS`` of the other side (no group joins them)."""
    ends_p = {r: np.sort(t["end"].to_numpy()) for r, t in placed.items()}
    ends_n = {q: np.sort(t["end"].to_numpy()) for q, t in new.items()}
    lanes_p, lanes_n = _lanes_of(placed), _lanes_of(new)
    best: tuple[float, int] | None = None
    for d in _candidate_shifts(placed, new):
        cost, near = _mismatch(lanes_n, ends_p, -d)
        cost_p, near_p = _mismatch(lanes_p, ends_n, d)
        if near + near_p and (best is None or cost + cost_p < best[0]):
            best = (cost + cost_p, d)
    return None if best is None else best[1]


def _mismatch(lanes: list[tuple[int, np.ndarray]], ends: dict[int, np.ndarray], d: int) -> tuple[float, int]:
    """How far each lane's ends, moved by ``d``, are from the nearest ends of the rank of
    ``ends`` they coincide with best (median distance, capped at ``INFER_TOL_NS``: a lane whose
    group has no member there costs the cap whatever the shift), summed, and how many lanes
    come within the cap. The true shift lines every shared group up at once; a shift that
    lines one group up with another group's ends moves the others apart."""
    total, near = 0.0, 0
    for _r, lane in lanes:
        x = lane + d
        best = float(INFER_TOL_NS)
        for e in ends.values():
            if e.size == 0:
                continue
            best = min(best, float(np.median(_nearest_gaps(x, e))))
        total += best
        near += best < INFER_TOL_NS
    return total, near


def _candidate_shifts(placed: dict[int, pl.DataFrame], new: dict[int, pl.DataFrame]) -> list[int]:
    """Clock shifts to try for a new host's ranks: 0, then per (lane of a placed rank, new rank)
    pair its best shift, pairs of nearest ends first; at most ``_SHIFT_TRIES``."""
    ends = {q: np.sort(t["end"].to_numpy()) for q, t in new.items()}
    pairs: list[tuple[float, int]] = []
    for r in sorted(placed)[:_SHIFT_RANKS]:
        for _k, sub in placed[r].group_by("_lane"):
            if sub.height >= _MIN_LANE:
                lane = np.sort(sub["end"].to_numpy())
                pairs += [_best_shift(lane, e) for e in ends.values()]
    base = [0]
    for gap, d in sorted(pairs):
        if gap <= INFER_TOL_NS and d not in base:
            base.append(d)
    # a pair's best shift is off by the spread of its members' ends (ms on gloo): try around it
    steps = [k * INFER_TOL_NS // 10 for k in (0, -1, 1, -2, 2, -3, 3, -4, 4)]
    out = [0] + [d + k for d in base[1:_SHIFT_TRIES] for k in steps]
    return list(dict.fromkeys(out))


def _best_shift(lane: np.ndarray, e: np.ndarray) -> tuple[float, int]:
    """The offset ``d`` (ns, within ``INFER_SKEW_NS``) under which the lane's ends, moved by
    ``d``, fall nearest ends of ``e``, and the median distance then: the candidates are the
    ends of ``e`` near the lane's middle end (a member holds its counterpart)."""
    if e.size == 0 or lane.size == 0:
        return float("inf"), 0
    anchor = lane[lane.size // 2]
    cand = e[(e >= anchor - INFER_SKEW_NS) & (e <= anchor + INFER_SKEW_NS)] - anchor
    if cand.size == 0:
        return float("inf"), 0
    pts = lane[np.unique(np.linspace(0, lane.size - 1, min(lane.size, _SHIFT_SAMPLE)).astype(np.int64))]
    x = pts[None, :] + cand[:, None]
    gap = _nearest_gaps(x, e)
    med = np.median(gap, axis=1)
    # shifts by whole steps line the lane up with later steps as well: the true one overlaps
    # most (the ranks' traces cover about the same time), so the truncated mean decides
    k = int(np.argmin(np.minimum(gap, INFER_TOL_NS).mean(axis=1)))
    return float(med[k]), int(cand[k])


def _lane_members(r: int, lane_ends: np.ndarray, ends: dict[int, np.ndarray]) -> str:
    """The ranks whose collective ends coincide with the lane's (module docstring), with ``r``.

    Only the lane's ends within ``q``'s trace window (its first to last end, widened by
    ``INFER_TOL_NS``) are measured against ``q``: windows that start apart (each rank's trace
    started when its request arrived) hold the lane's other ends where ``q`` traced nothing,
    and read as far. A rank whose window holds none of the lane's ends cannot be told apart: it
    joins the lane when every rank measured does (no jump: every rank)."""
    score: dict[int, tuple[float, float]] = {}  # q -> (median distance, INFER_REACH_Q-th percentile)
    unseen: set[int] = set()
    for q, e in ends.items():
        if q == r or e.size == 0:
            continue
        inside = lane_ends[(lane_ends >= e[0] - INFER_TOL_NS) & (lane_ends <= e[-1] + INFER_TOL_NS)]
        if inside.size == 0:
            unseen.add(q)
            continue
        gap = _nearest_gaps(inside, e)
        score[q] = (float(np.median(gap)), float(np.percentile(gap, INFER_REACH_Q)))
    if not score:
        return ",".join(map(str, sorted({r, *unseen})))
    order = sorted(score.items(), key=lambda kv: kv[1][0])
    members, reach = {r}, 0.0
    for k, (q, (v, q_reach)) in enumerate(order):
        members.add(q)
        reach = max(reach, q_reach)
        nxt = order[k + 1][1][0] if k + 1 < len(order) else None
        if (
            nxt is not None
            and v <= INFER_TOL_NS
            and nxt >= INFER_RATIO * max(v, INFER_FLOOR_NS)
            and nxt > reach
        ):
            return ",".join(map(str, sorted(members)))
    return ",".join(map(str, sorted({r, *score, *unseen})))


def _nearest_gaps(x: np.ndarray, e: np.ndarray) -> np.ndarray:
    """Per time in ``x`` (any shape), the distance to the nearest of the sorted ends ``e``
    (non-empty)."""
    if e.size == 1:
        gap: np.ndarray = np.abs(e[0] - x)
        return gap
    pos = np.clip(np.searchsorted(e, x), 1, e.size - 1)
    gap = np.minimum(np.abs(e[pos] - x), np.abs(e[pos - 1] - x))
    return gap


def _complete_partition(
    found: dict[int, dict[str, str]],
    todo: dict[int, pl.DataFrame],
    sizes: dict[tuple[int, str], int],
    one_clock: bool,
) -> None:
    """Give the lanes left without a confirmed group (a set every member holds) the one group
    their ranks can still form (``group_fill``: every pair of a group holds each instance at
    once, their collectives overlap in time; of the splits that allow, the one whose ends are
    closest). When the confirmed groups of lanes of that many instances (within 20 %) all have
    ``k`` ranks, the ranks left split into groups of ``k`` (groups of one mesh dimension whose
    ends fell close to another group's). On one clock a confirmed group two of whose members'
    collectives do not overlap is no group (``_refuted``: every member read every rank, as far
    apart as their own group's ends fell); when no confirmed group of that size is left, the
    ranks split into the largest equal groups that overlap, if that is more than one group (when
    every pair overlaps, nothing tells the ranks apart and their lanes' readings stand). Mutates
    ``found``."""
    held = {r: set(v.values()) for r, v in found.items()}
    confirmed = {
        m for v in held.values() for m in v if all(m in held.get(int(q), set()) for q in m.split(","))
    }
    lane_of = {r: dict(zip(t["lane"].to_list(), t["_lane"].to_list(), strict=True)) for r, t in todo.items()}
    if one_clock:
        confirmed = {m for m in confirmed if not _refuted(todo, found, lane_of, m)}
    pending: list[tuple[int, str, int]] = []
    by_size: list[tuple[int, str]] = []
    for r, lanes in found.items():
        for raw, m in lanes.items():
            n = sizes.get((r, str(lane_of[r].get(raw, raw))), 0)
            (by_size.append((n, m)) if m in confirmed else pending.append((r, raw, n)))
    for n in sorted({p[2] for p in pending}):
        near = {m for k, m in by_size if abs(k - n) <= 0.2 * max(k, n)}
        left = sorted({r for r, _raw, k in pending if k == n} - {int(q) for m in near for q in m.split(",")})
        ks = {len(m.split(",")) for m in near}
        if len(left) < 2 or len(ks) > 1 or not (ks or one_clock):
            continue
        unconfirmed = {
            r: {lane_of[r].get(raw, raw) for q, raw, k in pending if q == r and k == n} for r in left
        }
        split = _fill_groups(todo, unconfirmed, ks.pop() if ks else None) or []
        if len(split) < 2 and not near:
            continue  # nothing ruled the ranks left apart: their own readings stand
        for members in split:
            group = ",".join(map(str, members))
            for r, raw, k in pending:
                if k == n and r in members:
                    found[r][raw] = group


def _refuted(
    todo: dict[int, pl.DataFrame],
    found: dict[int, dict[str, str]],
    lane_of: dict[int, dict[str, str]],
    m: str,
) -> bool:
    """Whether two members of the confirmed group ``m`` do not hold its instances at once (the
    lanes of each that read ``m`` against the other's collectives: ``group_fill.holds``).
    Groups of more than ``_REFUTE_MAX_RANKS`` are not tested (cost: every pair)."""
    members = [int(q) for q in m.split(",")]
    if len(members) > _REFUTE_MAX_RANKS:
        return False
    lanes = {r: {lane_of[r].get(raw, raw) for raw, g in found[r].items() if g == m} for r in members}
    own, every = _spans(todo, lanes)
    return not all(_overlap(own, every, r, q) for r, q in itertools.combinations(members, 2))


def _fill_groups(
    todo: dict[int, pl.DataFrame], lanes: dict[int, set[str]], k: int | None
) -> list[list[int]] | None:
    """The ranks of ``lanes`` (each with its unconfirmed lanes) split into groups of ``k``, or
    of the largest size that fits when ``k`` is None (``group_fill``): every pair's intervals
    overlap, least total distance between ends."""
    feasible, cost = _pairs(todo, lanes)
    if k is None:
        return group_fill.split_largest(sorted(lanes), feasible, cost)
    return group_fill.split_equal(sorted(lanes), k, feasible, cost)


def _pairs(
    todo: dict[int, pl.DataFrame], lanes: dict[int, set[str]]
) -> tuple[set[frozenset[int]], dict[frozenset[int], float]]:
    """The feasible pairs of the ranks of ``lanes`` (``_overlap``), and per feasible pair the
    larger median distance from one side's lane ends to the other's nearest ends."""
    own, every = _spans(todo, lanes)
    feasible: set[frozenset[int]] = set()
    cost: dict[frozenset[int], float] = {}
    for r, q in itertools.combinations(sorted(lanes), 2):
        if _overlap(own, every, r, q):
            pair = frozenset((r, q))
            feasible.add(pair)
            cost[pair] = max(
                float(np.median(_nearest_gaps(own[a][1], every[b][1]))) for a, b in ((r, q), (q, r))
            )
    return feasible, cost


def _spans(
    todo: dict[int, pl.DataFrame], lanes: dict[int, set[str]]
) -> tuple[dict[int, Span], dict[int, Span]]:
    """Per rank of ``lanes``: the spans (``_span``) of its given lanes, and of all its collectives."""
    own = {r: _span(todo[r].filter(pl.col("_lane").is_in(list(ls)))) for r, ls in lanes.items()}
    every = {r: _span(todo[r]) for r in lanes}
    return own, every


def _overlap(own: dict[int, Span], every: dict[int, Span], r: int, q: int) -> bool:
    """Whether each of ``r`` and ``q`` holds its lanes' instances at once with the other: its
    lanes' intervals overlap the other's collectives, both ways (``group_fill.holds``)."""
    return group_fill.holds(*own[r], *every[q]) and group_fill.holds(*own[q], *every[r])


def _span(t: pl.DataFrame) -> Span:
    """Arrivals and ends of a rank's collectives, in order of end (sorted once per rank: the
    nearest-end distances need sorted ends)."""
    t = t.sort("end")
    return t["arrival"].to_numpy(), t["end"].to_numpy()


def _consistent(found: dict[int, dict[str, str]]) -> bool:
    """Every inferred member set has two ranks or more (a rank whose collectives end apart from
    everyone's has a slow link or stalls: no group of one) and is held, with the same members,
    by each of its members."""
    sets = {r: set(v.values()) for r, v in found.items()}
    for lanes in found.values():
        for members in set(lanes.values()):
            if "," not in members:
                return False
            for q in (int(x) for x in members.split(",")):
                if q in sets and members not in sets[q]:
                    return False
    return True
