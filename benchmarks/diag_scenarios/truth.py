"""Arrival-order ground truth of a GPU job, from the raw trace JSON (standard library only).

Definitions (the same as issue 9's validation):

* *collective instance*: one execution of one collective, matched across ranks by order: the
  k-th NCCL/RCCL kernel of a collective family (``AllReduce``, ``SendRecv``, ...) on a stream of
  one rank is the same instance as the k-th of that family on that stream of every other rank.
* *arrival*: a rank's kernel start (the stream reached the collective: its data was ready);
  the kernel then spins until every rank has joined.
* *imposed wait*: at each instance, the rank that arrives last makes everybody wait
  ``last - second-to-last`` (how much earlier the instance would complete had it arrived with
  the next-latest rank); every other rank imposes 0 there.
* *stragglers*: the fewest ranks that together hold at least ``cover`` (default 80 %) of the
  job's imposed wait.

It needs one clock across ranks; ``end_spread_us`` says how far apart the ranks' kernel ends
are (within a few tens of µs on one host clock).
"""

from __future__ import annotations

import bisect
import functools
import gzip
import json
import re
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

_FAMILY = re.compile(r"^(?:ncclDevKernel|ncclKernel|rcclKernel)_([A-Za-z]+)")


def load_json(path: str | Path) -> dict[str, Any]:
    """A trace file (``.json`` or ``.json.gz``) as a dict."""
    p = Path(path)
    raw = gzip.decompress(p.read_bytes()) if p.name.endswith(".gz") else p.read_bytes()
    doc = json.loads(raw)
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        raise ValueError(f"{p}: not a Kineto trace (no traceEvents list)")
    return doc


