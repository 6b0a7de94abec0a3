"""Attribution by what-if per collective instance: the instance matrix, who was waited for and
how long (one *round*, with a set of ranks fixed), and the arrival noise.

Definitions (``docs/diagnosis.md`` §5): the *typical arrival* is the lower median of the ranks'
arrivals at an instance; the *last group* the ranks within ``tie`` of the last arrival; a rank of
it *imposes* ``(last - next-latest outside the group) / |group|``; a *fixed* rank arrives like the
typical rank of the ranks not fixed (the what-if)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import polars as pl


def binom_sf(k: int, n: int, p: float) -> float:
    """One-sided binomial test: ``P(X >= k)`` for ``X ~ Binomial(n, p)`` (log-space sum)."""
    if k <= 0:
        return 1.0
    if k > n or p <= 0.0:
        return 0.0
    if p >= 1.0:
        return 1.0
    lp, lq = math.log(p), math.log1p(-p)
    base = math.lgamma(n + 1)
    terms = [
        base - math.lgamma(j + 1) - math.lgamma(n - j + 1) + j * lp + (n - j) * lq for j in range(k, n + 1)
    ]
    top = max(terms)
    return min(1.0, math.exp(top) * sum(math.exp(t - top) for t in terms))


def max_by_group(groups: np.ndarray, starts: np.ndarray, ends: np.ndarray, n_groups: int) -> np.ndarray:
    """The longest ``[start, end)`` per group id (``0..n_groups-1``); 0 for a group with none."""
    out = np.zeros(n_groups, dtype=np.float64)
    np.maximum.at(out, groups, np.clip(ends.astype(np.float64) - starts, 0, None))
    return out


def union_by_group(groups: np.ndarray, starts: np.ndarray, ends: np.ndarray, n_groups: int) -> np.ndarray:
    """Length of the union of ``[start, end)`` per group id (``0..n_groups-1``); empty intervals
    are ignored. Vectorised: one sort, a running maximum of the ends within each group."""
    out = np.zeros(n_groups, dtype=np.float64)
    ok = ends > starts
    if not ok.any():
        return out
    g, s, e = groups[ok], starts[ok].astype(np.float64), ends[ok].astype(np.float64)
    order = np.lexsort((s, g))
    g, s, e = g[order], s[order], e[order]
    first = np.ones(g.size, dtype=bool)
    first[1:] = g[1:] != g[:-1]
    # running maximum of the ends, restarted at each group: shift each group above the last
    lo = float(min(s.min(), e.min()))
    span = float(max(s.max(), e.max())) - lo + 1.0
    rank = np.cumsum(first) - 1
    key = (e - lo) + rank * span
    top = np.maximum.accumulate(key)
    at = np.maximum.accumulate(np.where(key >= top, np.arange(key.size), 0))
    run = e[at]  # the running maximum itself, not a value rebuilt from the shifted one
    prev = np.concatenate(([-np.inf], run[:-1]))
    prev[first] = -np.inf
    np.add.at(out, g, np.clip(e - np.maximum(s, prev), 0, None))
    return out


def noise_sigma(instances: pl.DataFrame) -> float:
    """Arrival jitter (ns): ``1.4826 x`` the median, over all (rank, instance), of the absolute
    deviation of the rank's skew from its own median skew, where a skew is the arrival minus the
    instance's *median* arrival. Centering on each rank's median removes a persistent straggler's
    steady offset; pooling the ranks and using the median arrival keeps the estimate defined
    with two ranks (the lower-median skew of the earlier of two ranks is always 0)."""
    inst = instances.filter(pl.col("n_ranks") > 1)
    if inst.is_empty():
        return 0.0
    dev = (
        inst.with_columns(
            s=(pl.col("arrival") - pl.col("arrival").median().over("instance")).cast(pl.Float64)
        ).with_columns(c=(pl.col("s") - pl.col("s").median().over("rank")).abs())
    )["c"]
    return float(1.4826 * float(dev.median())) if dev.len() else 0.0  # type: ignore[arg-type]


@dataclass
class Matrix:
    """Complete instances as arrays: ``A[i, j]`` arrival (ns) of rank ``ranks[j]`` at instance
    ``i``; ``step_idx[i]`` index into ``steps``; ``m[i]`` typical arrival."""

    ranks: list[int]
    steps: list[int]
    A: np.ndarray
    step_idx: np.ndarray
    m: np.ndarray
    E: np.ndarray | None = None  # collective end (ns) per [instance, rank], same order as A
    host_issued: bool = False  # arrivals are host issue times (gloo, host ops), not kernel starts
    # bool [instance, rank]: the rank is a member of the instance's process group. None: every
    # rank is (job-wide collectives). A non-member's cell holds the earliest member arrival (and
    # the members' median end), so it is never last nor moves the typical arrival ``m``.
    member: np.ndarray | None = None

    def chance_last(self, free: np.ndarray, size: np.ndarray) -> np.ndarray:
        """Per instance, the chance that a given free member is in the last group: ``|G_i| /
        (free members of instance i)``; ``free``: bool [rank] not fixed."""
        mem = self.member if self.member is not None else np.ones(self.A.shape, dtype=bool)
        n_free = np.maximum((mem & free[None, :]).sum(axis=1), 1)
        out: np.ndarray = np.minimum(size / n_free, 1.0)
        return out

    def per_step(self, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
        """A step's wait from its instances' intervals ``[start, end)``.

        Kernel arrivals (NCCL): one stream runs the collectives in turn, so a wait delays every
        later instance and the step loses the union of the intervals. Host issue times (gloo):
        the training thread issues every bucket without waiting (DDP waits once, at the end of
        backward), so a late rank is late by its running delay at each instance and the step
        loses the largest interval, not their sum (a rank 0.4 ms behind at four buckets 0.5 ms
        apart costs 0.4 ms, not 1.6 ms)."""
        group = max_by_group if self.host_issued else union_by_group
        return group(self.step_idx, starts, ends, len(self.steps))


def build_matrix(
    inst: pl.DataFrame, ranks: list[int], steps: list[int], host_issued: bool = False
) -> tuple[Matrix, int]:
    """The complete-instance matrix, and how many partial instances were left out.
    An instance is complete when every member of its process group among ``ranks`` arrived
    (``group_size``; without it, every rank). ``host_issued``: the arrivals are host issue
    times (``Matrix.per_step``)."""
    n = len(ranks)
    if "group_size" not in inst.columns:
        inst = inst.with_columns(pl.lit(n, dtype=pl.Int64).alias("group_size"))
    if "group" not in inst.columns:
        inst = inst.with_columns(pl.lit("*").alias("group"))
    job_wide = pl.col("group").fill_null("*") == "*"
    inst = inst.with_columns(
        group_size=pl.when(job_wide)
        .then(pl.lit(n, dtype=pl.Int64))
        .otherwise(pl.col("group_size").clip(upper_bound=n))
    )
    per = inst.group_by("instance").agg(
        pl.len().alias("_n"), pl.col("step").first(), pl.col("group_size").first()
    )
    complete = per.filter(pl.col("_n") >= pl.col("group_size"))
    partial = per.height - complete.height
    sub = inst.filter(pl.col("instance").is_in(complete["instance"].implode()))
    wide = sub.pivot(
        on="rank", index=["instance", "step"], values="arrival", aggregate_function="first"
    ).sort("step", "instance")
    if wide.is_empty():
        empty = np.zeros(0, np.int64)
        return Matrix(
            ranks, steps, np.zeros((0, n), np.int64), empty, empty, host_issued=host_issued
        ), partial
    cols = [
        wide[str(r)].to_numpy() if str(r) in wide.columns else np.full(wide.height, np.nan) for r in ranks
    ]
    Af = np.column_stack([c.astype(np.float64) for c in cols])
    member = ~np.isnan(Af)
    full = bool(member.all())
    m = _lower_median(Af, member)
    if not full:
        first = np.where(member, Af, np.inf).min(axis=1)
        Af = np.where(member, Af, first[:, None])
    A = Af.astype(np.int64)
    pos = {s: k for k, s in enumerate(steps)}
    step_idx = np.array([pos[s] for s in wide["step"].to_list()], dtype=np.int64)
    E = None
    if "end" in sub.columns:
        ew = sub.pivot(on="rank", index=["instance", "step"], values="end", aggregate_function="first").sort(
            "step", "instance"
        )
        Ef = np.column_stack(
            [
                ew[str(r)].to_numpy().astype(np.float64)
                if str(r) in ew.columns
                else np.full(ew.height, np.nan)
                for r in ranks
            ]
        )
        if not full:
            med = np.nanmedian(np.where(member, Ef, np.nan), axis=1)
            Ef = np.where(member, Ef, med[:, None])
        E = Ef.astype(np.int64)
    return Matrix(ranks, steps, A, step_idx, m, E, host_issued, None if full else member), partial


def _lower_median(A: np.ndarray, member: np.ndarray) -> np.ndarray:
    """Per row, the lower median of the members' values (int64)."""
    srt = np.sort(np.where(member, A, np.inf), axis=1)
    k = (member.sum(axis=1) - 1) // 2
    val = srt[np.arange(A.shape[0]), np.maximum(k, 0)]
    out: np.ndarray = np.where(np.isfinite(val), val, 0.0).astype(np.int64)  # no member: 0 (unused)
    return out


