"""GPU straggler scenarios derived from real rank traces, re-timed consistently.

A *base* is one real GPU rank trace (``tests/data/traces/hta/...`` or one rank of
``../shared/traces/param_dlrm8/``). It is replicated into ``world`` ranks, then every rank is
re-timed by a discrete-event model of blocking collectives on the communication stream:

* the base's collective kernels are instances ``i`` (base start ``A_i``, end ``E_i``); the
  *segment* before instance ``i`` is ``[E_{i-1}, A_i]`` (the rank's compute between collectives);
* rank ``r`` arrives at ``i`` at ``arrival = new_end(r, i-1) + L_i + stretch + jitter + delay``
  (``L_i`` the base segment length; ``stretch`` = a compute slowdown spread over the segment;
  ``delay`` = a host-side stall just before the collective; ``jitter`` = exponential noise);
* the collective ends on rank ``r`` at ``max_r' arrival(r', i) + D_i * max_r' link(r', i) +
  tail(r, i)``: when its last rank has arrived plus the transfer (``D_i`` the base's transfer
  time). A ring collective (NCCL's ring/tree all-reduce, gloo's ring) moves every chunk through
  every link, so it runs at the pace of its slowest link: ``link(r', i) > 1`` (a slow link or NIC
  on rank ``r'``) lengthens *every* rank's transfer alike, and the ends stay together. ``tail``
  is what completes on the slow rank's own side after its peers are done (its last chunk still
  crossing its slow NIC, the completion handled late on that host): that rank alone ends later,
  and so arrives later at its next collective;
* every other event of rank ``r`` (CPU ops, compute kernels, step annotations) moves with a
  monotone piecewise-linear time warp through the knots ``E_{i-1} -> new_end(r, i-1)``,
  ``A_i -> arrival(r, i)``, ``E_i -> new_end(r, i)``: an event's start and end are warped, so
  nesting and order are kept and later events shift.

One clock (no per-rank offset): like the real DLRM job, kernel ends of an instance agree (within
the slow rank's ``tail`` plus a few µs). Each rank's file names its host (``host_name``,
``GPUS_PER_HOST`` ranks per host), as the manifest of a kscope-collected job does: the product
may take one clock per host, and must measure the offset between hosts from the collectives. Labels come from what was injected; ``truth.py`` recomputes
the arrival-order ground truth from the written files as a sanity check.
"""

from __future__ import annotations

import copy
import random
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from benchmarks.diag_scenarios import truth
from kinetoscope.diagnosis.stragglers.kinds import is_rotating, job_kind, rank_kind

REPO_ROOT = Path(__file__).resolve().parents[2]
HTA = REPO_ROOT / "tests" / "data" / "traces" / "hta"
DLRM8 = REPO_ROOT.parent / "shared" / "traces" / "param_dlrm8"

GPUS_PER_HOST = 4

# Flow arrows and async markers are not needed to diagnose and make big bases slow to re-read.
_DROP_CATS = {"ac2g", "async_cpu_to_gpu", "fwdbwd"}
_DROP_PH = {"s", "f", "t"}

# name -> (path, world sizes to build, whether own durations come from the whole real job)
BASES: dict[str, tuple[Path, tuple[int, ...]]] = {
    "dlrm8": (DLRM8, (8, 4)),
    "nccl_parser": (HTA / "nccl_parser_config" / "nccl_data.json.gz", (2, 4)),
    "sampled128": (HTA / "timeline_analysis" / "sampled_rank-0.json.gz", (4, 8)),
    "trace_diff": (HTA / "trace_diff" / "control" / "control.json.gz", (4,)),
}

TYPES = (
    "clean",
    "persistent",
    "persistent2",
    "intermittent",
    "small",
    "slow_link",
    "compute",
    "slow_ring",
    "node",
)
# expected verdict kind of each scenario type
KIND = {"clean": "none", "intermittent": "intermittent", "slow_ring": "none"} | {
    t: "persistent" for t in ("persistent", "persistent2", "small", "slow_link", "compute", "node")
}
# types that need at least 4 ranks: two stragglers among 2 or 3 ranks leave no typical rank to
# compare them with; a slow node is half the ranks
WIDE = ("persistent2", "node")


