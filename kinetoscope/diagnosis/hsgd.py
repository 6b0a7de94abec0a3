"""A hierarchical-SGD plan computed from the job's topology and its stragglers (seed 000).

Hierarchical SGD (PyTorch's ``PostLocalSGDState`` + ``HierarchicalModelAverager``, upstreamed by
Cruise) lets a random straggler delay only a small group instead of every rank. The rule, from
the PyTorch straggler-mitigation post:

* after ``warmup_steps`` of ordinary synchronous steps, each host's ranks still average
  gradients every step (``PostLocalSGDState(subgroup=None)``: one subgroup per host);
* above that, groups of 2, 4, 8 ... hosts average parameters every 2, 4, 8 ... steps, the top
  level being the whole world: ``period_group_size_dict = {2: 2h, 4: 4h, ..., P: W}`` for
  ``h`` ranks per host and ``W`` ranks (``H = W / h`` hosts; the last period is the smallest
  power of two ``>= H``). 2 hosts x 4 ranks: ``{2: 8}``; 4 x 2: ``{2: 4, 4: 8}``;
* ``warmup_steps = 1000`` (the post's "do not run hierarchical SGD until 1K steps for model
  parity"; the warm-up should at least cover the steep start of the loss curve).

Expected gain (an estimate with the post's limits): on a straggled step a random straggler
stalls its host group (``h`` ranks) rather than all ``W``, so at most ``lost · (1 − h / W)`` of
the step time comes back (``lost``: the measured share of step time lost to stragglers). It
costs the overlap of gradient all-reduce with backward that DDP had: parameter averaging runs
after the step, so the communication now hidden under compute (``overlapped_comm_fraction``)
becomes exposed. Net = gain − cost. It only applies when stragglers are non-persistent, late
ranks are rare (under 30 % of the ranks per straggled step), the loss is at least 10 %, there
are at least two hosts and every host holds as many ranks.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

WARMUP_STEPS = 1000
MIN_LOST = 0.10
MAX_LATE_SHARE = 0.30
LIMITS = (
    "only non-persistent, low-frequency stragglers (if ~30 % of workers are slow at every step, most "
    "subgroups still wait); parameter averaging does not overlap with backward, so it pays off only "
    "above ~10 % lost; the warm-up keeps accuracy (PyTorch straggler-mitigation post)"
)


def period_group_sizes(ranks_per_host: int, hosts: int) -> list[tuple[int, int]]:
    """``(period, group size)`` levels above the per-host group: groups of 2, 4, ... hosts
    every 2, 4, ... steps, the last one the whole world."""
    world = ranks_per_host * hosts
    levels: list[tuple[int, int]] = []
    period = 2
    while ranks_per_host * period < world:
        levels.append((period, ranks_per_host * period))
        period *= 2
    levels.append((period, world))
    return levels


def plan(
    hosts: dict[int, str | None],
    lost_fraction: float,
    late_share: float,
    overlapped_comm_fraction: float,
    straggler_rate: float | None = None,
) -> dict[str, Any]:
    """The plan (``applies`` False with a ``reason`` when the rule says no). ``hosts``: rank ->
    host of the job; ``late_share``: mean share of the ranks late in a straggled step;
    ``straggler_rate``: late rank-steps over all rank-steps (reported)."""
    per_host = Counter(h for h in hosts.values())
    world = len(hosts)
    out: dict[str, Any] = {
        "world_size": world,
        "hosts": len(per_host),
        "ranks_per_host": sorted(set(per_host.values())),
        "lost_fraction": round(lost_fraction, 4),
        "late_share_per_straggled_step": round(late_share, 4),
        "straggler_rate": None if straggler_rate is None else round(straggler_rate, 4),
        "limits": LIMITS,
    }
    reason = _refusal(per_host, lost_fraction, late_share, _contiguous(hosts))
    if reason:
        return {**out, "applies": False, "reason": reason}
    h = next(iter(per_host.values()))
    levels = period_group_sizes(h, len(per_host))
    gain = lost_fraction * (1.0 - h / world)
    net = gain - overlapped_comm_fraction
    return {
        **out,
        "applies": net > 0,
        "reason": None if net > 0 else "the overlap it gives up costs more than the stragglers it absorbs",
        "subgroup": f"per host ({h} ranks), averaged every step",
        "period_group_size_dict": [[p, g] for p, g in levels],
        "warmup_steps": WARMUP_STEPS,
        "expected_gain_fraction_max": round(gain, 4),
        "overlap_cost_fraction": round(overlapped_comm_fraction, 4),
        "expected_net_gain_fraction": round(net, 4),
        "code": _code(levels),
    }


def _contiguous(hosts: dict[int, str | None]) -> bool:
    """Whether every host's ranks form one consecutive block (torchrun's default placement)."""
    order = [hosts[r] for r in sorted(hosts)]
    changes = [h for i, h in enumerate(order) if i == 0 or h != order[i - 1]]
    return len(changes) == len(set(changes))


def _refusal(per_host: Counter[str | None], lost: float, late_share: float, contiguous: bool) -> str | None:
    if None in per_host:
        return "the host of some rank is unknown (no manifest or hostname)"
    if len(per_host) < 2:
        return "one host: the per-host group that still syncs every step is the whole job"
    if len(set(per_host.values())) > 1:
        return "hosts hold different numbers of ranks (the averager needs equal groups)"
    if not contiguous:
        return "a host's ranks are not consecutive (the averager's subgroups are consecutive rank ranges)"
    if lost < MIN_LOST:
        return f"stragglers cost {lost:.0%} (< {MIN_LOST:.0%}): no overlap of averaging with backward would eat the gain"
    if late_share >= MAX_LATE_SHARE:
        return f"{late_share:.0%} of the ranks are late per straggled step (>= {MAX_LATE_SHARE:.0%}): most groups would still wait"
    return None


def _code(levels: list[tuple[int, int]]) -> str:
    pairs = ", ".join(f"({p}, {g})" for p, g in levels)
    return (
        "from collections import OrderedDict; "
        "from torch.distributed.algorithms.ddp_comm_hooks.post_localSGD_hook import PostLocalSGDState, "
        "post_localSGD_hook; from torch.distributed.algorithms.model_averaging.hierarchical_model_averager "
        "import HierarchicalModelAverager; from torch.distributed.optim import PostLocalSGDOptimizer; "
        f"state = PostLocalSGDState(process_group=None, subgroup=None, start_localSGD_iter={WARMUP_STEPS}); "
        "ddp.register_comm_hook(state, post_localSGD_hook); "
        f"averager = HierarchicalModelAverager(period_group_size_dict=OrderedDict([{pairs}]), "
        f"warmup_steps={WARMUP_STEPS}); "
        "opt = PostLocalSGDOptimizer(optim=torch.optim.SGD(ddp.parameters(), lr=...), averager=averager)"
    )
