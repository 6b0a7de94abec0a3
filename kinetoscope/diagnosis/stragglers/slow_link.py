"""Slow link: a rank whose own collectives end late after its peers' (its transfer completes
late on its side), found from end skew rather than from arrivals (``docs/diagnosis.md`` §5)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from kinetoscope.diagnosis.attribution import Matrix, binom_sf
from kinetoscope.diagnosis.stragglers.model import StragglerThresholds


@dataclass
class SlowLink:
    """End-skew evidence of one rank (``find_slow_links``); times in ns."""

    rank: int
    late: int  # instances where it ended beyond the threshold after its peers
    events: int  # instances where any rank did
    instances: int
    world: int
    p: float
    excess_ns: float  # summed end excess at its late instances
    threshold_ns: float
    late_steps: np.ndarray  # bool [step]
    per_step_ns: np.ndarray  # float [step]: its end excess per step


def end_skew(mx: Matrix) -> np.ndarray:
    """``S[i, j]``: rank ``j``'s collective end at instance ``i`` minus the median end of the
    instance's ranks (ns)."""
    assert mx.E is not None
    return mx.E.astype(np.float64) - np.median(mx.E.astype(np.float64), axis=1)[:, None]


def find_slow_links(mx: Matrix, th: StragglerThresholds, total_T: float, skip: set[int]) -> list[SlowLink]:
    """Ranks whose collectives end late after their peers' (slow link / its collectives'
    transfer), most excess first.

    A rank is named when it ends beyond ``max(k_sigma x sigma_end, link_floor_us)`` after the
    instance's median end (``sigma_end`` = 1.4826 x MAD of the members' end skews) at ``late``
    of the ``events`` instances of its own process groups where some member did, far more often
    than chance (binomial against the mean of ``1/members`` over those instances: ``1/N`` for
    job-wide collectives, ``1/2`` for a data-parallel pair; ``p < alpha / N``, Bonferroni over
    the N ranks tested, since the most extreme of N noisy ranks is tested), at ``min_events``
    instances or more, and its *net* end excess (the late ends' excess less what it ends early
    beyond the same threshold elsewhere) is at least
    ``link_min_effect`` of the summed step time. A slow link's tail only ever ends late; ends
    that are as often as much early are instances matched crosswise (two buckets whose order
    differs between ranks: +x at one, -x at the next), not a link. Needs ``link_min_ranks`` ranks: with two
    ranks and unknown clocks, the clocks are aligned on collective ends, so a late end is
    indistinguishable from a clock offset, and the median end is not a peer's end."""
    n_inst, n = mx.A.shape
    if mx.E is None or n < th.link_min_ranks or n_inst == 0 or total_T <= 0:
        return []
    S = end_skew(mx)
    mem = mx.member if mx.member is not None else np.ones(S.shape, dtype=bool)
    own = S[mem]
    sigma = 1.4826 * float(np.median(np.abs(own - np.median(own))))
    thr = max(th.k_sigma * sigma, th.link_floor_us * 1000.0)
    late = (S >= thr) & mem
    early = (S <= -thr) & mem
    any_late = late.any(axis=1)
    chance = 1.0 / np.maximum(mem.sum(axis=1), 1)  # one of the instance's members ends last
    out = []
    for j, r in enumerate(mx.ranks):
        k = int(late[:, j].sum())
        if r in skip or k < th.min_events:
            continue
        seen = any_late & mem[:, j]  # late ends at instances of its own groups
        events = int(seen.sum())
        p = binom_sf(k, events, float(chance[seen].mean()))
        excess = float(S[late[:, j], j].sum())
        net = excess + float(S[early[:, j], j].sum())
        if p < th.alpha / n and net >= th.link_min_effect * total_T:  # Bonferroni over the ranks
            per_step = np.bincount(mx.step_idx[late[:, j]], weights=S[late[:, j], j], minlength=len(mx.steps))
            out.append(SlowLink(r, k, events, n_inst, n, p, excess, thr, per_step > 0, per_step))
    return sorted(out, key=lambda x: -x.excess_ns)


def link_cause(sl: SlowLink, n_steps: int, total_T: float) -> dict[str, Any]:
    """The cause record (``rank_cause`` shape) of a rank named for its late collective ends."""
    per_step = sl.excess_ns / max(n_steps, 1) / 1e6
    return {
        "lateness_ms_per_step": round(per_step, 3),
        "components": {
            "slow_link": {
                "late_ends": sl.late,
                "instances": sl.instances,
                "excess_ms": round(per_step, 3),
                "share_of_step": round(sl.excess_ns / total_T, 4),
                "p_value": sl.p,
                "threshold_ms": round(sl.threshold_ns / 1e6, 3),
            }
        },
        "explained_by": "slow_link",
        "text": (
            f"slow link / its collectives' transfer: its collectives end {per_step:.1f} ms per step after "
            f"its peers' ({100 * sl.excess_ns / total_T:.1f}% of step time), beyond "
            f"{sl.threshold_ns / 1e6:.2f} ms at {sl.late}/{sl.instances} collectives "
            f"({sl.late} of the {sl.events} late ends, p={sl.p:.2g})"
        ),
    }