@dataclass
class Round:
    """Attribution with the set ``fixed`` arriving like the typical rank."""

    last: np.ndarray  # bool [inst, rank]: in the last group
    imposed: np.ndarray  # float [inst, rank] (ns)
    step_imposed: np.ndarray  # float [step, rank] (ns): per step (``Matrix.per_step``)
    waiting: np.ndarray  # float [step] (ns): [m, L] per step (``Matrix.per_step``)
    p0: float
    free: int  # ranks not fixed: the chance of being last is 1 / free without ties
    chance: np.ndarray | None = None  # float [inst]: a free member's chance of being last (groups)


def attribution_round(
    mx: Matrix, fixed: set[int], tie_ns: float, keep: frozenset[int] = frozenset()
) -> Round:
    """Who each instance waits for with ``fixed`` arriving like the typical rank. ``keep``: ranks
    that keep their own arrivals but are never waited for, like fixed ones (a rank named for its
    stalls, read in the steps without them: there it has nothing to fix, and moving it to the
    typical arrival would credit its ordinary jitter to the ranks still free)."""
    n_inst, n = mx.A.shape
    A = fixed_arrivals(mx, fixed)
    L = A.max(axis=1)
    last = A >= (L - tie_ns)[:, None]
    out = fixed | keep
    last[:, [j for j, r in enumerate(mx.ranks) if r in out]] = False  # fixed or kept: never waited for
    last[last.all(axis=1)] = False  # all ranks arrived together: nobody was waited for
    others = np.where(last, -np.inf, A).max(axis=1)
    others = np.where(np.isfinite(others), others, mx.m.astype(np.float64))
    size = last.sum(axis=1)
    imposed = np.where(last, ((L - others) / np.maximum(size, 1))[:, None], 0.0)
    n_steps = len(mx.steps)
    step_imposed = np.zeros((n_steps, n))
    for j in range(n):
        step_imposed[:, j] = mx.per_step(L - imposed[:, j], L)
    waiting = mx.per_step(mx.m.astype(np.float64), L)
    free = max(n - len(out & set(mx.ranks)), 1)  # fixed ranks arrive like the typical rank: never last
    if mx.member is not None and n_inst:
        # a member's chance of being last is the group's, not the job's (a 4-rank group of 64)
        free_mask = np.array([r not in out for r in mx.ranks], dtype=bool)
        p0 = float(mx.chance_last(free_mask, size.astype(np.float64)).mean()) if size.any() else 1.0 / free
    else:
        p0 = float(size.mean()) / free if n_inst and size.any() else 1.0 / free
    return Round(
        last,
        imposed,
        step_imposed,
        waiting,
        min(p0, 1.0),
        free,
        chance=None
        if mx.member is None
        else mx.chance_last(np.array([r not in out for r in mx.ranks], dtype=bool), size.astype(np.float64)),
    )


