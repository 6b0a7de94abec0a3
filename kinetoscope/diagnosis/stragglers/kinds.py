"""One taxonomy of straggler kinds, from who was late in which steps.

Used by the verdict (on the steps the what-if replay finds each rank late in,
``stragglers.reconcile``) and by the accuracy benchmark's labels (on the steps each rank was made to
stall in, from the injection log), so that both speak of the same thing. Terms:

late steps of a rank
    the steps in which that rank alone held the step back (the verdict: it alone costs a share
    of the step, ``stragglers.replay_report.LATE_COST``, and half of what it costs in its worst step;
    a label: it was made to stall in that step).
persistent rank
    late in more than half of the steps (at least two, or the only step of a one-step trace).
    One step cannot tell a steady delay from a stall, so there the verdict judges a rank by its
    collectives instead, as the rules do (``stragglers.reconcile._kinds_by_collectives``).
stall
    one (rank, step) late pair of a rank that is not persistent.
rotating
    the slowdown moves between ranks: ``MIN_STALLS`` stalls or more, in ``MIN_STALLS`` distinct
    steps or more, on two ranks or more, none persistent, no rank holding more than
    ``ROTATING_MAX_SHARE`` of the stalls (no one rank explains most of it: each is late in only a
    few of the steps), and each stalled step held back by one rank mostly (at most
    ``TOGETHER_MAX_SHARE`` of the stalls share their step with another rank's: ranks late in the
    same steps are late together, a slow group, not a rotation). What hierarchical SGD is for:
    no rank can be fixed or replaced.
intermittent
    a specific small set of ranks late in some steps: stalls that are not rotating.
mixed
    persistent ranks and intermittent ones in one job.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

MIN_STALLS = 3  # a pattern of stalls: fewer are one or two isolated events
ROTATING_MAX_SHARE = 2 / 3  # rotating: no rank holds more than two thirds of the stalls ...
TOGETHER_MAX_SHARE = 1 / 3  # ... and at most a third of them share their step with another rank's


def rank_kind(late_steps: int, n_steps: int) -> str:
    """``persistent`` (late in more than half of ``n_steps``; two steps or more, or the only step)
    or ``intermittent``."""
    if n_steps <= 0:
        return "intermittent"
    if 2 * late_steps > n_steps and (late_steps >= 2 or n_steps == 1):
        return "persistent"
    return "intermittent"


def is_rotating(late: Mapping[int, Collection[int]]) -> bool:
    """Whether the stalls ``late`` (rank -> steps it stalled in; no persistent rank) move between
    ranks (module docstring)."""
    sets = [set(s) for s in late.values() if s]
    counts = [len(s) for s in sets]
    total = sum(counts)
    steps = {s for v in sets for s in v}
    together = sum(
        1 for i, a in enumerate(sets) for k in a if any(k in b for j, b in enumerate(sets) if j != i)
    )
    return (
        len(counts) >= 2
        and total >= MIN_STALLS
        and len(steps) >= MIN_STALLS
        and max(counts) <= ROTATING_MAX_SHARE * total
        and together <= TOGETHER_MAX_SHARE * total
    )


def job_kind(late: Mapping[int, Collection[int]], n_steps: int) -> str:
    """The kind of a job whose ranks were late in these steps (rank -> steps; ranks never late
    may be left out): ``none``, ``persistent``, ``mixed``, ``rotating`` or ``intermittent``."""
    late = {r: set(s) for r, s in late.items() if s}
    if not late:
        return "none"
    kinds = {r: rank_kind(len(s), n_steps) for r, s in late.items()}
    if all(k == "persistent" for k in kinds.values()):
        return "persistent"
    if "persistent" in kinds.values():
        return "mixed"
    return "rotating" if is_rotating(late) else "intermittent"