def comm_kernels(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """The document's collective kernels (complete events of a communication family), by start."""
    out = [
        e
        for e in doc["traceEvents"]
        if isinstance(e, dict)
        and e.get("ph") == "X"
        and str(e.get("cat", "")).lower() == "kernel"
        and _FAMILY.match(str(e.get("name", "")))
    ]
    return sorted(out, key=lambda e: float(e["ts"]))


def family(name: str) -> str:
    m = _FAMILY.match(name)
    return m.group(1) if m else name


@dataclass
class Instance:
    key: tuple[str, str, int]  # (stream, family, ordinal)
    arrival: dict[int, float]  # rank -> kernel start (µs)
    end: dict[int, float]  # rank -> kernel end (µs)

    def last_two(self) -> tuple[int, float]:
        """The last rank to arrive and the wait it imposes (last - second-to-last)."""
        order = sorted(self.arrival.items(), key=lambda kv: (kv[1], kv[0]))
        if len(order) < 2:
            return order[-1][0], 0.0
        return order[-1][0], order[-1][1] - order[-2][1]


def instances(kernels: dict[int, list[dict[str, Any]]]) -> list[Instance]:
    """Instances present on every rank, in order of their earliest arrival."""
    per_rank: dict[int, dict[tuple[str, str, int], dict[str, Any]]] = {}
    for r, ks in kernels.items():
        seen: dict[tuple[str, str], int] = defaultdict(int)
        mine: dict[tuple[str, str, int], dict[str, Any]] = {}
        for e in ks:
            sk = (str((e.get("args") or {}).get("stream", e.get("tid"))), family(str(e["name"])))
            mine[(*sk, seen[sk])] = e
            seen[sk] += 1
        per_rank[r] = mine
    common = set.intersection(*(set(m) for m in per_rank.values())) if per_rank else set()
    out = [
        Instance(
            k,
            {r: float(m[k]["ts"]) for r, m in per_rank.items()},
            {r: float(m[k]["ts"]) + float(m[k].get("dur", 0)) for r, m in per_rank.items()},
        )
        for k in common
    ]
    return sorted(out, key=lambda i: min(i.arrival.values()))


@dataclass
class GroundTruth:
    ranks: list[int]  # all ranks of the job
    imposed_us: dict[int, float]  # rank -> summed imposed wait
    last_count: dict[int, int]  # rank -> instances where it arrived last (imposing > 0)
    n_instances: int
    end_spread_us: float  # the largest spread of kernel ends across ranks at one instance
    stragglers: list[int] = field(default_factory=list)
    orders: list[tuple[int, ...]] = field(default_factory=list)  # per instance: ranks in arrival order

    @property
    def last_pairs(self) -> dict[tuple[int, int], int]:
        """The two latest ranks (sorted) -> at how many instances they were."""
        return dict(Counter((min(o[-2:]), max(o[-2:])) for o in self.orders if len(o) >= 2))

    def latest_set_count(self, ranks: set[int]) -> int:
        """Instances at which ``ranks`` were the ``len(ranks)`` latest arrivals, as a set."""
        return sum(set(o[-len(ranks) :]) == ranks for o in self.orders)

    @property
    def total_us(self) -> float:
        return sum(self.imposed_us.values())

    def share(self, ranks: list[int] | set[int]) -> float:
        return sum(self.imposed_us.get(r, 0.0) for r in ranks) / self.total_us if self.total_us > 0 else 0.0


def fewest_covering(imposed: dict[int, float], cover: float) -> list[int]:
    """The fewest ranks (largest imposed wait first) holding at least ``cover`` of the total."""
    total = sum(imposed.values())
    if total <= 0:
        return []
    out: list[int] = []
    acc = 0.0
    for r, w in sorted(imposed.items(), key=lambda kv: (-kv[1], kv[0])):
        if acc >= cover * total:
            break
        out.append(r)
        acc += w
    return sorted(out)


def ground_truth_from_docs(docs: dict[int, dict[str, Any]], cover: float = 0.8) -> GroundTruth:
    """Ground truth of a job given as rank -> trace document."""
    insts = instances({r: comm_kernels(d) for r, d in docs.items()})
    imposed: dict[int, float] = dict.fromkeys(docs, 0.0)
    last: dict[int, int] = dict.fromkeys(docs, 0)
    spread = 0.0
    orders: list[tuple[int, ...]] = []
    for inst in insts:
        orders.append(tuple(sorted(inst.arrival, key=lambda q: (inst.arrival[q], q))))
        r, w = inst.last_two()
        imposed[r] += w
        if w > 0:
            last[r] += 1
        spread = max(spread, max(inst.end.values()) - min(inst.end.values()))
    gt = GroundTruth(sorted(docs), imposed, last, len(insts), spread, orders=orders)
    gt.stragglers = fewest_covering(imposed, cover)
    return gt


def rank_of(doc: dict[str, Any], fallback: int) -> int:
    info = doc.get("distributedInfo") or {}
    return int(info["rank"]) if isinstance(info.get("rank"), int) else fallback


def ground_truth(paths: list[str | Path], cover: float = 0.8) -> GroundTruth:
    """Ground truth of a job given as its rank trace files (rank from ``distributedInfo``)."""
    docs: dict[int, dict[str, Any]] = {}
    for i, p in enumerate(sorted(paths)):
        doc = load_json(p)
        docs[rank_of(doc, i)] = doc
    return ground_truth_from_docs(docs, cover)


# -- CPU (gloo) jobs -------------------------------------------------------------------------------
#
# A CPU job's labels say what was injected; a loaded host can make a straggler of its own (a rank
# descheduled for 100 ms in a few steps makes every peer wait as long as an injected sleep would).
# The check below finds such ranks from arrival order alone, independently of the product:
#
# * *arrival*: the start of the rank's k-th ``c10d::<collective>_`` host op (the training thread
#   issues the collective once its gradients are ready); the k-th op of one name is the same
#   instance on every rank (the ranks' trace windows start at the same iteration; instances not
#   present on every rank are left out, as for GPU jobs);
# * *imposed wait*, as above: ``last - second-to-last`` at each instance; gloo collectives are
#   issued asynchronously (DDP issues every bucket during backward, then waits), so one delay of
#   a rank shows at each instance of its step: per step a rank imposes the largest of its
#   margins there (not their sum), summed over steps;
# * *step*: the median spacing of rank 0's ``Optimizer.step`` ops; an instance belongs to the
#   step of its arrival on the lowest rank (one host, one clock);
# * *host-made straggler*: a rank outside the label whose imposed wait is at least ``floor``
#   (``NAMING_FLOOR``, 5 %: the share of a step below which the verdict calls a loss from a rank
#   that is not steadily late not worth naming) of a step per step;
# * *weak label*: the labelled ranks together (``cpu_joint_share``) impose less than that floor, so
#   the host's jitter absorbed most of the injected delay (a 3 ms sleep on 60-100 ms steps under
#   load: 1-4 %); such a label is no more a straggler by arrival order than a host-made rank under
#   the floor is. Not judged when the label holds every rank (nobody is left to wait for them).

NAMING_FLOOR = 0.05

_C10D = re.compile(r"^c10d::([a-z_]+?)_$")
_RANK_FILE = re.compile(r"rank-(\d+)_")


def issue_ops(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """The document's collective issue ops (``c10d::allreduce_`` ...), by start."""
    out = [
        e
        for e in doc["traceEvents"]
        if isinstance(e, dict) and e.get("ph") == "X" and _C10D.match(str(e.get("name", "")))
    ]
    return sorted(out, key=lambda e: float(e["ts"]))


def _median(xs: list[float]) -> float:
    s = sorted(xs)
    return (s[(len(s) - 1) // 2] + s[len(s) // 2]) / 2 if s else 0.0


def optimizer_steps(doc: dict[str, Any]) -> list[float]:
    """Start times of the document's ``Optimizer.step`` ops, in order."""
    return sorted(
        float(e["ts"])
        for e in doc["traceEvents"]
        if isinstance(e, dict)
        and e.get("ph") == "X"
        and e.get("cat") != "gpu_user_annotation"  # a CUDA trace repeats the annotation on the GPU
        and str(e.get("name", "")).startswith("Optimizer.step")
    )


def step_us(doc: dict[str, Any]) -> float:
    """Median spacing of the document's ``Optimizer.step`` ops (0 with fewer than two)."""
    ts = optimizer_steps(doc)
    return _median([b - a for a, b in zip(ts, ts[1:])])


@dataclass
class CpuJob:
    """A CPU job's collective instances (issue ops as pseudo-kernels: one "stream", family =
    collective) and the optimizer steps of its lowest rank, the one clock every instance is
    placed on."""

    ranks: list[int]
    insts: list[Instance]
    opt: list[float]  # start times of the lowest rank's ``Optimizer.step`` ops
    step: float  # their median spacing (µs)

    def step_of(self, inst: Instance) -> int:
        return bisect.bisect_right(self.opt, inst.arrival[self.ranks[0]])


def cpu_job(paths: list[str | Path]) -> CpuJob:
    """Read a CPU job from its rank files (``rank-<R>_<pid>...``); the last two jobs read are
    kept, since a job's truth, joint share and skews are read one after another."""
    return _read_cpu_job(tuple(str(p) for p in paths))


@functools.lru_cache(maxsize=2)
def _read_cpu_job(paths: tuple[str, ...]) -> CpuJob:
    docs = {int(m.group(1)): load_json(p) for p in paths if (m := _RANK_FILE.search(Path(p).name))}
    insts = instances({r: [{**e, "args": {"stream": "host"}} for e in issue_ops(d)] for r, d in docs.items()})
    first = docs[min(docs)] if docs else {"traceEvents": []}
    return CpuJob(sorted(docs), insts, optimizer_steps(first), step_us(first))


def cpu_ground_truth(paths: list[str | Path], cover: float = 0.8) -> tuple[GroundTruth, float, int]:
    """Arrival-order truth of a CPU job from its rank files (``rank-<R>_<pid>...``): the truth,
    the median step (µs) and the number of steps (optimizer steps of rank 0)."""
    job = cpu_job(paths)
    last: dict[int, int] = dict.fromkeys(job.ranks, 0)
    for inst in job.insts:
        r, w = inst.last_two()
        last[r] += w > 0
    imposed: dict[int, float] = dict.fromkeys(job.ranks, 0.0)
    for (r, _k), w in cpu_step_waits(paths).items():
        imposed[r] += w
    gt = GroundTruth(job.ranks, imposed, last, len(job.insts), 0.0)
    gt.stragglers = fewest_covering(imposed, cover)
    return gt, job.step, len(job.opt)


def cpu_step_waits(paths: list[str | Path]) -> dict[tuple[int, int], float]:
    """(rank, step) -> the wait the rank imposed in that step (µs): at each instance the last
    rank imposes ``last - second-to-last``; a step keeps its rank's largest such margin. Steps
    are counted as the diagnosis labels them: 0 is the first traced step, the one that ends with
    the lowest rank's first ``Optimizer.step``."""
    job = cpu_job(paths)
    per_step: dict[tuple[int, int], float] = defaultdict(float)
    for inst in job.insts:
        r, w = inst.last_two()
        k = job.step_of(inst)
        per_step[(r, k)] = max(per_step[(r, k)], w)
    return dict(per_step)


def cpu_step_lateness(paths: list[str | Path]) -> dict[tuple[int, int], float]:
    """(rank, step) -> how far the rank arrived behind the earliest rank (µs), the largest over
    the step's instances: whatever delayed it (an injected sleep, the host descheduling it),
    the rank held that collective back by this much. Steps as in ``cpu_step_waits``."""
    job = cpu_job(paths)
    late: dict[tuple[int, int], float] = defaultdict(float)
    for inst in job.insts:
        first = min(inst.arrival.values())
        k = job.step_of(inst)
        for r, t in inst.arrival.items():
            late[(r, k)] = max(late[(r, k)], t - first)
    return dict(late)


def imposed_shares(gt: GroundTruth, step: float, n_steps: int) -> dict[int, float]:
    """Rank -> the wait it imposed, as a share of a step per step (empty without steps)."""
    if step <= 0 or n_steps <= 0:
        return {}
    return {r: w / n_steps / step for r, w in gt.imposed_us.items()}


def host_made(
    gt: GroundTruth, step: float, n_steps: int, labelled: list[int], floor: float = NAMING_FLOOR
) -> dict[int, float]:
    """Ranks outside the label imposing at least ``floor`` of a step per step: rank -> share."""
    share = imposed_shares(gt, step, n_steps)
    return {r: round(v, 3) for r, v in share.items() if r not in labelled and v >= floor}


def cpu_joint_share(paths: list[str | Path], ranks: set[int]) -> float:
    """What the set ``ranks`` costs a CPU-issued (gloo) job together, as a share of a step per
    step: at each instance the latest arrival minus the latest arrival of the other ranks, the
    largest per step (as ``cpu_ground_truth``), summed over steps. Two ranks that are late
    together impose little one by one (each only its margin over the other) but this much as a
    pair."""
    job = cpu_job(paths)
    per_step: dict[int, float] = defaultdict(float)
    for inst in job.insts:
        rest = [t for q, t in inst.arrival.items() if q not in ranks]
        if rest:
            k = job.step_of(inst)
            per_step[k] = max(per_step[k], max(inst.arrival.values()) - max(rest))
    return sum(per_step.values()) / len(job.opt) / job.step if job.opt and job.step > 0 else 0.0


def steady_skew(paths: list[str | Path]) -> dict[int, tuple[int, int, float]]:
    """Per rank of a CPU job: in how many steps it arrives after the other ranks' median (its
    per-step skew, the median over the step's instances of its arrival minus the others' median
    arrival, is positive), of how many steps, and its median per-step skew as a share of a step.
    A steady delay shows here even where the others' jitter keeps the rank from being the last;
    so does a rank the host slows a little in most steps."""
    job = cpu_job(paths)
    per: dict[int, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    for inst in job.insts:
        k = job.step_of(inst)
        for r, t in inst.arrival.items():
            per[r][k].append(t - _median([v for q, v in inst.arrival.items() if q != r]))
    out = {}
    for r in job.ranks:
        steps = [_median(v) for _k, v in sorted(per[r].items())]
        share = _median(steps) / job.step if job.step > 0 else 0.0
        out[r] = (sum(x > 0 for x in steps), len(steps), round(share, 3))
    return out