def fixed_arrivals(mx: Matrix, fixed: set[int]) -> np.ndarray:
    """Arrivals (float ns) with each rank of ``fixed`` arriving no later than the typical rank
    of the others: the lower median of the ranks not fixed. With few ranks the median of all
    ranks can be a second straggler's arrival (3 ranks, 2 late): fixing one straggler at it
    would leave it tied last with the other instead of arriving like the punctual ranks."""
    A = mx.A.astype(np.float64).copy()
    cols = [j for j, r in enumerate(mx.ranks) if r in fixed]
    free = [j for j in range(A.shape[1]) if j not in cols]
    if not cols or A.shape[0] == 0:
        return A  # type: ignore[no-any-return]  # numpy's astype().copy() is typed Any
    # every rank fixed: all arrive like the typical rank of the job (nobody waits)
    k = (len(free) - 1) // 2
    if mx.member is not None and free:
        mem = mx.member[:, free]
        typ = np.where(
            mem.any(axis=1), _lower_median(A[:, free], mem).astype(np.float64), mx.m.astype(np.float64)
        )
    else:
        typ = np.partition(A[:, free], k, axis=1)[:, k] if free else mx.m.astype(np.float64)
    A[:, cols] = np.minimum(A[:, cols], typ[:, None])
    return A  # type: ignore[no-any-return]  # (as above)