@dataclass
class Base:
    """One real rank trace prepared for re-timing (module docstring)."""

    name: str
    doc: dict[str, Any]
    A: np.ndarray  # base arrival (kernel start) per instance, µs
    E: np.ndarray  # base end per instance, µs
    D: np.ndarray  # own (transfer) duration per instance, µs
    seg0: np.ndarray  # start of the segment before each instance
    step_of: np.ndarray  # step index of each instance
    n_steps: int
    step_us: float  # typical step time once re-timed without stragglers
    world_sizes: tuple[int, ...]
    ts: np.ndarray = field(repr=False, default_factory=lambda: np.zeros(0))
    te: np.ndarray = field(repr=False, default_factory=lambda: np.zeros(0))
    has_ts: np.ndarray = field(repr=False, default_factory=lambda: np.zeros(0, bool))

    @property
    def n(self) -> int:
        return len(self.A)


def _steps(doc: dict[str, Any]) -> list[tuple[float, float]]:
    out = [
        (float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0)))
        for e in doc["traceEvents"]
        if isinstance(e, dict) and e.get("ph") == "X" and str(e.get("name", "")).startswith("ProfilerStep#")
    ]
    return sorted(out)


def _comm_stream_kernels(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """Collective kernels of the stream that holds most of them (one stream keeps the model
    sequential: an instance ends before the next starts)."""
    ks = truth.comm_kernels(doc)
    streams: dict[Any, int] = {}
    for e in ks:
        s = (e.get("args") or {}).get("stream")
        streams[s] = streams.get(s, 0) + 1
    main = max(streams, key=lambda s: streams[s])
    return [e for e in ks if (e.get("args") or {}).get("stream") == main]


@cache
def load_base(name: str) -> Base:
    """Read and prepare a base (cached per process)."""
    path, worlds = BASES[name]
    own: list[float] | None = None
    if path.is_dir():  # a whole real job: replicate rank 0, own durations from the real job
        files = sorted(path.glob("*.pt.trace.json"))
        docs = {truth.rank_of(d, i): d for i, d in enumerate(truth.load_json(f) for f in files)}
        doc = docs[0]
        insts = truth.instances({r: truth.comm_kernels(d) for r, d in docs.items()})
        own = [max(1.0, float(np.median(list(i.end.values()))) - max(i.arrival.values())) for i in insts]
    else:
        doc = truth.load_json(path)
    doc["traceEvents"] = [
        e
        for e in doc["traceEvents"]
        if isinstance(e, dict) and e.get("cat") not in _DROP_CATS and e.get("ph") not in _DROP_PH
    ]
    ks = _comm_stream_kernels(doc)
    A = np.array([float(e["ts"]) for e in ks])
    E = np.array([float(e["ts"]) + float(e["dur"]) for e in ks])
    keep = np.ones(len(A), bool)
    keep[1:] = A[1:] > E[:-1]  # drop an instance that overlaps the previous one (one stream: rare)
    if own is not None and len(own) == len(A):
        D = np.array(own)
    else:
        D = E - A
    A, E, D = A[keep], E[keep], D[keep]
    steps = _steps(doc)
    step_of = np.array([max([j for j, (s, _e) in enumerate(steps) if s <= a] or [0]) for a in A])
    seg0 = np.empty_like(A)
    seg0[1:] = E[:-1]
    first_step = steps[0][0] if steps else A[0] - 1000.0
    seg0[0] = min(
        A[0] - 1.0, max(first_step, A[0] - float(np.median(A[1:] - seg0[1:])) if len(A) > 1 else first_step)
    )
    removed = float((E - A - D).sum())
    step_us = (sum(e - s for s, e in steps) - removed) / max(len(steps), 1) if steps else float(E[-1] - A[0])
    ev = doc["traceEvents"]
    has_ts = np.array([isinstance(e.get("ts"), (int, float)) for e in ev])
    ts = np.array([float(e["ts"]) if h else 0.0 for e, h in zip(ev, has_ts, strict=True)])
    te = ts + np.array([float(e.get("dur", 0) or 0) if h else 0.0 for e, h in zip(ev, has_ts, strict=True)])
    return Base(name, doc, A, E, D, seg0, step_of, max(len(steps), 1), step_us, worlds, ts, te, has_ts)


@dataclass
class Plan:
    """What is injected into one scenario; arrays are [rank, instance], µs or factors."""

    delay: np.ndarray
    stretch: np.ndarray
    link: np.ndarray  # a rank's link factor: the slowest sets every rank's transfer pace
    jitter_mean_us: float
    tail: np.ndarray | None = None  # µs completing on the rank's own side after its peers

    @classmethod
    def empty(cls, world: int, n: int, jitter_mean_us: float) -> Plan:
        return cls(
            np.zeros((world, n)),
            np.zeros((world, n)),
            np.ones((world, n)),
            jitter_mean_us,
            np.zeros((world, n)),
        )


def simulate(base: Base, plan: Plan, rng: random.Random) -> tuple[np.ndarray, np.ndarray]:
    """New arrival and end of every (rank, instance), µs (module docstring)."""
    world, n = plan.delay.shape
    arr = np.zeros((world, n))
    end = np.zeros((world, n))
    prev = np.full(world, base.seg0[0])
    for i in range(n):
        L = base.A[i] - base.seg0[i]
        jit = np.array(
            [
                rng.expovariate(1.0 / plan.jitter_mean_us) if plan.jitter_mean_us > 0 else 0.0
                for _ in range(world)
            ]
        )
        arr[:, i] = prev + L + plan.stretch[:, i] + jit + plan.delay[:, i]
        last = arr[:, i].max()
        tail = plan.tail[:, i] if plan.tail is not None else np.zeros(world)
        pace = float(plan.link[:, i].max())  # a ring moves at its slowest link's pace
        end[:, i] = last + base.D[i] * pace + tail + np.array([rng.uniform(0.0, 3.0) for _ in range(world)])
        prev = end[:, i]
    return arr, end


def warp_knots(
    base: Base, plan: Plan, arr: np.ndarray, end: np.ndarray, r: int
) -> tuple[np.ndarray, np.ndarray]:
    """Knots (base time -> new time) of rank ``r``'s time warp, strictly increasing in both."""
    xs: list[float] = [base.seg0[0]]
    ys: list[float] = [base.seg0[0]]
    for i in range(base.n):
        d = plan.delay[r, i]
        eps = min(1.0, (base.A[i] - xs[-1]) / 2)
        if d > 0 and eps > 0:  # the stall sits just before the collective
            xs.append(base.A[i] - eps)
            ys.append(arr[r, i] - d - eps)
        xs += [base.A[i], base.E[i]]
        ys += [arr[r, i], end[r, i]]
    return np.array(xs), np.array(ys)


def warp(t: np.ndarray, xs: np.ndarray, ys: np.ndarray) -> np.ndarray:
    """Piecewise-linear through the knots, slope 1 outside them."""
    out = np.interp(t, xs, ys)
    out = np.where(t < xs[0], t + (ys[0] - xs[0]), out)
    return np.where(t > xs[-1], t + (ys[-1] - xs[-1]), out)


def host_of(rank: int) -> str:
    """The host a rank runs on: ``GPUS_PER_HOST`` ranks per host, as a kscope-collected job's
    manifest names them. Ranks of one host share its clock; an 8-rank scenario spans two hosts,
    so the product also has to measure an offset between hosts."""
    return f"node{rank // GPUS_PER_HOST}"


def rank_doc(base: Base, xs: np.ndarray, ys: np.ndarray, rank: int, world: int) -> dict[str, Any]:
    """The base document re-timed for one rank."""
    nts = warp(base.ts, xs, ys)
    nte = warp(base.te, xs, ys)
    events = []
    for k, e in enumerate(base.doc["traceEvents"]):
        if base.has_ts[k]:
            e = dict(e)
            e["ts"] = round(float(nts[k]), 3)
            if "dur" in e:
                e["dur"] = round(float(nte[k] - nts[k]), 3)
        events.append(e)
    doc = {k: v for k, v in base.doc.items() if k != "traceEvents"}
    info = copy.deepcopy(doc.get("distributedInfo") or {"backend": "nccl"})
    info.update(rank=rank, world_size=world)
    info.pop("pg_config", None)
    doc["distributedInfo"] = info
    doc["host_name"] = host_of(rank)
    doc["traceEvents"] = events
    return doc


def write_job(base: Base, plan: Plan, rng: random.Random, out: Path) -> list[Path]:
    """Simulate, re-time every rank and write ``rank-<r>.pt.trace.json`` files into ``out``."""
    arr, end = simulate(base, plan, rng)
    out.mkdir(parents=True, exist_ok=True)
    world = plan.delay.shape[0]
    paths = []
    for r in range(world):
        xs, ys = warp_knots(base, plan, arr, end, r)
        assert np.all(np.diff(xs) > 0) and np.all(np.diff(ys) > 0), (
            f"{base.name}: warp not monotone on rank {r}"
        )
        p = out / f"rank-{r}.pt.trace.json"
        p.write_bytes(orjson.dumps(rank_doc(base, xs, ys, r, world)))
        paths.append(p)
    return paths


@dataclass
class Scenario:
    """One labelled scenario: how to build it and what a right verdict says."""

    sid: str
    type: str
    base: str
    world: int
    seed: int
    ranks: list[int]  # expected straggler ranks
    kind: str  # expected kind
    params: dict[str, Any]
    plan: Plan = field(repr=False)


def _per_step_split(base: Base, total_frac: float, weights: np.ndarray, rng: random.Random) -> np.ndarray:
    """Per instance amounts: ``total_frac`` of a step per step, split by ``weights`` within each
    step and randomised ±30 % per instance."""
    out = np.zeros(base.n)
    for s in range(base.n_steps):
        idx = np.where(base.step_of == s)[0]
        if not len(idx):
            continue
        w = weights[idx] / weights[idx].sum() if weights[idx].sum() > 0 else np.full(len(idx), 1 / len(idx))
        out[idx] = total_frac * base.step_us * w
    return out * np.array([rng.uniform(0.7, 1.3) for _ in range(base.n)])


def make_scenario(stype: str, base_name: str, world: int, seed: int) -> Scenario:
    """A labelled scenario of type ``stype`` (``TYPES``), deterministic in its arguments."""
    base = load_base(base_name)
    rng = random.Random(f"{stype}/{base_name}/{world}/{seed}")
    jitter_frac = rng.uniform(0.002, 0.01)
    per_step = max(1.0, base.n / base.n_steps)
    plan = Plan.empty(world, base.n, jitter_frac * base.step_us / per_step * 2)
    params: dict[str, Any] = {"jitter_mean_us": round(plan.jitter_mean_us, 1)}
    kind = KIND.get(stype, "none")
    ranks: list[int] = []
    even = np.ones(base.n)
    if stype in ("persistent", "small"):
        r = rng.randrange(world)
        frac = rng.uniform(0.10, 0.40) if stype == "persistent" else rng.uniform(0.03, 0.08)
        plan.delay[r] = _per_step_split(base, frac, even, rng)
        ranks, params = [r], params | {"rank": r, "frac_of_step": round(frac, 3)}
    elif stype == "persistent2":
        r1, r2 = rng.sample(range(world), 2)
        frac = rng.uniform(0.10, 0.40)
        for r in (r1, r2):
            plan.delay[r] = _per_step_split(base, frac, even, rng)
        ranks, params = sorted([r1, r2]), params | {"ranks": sorted([r1, r2]), "frac_of_step": round(frac, 3)}
    elif stype == "node":
        # a slow node: the upper half of the ranks (an 8-rank job's second host of four GPUs)
        # stall alike before every collective; they arrive together, each last only by the noise.
        # Beyond 8 ranks, one host drawn at random (half of a 64-rank job is eight hosts)
        if world > 2 * GPUS_PER_HOST:
            h = rng.randrange(world // GPUS_PER_HOST)
            group = list(range(h * GPUS_PER_HOST, (h + 1) * GPUS_PER_HOST))
        else:
            group = list(range(world - world // 2, world))
        frac = rng.uniform(0.10, 0.40)
        delay = _per_step_split(base, frac, even, rng)
        for r in group:
            plan.delay[r] = delay
        ranks, params = group, params | {"ranks": group, "frac_of_step": round(frac, 3)}
    elif stype == "intermittent":
        k = min(base.n, rng.randint(2, 4))
        insts = sorted(rng.sample(range(base.n), k))
        who = [rng.randrange(world) for _ in insts]
        while len(set(who)) < 2:
            who = [rng.randrange(world) for _ in insts]
        for i, r in zip(insts, who, strict=True):
            plan.delay[r, i] = rng.uniform(0.2, 0.6) * base.step_us
        ranks = sorted(set(who))
        params |= {"events": [[r, i] for r, i in zip(who, insts, strict=True)]}
        kind = stall_kind(base, params["events"])
    elif stype in ("slow_link", "slow_ring"):
        # a slow link or NIC on rank r: the ring runs at its pace (every rank's transfer longer
        # by `frac` of a step in all); slow_link: r's own side also completes `tail_share` of that
        # later than its peers (and r arrives late next); slow_ring: the ends stay together
        r = rng.randrange(world)
        frac = rng.uniform(0.10, 0.30)
        extra = _per_step_split(base, frac, base.D, rng)
        plan.link[r] = 1.0 + extra / base.D
        params |= {"rank": r, "frac_of_step": round(frac, 3)}
        if stype == "slow_link":
            share = rng.uniform(0.25, 0.5)
            assert plan.tail is not None
            plan.tail[r] = share * extra
            ranks, params = [r], params | {"tail_share": round(share, 3)}
    elif stype == "compute":
        r = rng.randrange(world)
        frac = rng.uniform(0.10, 0.40)
        plan.stretch[r] = _per_step_split(base, frac, base.A - base.seg0, rng)
        ranks, params = [r], params | {"rank": r, "frac_of_step": round(frac, 3)}
    elif stype != "clean":
        raise ValueError(f"unknown scenario type {stype!r}; expected one of {', '.join(TYPES)}")
    sid = f"gpu-{stype}-{base_name}-w{world}-s{seed}"
    return Scenario(sid, stype, base_name, world, seed, ranks, kind, params, plan)


def build(sc: Scenario, out: Path) -> list[Path]:
    """Write the scenario's rank files into ``out``."""
    rng = random.Random(f"noise/{sc.sid}")
    return write_job(load_base(sc.base), sc.plan, rng, out)


def available_bases() -> list[str]:
    """Bases whose files exist (the DLRM job lives outside the repository)."""
    return [n for n, (p, _w) in BASES.items() if p.exists()]


def scenarios(
    per_type: int,
    bases: list[str] | None = None,
    types: list[str] | None = None,
    worlds: list[int] | None = None,
    first_seed: int = 0,
) -> list[Scenario]:
    """``per_type`` scenarios of every type (or of ``types``), cycling over bases and their world
    sizes, or ``worlds`` for every base (scale: 16-64 ranks of one real rank's timeline);
    ``WIDE`` types: world sizes >= 4 only. Seeds ``first_seed`` on (0: the set earlier rounds
    used; another draws fresh stragglers, delays and steps on the same bases and sizes)."""
    combos = [(b, w) for b in (bases or available_bases()) for w in (worlds or BASES[b][1])]
    out = []
    for k in range(per_type):  # types interleaved: a run cut short still covers every type
        for t in types or TYPES:
            mine = [(b, w) for b, w in combos if w >= 4] if t in WIDE else combos
            b, w = mine[k % len(mine)]
            out.append(make_scenario(t, b, w, first_seed + k))
    return out


def truth_agrees(sc: Scenario, gt: truth.GroundTruth) -> bool:
    """Sanity check of a label against the arrival-order ground truth of the written files:
    every labelled rank imposes at least 1 % of a step per step, no other rank 2 % or more.
    Two stragglers that arrive together share the wait (each imposes only their difference):
    for ``persistent2`` and ``masking`` the pair, for ``node`` the node's ranks, must be the latest ranks as a set
    at >= 80 % of the instances."""
    base = load_base(sc.base)
    if sc.type in ("persistent2", "node", "masking"):  # ranks late together: the latest set at >= 80 %
        return gt.latest_set_count(set(sc.ranks)) >= 0.8 * gt.n_instances
    per_step = {r: w / base.n_steps / base.step_us for r, w in gt.imposed_us.items()}
    labelled = set(sc.ranks)
    return all(per_step.get(r, 0.0) >= 0.01 for r in labelled) and all(
        v < 0.02 for r, v in per_step.items() if r not in labelled
    )


# Issue 27's scenario types, built only when asked (``new_scenarios``; ``bench_diagnosis.py
# --new-gpu-per-type``): ``scenarios`` and its seeds are unchanged.
NEW_TYPES = ("rotating", "masking", "mixed", "mixed3")
NEW_KIND = {"rotating": "rotating", "masking": "persistent", "mixed": "mixed", "mixed3": "mixed"}
# types whose stragglers are told apart by steps (a rank late in 3 steps or more): bases with this
# many steps or more (of the bases here only trace_diff, 6 steps; dlrm8 traces one step)
STEPPED, MIN_STEPS, MIN_STALLS = ("rotating", "mixed", "mixed3"), 5, 3
# stragglers per type: every job keeps two punctual ranks or more beside them
N_STRAGGLERS = {"rotating": 2, "masking": 2, "mixed": 2, "mixed3": 3}


def _late_of(base: Base, events: list[list[int]]) -> dict[int, list[int]]:
    """Rank -> the steps of its stall events ([rank, instance] pairs)."""
    late: dict[int, list[int]] = {}
    for r, i in events:
        late.setdefault(int(r), []).append(int(base.step_of[i]))
    return late


def stall_kind(base: Base, events: list[list[int]]) -> str:
    """Kind of an ``intermittent`` scenario by the verdict's taxonomy
    (``kinetoscope.diagnosis.stragglers.kinds``) on its injected stall events: ``rotating`` when
    they move between ranks over steps, else ``intermittent`` (a one-step base never rotates)."""
    return "rotating" if is_rotating(_late_of(base, events)) else "intermittent"


def _stall_steps(base: Base, p: float, rng: random.Random) -> list[int]:
    """Steps that stall, each with probability ``p``, drawn again until ``MIN_STALLS`` do (a
    6-step base: otherwise too few for a verdict to tell a recurring rank from noise)."""
    for _ in range(1000):
        steps = [s for s in range(base.n_steps) if rng.random() < p]
        if len(steps) >= MIN_STALLS:
            return steps
    return list(range(base.n_steps))


def _stall_in_step(base: Base, step: int, rng: random.Random) -> int:
    """A random instance of ``step`` (the stall sits just before it)."""
    idx = [int(i) for i in np.where(base.step_of == step)[0]] or [rng.randrange(base.n)]
    return rng.choice(idx)


def make_new_scenario(stype: str, base_name: str, world: int, seed: int) -> Scenario:
    """A labelled scenario of an issue-27 type (``NEW_TYPES``), deterministic in its arguments:

    * ``rotating``: each step with p ~ U(0.2, 0.4) one random rank stalls 50-80 % of a step before
      one of that step's collectives (>= 3 stalls on >= 2 ranks); label: the ranks that stalled;
    * ``masking``: two ranks with the same stall array (10-40 % of a step per step): they arrive
      together, each last only by the noise;
    * ``mixed``: one persistent rank (10-40 % of a step per step) and one intermittent rank
      (stalls of 20-60 % of a step in 30 % of the steps, >= 3); ``mixed3``: also a third rank
      whose compute is stretched by 10-40 % of a step. Kind ``mixed``, or ``persistent`` when the
      intermittent rank stalls in more than half of the steps (late in most steps is persistent
      by the verdict's definition; on the 6-step base, 4 stalls or more)."""
    base = load_base(base_name)
    rng = random.Random(f"new/{stype}/{base_name}/{world}/{seed}")
    jitter_frac = rng.uniform(0.002, 0.01)
    per_step = max(1.0, base.n / base.n_steps)
    plan = Plan.empty(world, base.n, jitter_frac * base.step_us / per_step * 2)
    params: dict[str, Any] = {"jitter_mean_us": round(plan.jitter_mean_us, 1)}
    even = np.ones(base.n)
    kind = NEW_KIND[stype]
    if stype == "rotating":
        p = rng.uniform(0.2, 0.4)
        for _ in range(1000):
            who = {s: rng.randrange(world) for s in _stall_steps(base, p, rng)}
            if len(set(who.values())) >= 2:
                break
        events = []
        for s, r in sorted(who.items()):
            i = _stall_in_step(base, s, rng)
            plan.delay[r, i] = rng.uniform(0.5, 0.8) * base.step_us
            events.append([r, i])
        ranks, params = sorted(set(who.values())), params | {"prob": round(p, 3), "events": events}
        kind = job_kind(_late_of(base, events), base.n_steps)
    elif stype == "masking":
        pair = sorted(rng.sample(range(world), 2))
        frac = rng.uniform(0.10, 0.40)
        delay = _per_step_split(base, frac, even, rng)
        for r in pair:
            plan.delay[r] = delay
        ranks, params = pair, params | {"ranks": pair, "frac_of_step": round(frac, 3)}
    elif stype in ("mixed", "mixed3"):
        who = rng.sample(range(world), N_STRAGGLERS[stype])
        frac = rng.uniform(0.10, 0.40)
        plan.delay[who[0]] = _per_step_split(base, frac, even, rng)
        # 30 % of the steps, at least MIN_STALLS: recurring, yet late in no more than half of
        # them (the 6-step base: 3), so the rank stays intermittent by the verdict's definition
        late = sorted(rng.sample(range(base.n_steps), max(MIN_STALLS, round(0.3 * base.n_steps))))
        stalls = [_stall_in_step(base, s, rng) for s in late]
        for i in stalls:
            plan.delay[who[1], i] += rng.uniform(0.2, 0.6) * base.step_us
        params |= {"persistent": who[0], "frac_of_step": round(frac, 3), "intermittent": [who[1], stalls]}
        if stype == "mixed3":
            cfrac = rng.uniform(0.10, 0.40)
            plan.stretch[who[2]] = _per_step_split(base, cfrac, base.A - base.seg0, rng)
            params |= {"compute": who[2], "compute_frac": round(cfrac, 3)}
        ranks = sorted(who)
        if rank_kind(len(late), base.n_steps) == "persistent":
            kind = "persistent"
    else:
        raise ValueError(f"unknown new scenario type {stype!r}; expected one of {', '.join(NEW_TYPES)}")
    sid = f"gpu-{stype}-{base_name}-w{world}-n{seed}"
    return Scenario(sid, stype, base_name, world, seed, ranks, kind, params, plan)


def new_scenarios(
    per_type: int,
    bases: list[str] | None = None,
    types: list[str] | None = None,
    worlds: list[int] | None = None,
    first_seed: int = 0,
) -> list[Scenario]:
    """``per_type`` scenarios of every new type (or of ``types``), cycling over the bases that
    have the steps the type needs and world sizes of 4 and 8 (or ``worlds``) with two punctual
    ranks or more beside the stragglers; seeds ``first_seed`` on (as ``scenarios``)."""
    out = []
    for k in range(per_type):
        for t in types or NEW_TYPES:
            combos = [
                (b, w)
                for b in (bases or available_bases())
                if t not in STEPPED or load_base(b).n_steps >= MIN_STEPS
                for w in (worlds or (4, 8))
                if w >= N_STRAGGLERS[t] + 2
            ]
            if not combos:
                raise ValueError(f"no base with >= {MIN_STEPS} steps for {t!r} among {bases}")
            b, w = combos[k % len(combos)]
            out.append(make_new_scenario(t, b, w, first_seed + k))
    return out