def last_fixed(mx: Matrix, fixed: set[int]) -> np.ndarray:
    """Per instance: the last arrival (ns, float) with ``fixed`` arriving like the typical rank
    of the others (``fixed_arrivals``), i.e. when the instance would complete: the latest of the
    other ranks, since a fixed rank arrives no later than their median (every rank fixed: the
    typical arrival). Without the median, so that comparing many sets stays cheap."""
    free = np.array([r not in fixed for r in mx.ranks], dtype=bool)
    if not free.any():
        return mx.m.astype(np.float64)
    return mx.A[:, free].max(axis=1).astype(np.float64)  # type: ignore[no-any-return]


def saving_fixed(mx: Matrix, before: set[int], after: set[int], *, from_median: bool = False) -> np.ndarray:
    """Per step (ns): how much less the job waits with the ranks of ``after`` (a superset of
    ``before``) arriving like the typical rank of the others than with only ``before`` so: the
    waiting from the typical arrival ``m`` to the instances' last arrival, with ``before`` fixed
    minus with ``after`` fixed (``Matrix.per_step``).

    When ``after`` holds most of the ranks, the others' typical arrival comes before ``m`` (3
    ranks, 2 late: ``m`` is a late rank's arrival): the saving then runs from where the instance
    would complete, since measured from ``m`` it would leave out what the punctual ranks wait.
    ``from_median`` measures it from ``m`` all the same: the naming filters use that, because
    the others' typical is then the earliest few ranks', and any majority set of a noisy job
    would seem to save the jitter between them."""
    return saving_between(mx, last_fixed(mx, before), last_fixed(mx, after), from_median=from_median)


def saving_between(
    mx: Matrix, last_before: np.ndarray, last_after: np.ndarray, *, from_median: bool = False
) -> np.ndarray:
    """``saving_fixed`` from the two sets' completions (``last_fixed``), computed once each
    where many sets are compared (``stragglers.tables.lost_shares``)."""
    m = mx.m.astype(np.float64)
    ref = m if from_median else np.minimum(m, last_after)
    saved: np.ndarray = np.clip(mx.per_step(ref, last_before) - mx.per_step(ref, last_after), 0, None)
    return saved
