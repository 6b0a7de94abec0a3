"""Pipeline parallelism: stages, micro-batch compute, the bubble and stage imbalance.

A job is *pipeline-parallel* when every rank exchanges point-to-point messages (``send`` /
``recv``: gloo/MPI/UCC ``<backend>:send|recv`` annotations, ``c10d::send``/``c10d::recv_`` host
ops, NCCL ``SendRecv`` kernels) in (the median of) its steps, and some ranks open their step
with a send (the first stage, which has its input) while the others open it with a receive.

Terms (per rank and step, on the aligned clock; ``T`` is the step's duration):

``idle``
    time the rank waits for a peer's activation or gradient. CPU ranks: the gaps of at least
    ``pipeline_cuts.WAIT_GAP_NS`` between its own ``cpu_op`` events (other than communication ones) that
    fall inside a send or receive span; shorter gaps are host work between ops (Python), and
    asynchronous sends overlap such work, so counting every uncovered instant of a send span
    would book it as idle. GPU ranks: ``T`` − the union of their computation kernels.
``compute``
    ``T`` − ``idle``: forward and backward of all its micro-batches, optimizer, host work.
``bubble_fraction`` (stage)
    ``idle / T``: warm-up and cool-down (the pipeline fills and drains) plus the waits that the
    slowest stage imposes between micro-batches. The job's is the mean over stages. A balanced
    GPipe or 1F1B schedule with ``p`` stages and ``m`` micro-batches is expected to idle
    ``(p − 1) / (m + p − 1)`` (``expected_bubble_fraction``).

Stages, first that applies:

1. the recorded group of the ranks' send/recv (a pipeline group lists its ranks in stage order):
   a rank's stage is its position in it;
2. the transfers paired with their peers (``whatif.p2p``): the ranks opening their step with a
   send are stage 0, each further stage one transfer hop further (``stage_order.hop_stages``,
   the replay's definition: the verdict's stage and this one are one number);
3. the collective groups that split the ranks into blocks the size of the first stage (the
   data-parallel groups of a DP x PP job: one block per stage), the first stage's block first,
   the others ordered by their ranks' median wait for upstream;
4. otherwise: the ranks opening their step with a send are stage 0 (``d`` of them: ``d``
   pipeline replicas); the others are ordered by their wait for upstream and cut into groups
   of ``d``.

The wait for upstream is the time from a rank's first send/recv post of the step to its first
completed receive (a later stage waits for more forwards); from its own post, so a slowed
replica, which posts late, does not move its ranks into a later stage.

Imbalance (the M_S what-if of "Understanding Stragglers in Large Model Training", OSDI '25,
for stages): per-micro-batch compute ``t_s = compute_s / m``. A GPipe/1F1B step's critical path
holds every stage once (fill and drain) and ``m − 1`` more micro-batches of the slowest stage,
``T ≈ Σ_s t_s + (m − 1)·t_max``; with every stage at the mean, ``T_bal = T − (m − 1)·(t_max −
t_mean)``. ``excess_fraction = t_max / t_mean − 1``.

Bubble vs straggler: a bubble is idle that the schedule itself imposes (and shrinks with more
micro-batches); an imbalanced stage is a stage whose own compute is larger, every step; a
straggler is a rank slower than the other ranks *of its own stage* (replicas), or a stage whose
compute varies from step to step — reported in ``replica_spread`` and ``step_cv``.

Schedule: ``PP:<stage><F|B|I|W><mb>`` annotations (``torch.distributed.pipelining`` runtime
schedules): several stage ids on one rank → ``interleaved``, ``I``/``W`` actions →
``zero-bubble``; ``Forward i``/``Backward i`` annotations: every rank runs all its forwards
before its first backward → ``GPipe``, else ``1F1B``; without annotations, the last stage's
receives before its first send: all ``m`` → ``GPipe``, one → ``1F1B``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from statistics import mean, median
from typing import Any

import numpy as np
import polars as pl

from kinetoscope.diagnosis.assembly import Job
from kinetoscope.diagnosis.extract import figures_of
from kinetoscope.diagnosis.pipeline_cuts import StepCut, placed
from kinetoscope.diagnosis.stage_order import hop_stages


@dataclass
class PipelineReport:
    """The ``pipeline`` key of the diagnosis (``to_dict``); ``None`` stands for "not a pipeline"."""

    schedule: str | None
    schedule_source: str
    stages: list[dict[str, Any]]
    microbatches: int | None
    bubble_fraction: float
    expected_bubble_fraction: float | None
    step_time_ms: float
    imbalance: dict[str, Any]
    steps_analysed: int
    replicas: int
    replica_issue: dict[str, Any] | None = None

    def stage_of(self) -> dict[int, int]:
        """Each rank's stage: the ranks of one stage do the same work, so they are each other's
        peers (``stragglers.causes.rank_cause``), where the other stages are not."""
        return {int(r): int(row["stage"]) for row in self.stages for r in row["ranks"]}

    def to_dict(self) -> dict[str, Any]:
        return {
            "schedule": self.schedule,
            "schedule_source": self.schedule_source,
            "num_stages": len(self.stages),
            "replicas": self.replicas,
            "microbatches": self.microbatches,
            "stages": self.stages,
            "bubble_fraction": _r(self.bubble_fraction),
            "expected_bubble_fraction": _r(self.expected_bubble_fraction),
            "step_time_ms": _r(self.step_time_ms),
            "steps_analysed": self.steps_analysed,
            "imbalance": self.imbalance,
            "replica_issue": self.replica_issue,
        }


def _r(x: float | None, nd: int = 4) -> float | None:
    return None if x is None else round(float(x), nd)


def expected_bubble(p: int, m: int, chunks: int = 1) -> float:
    """Idle share of a balanced GPipe/1F1B step: ``(p − 1) / (v·m + p − 1)`` with ``v`` model
    chunks per rank (``v = 1``: GPipe, 1F1B; ``v > 1``: interleaved 1F1B, Narayanan et al. 2021)."""
    return (p - 1) / (chunks * m + p - 1) if p > 1 and m > 0 else 0.0


def _stage_order(cuts: dict[int, list[StepCut]]) -> list[list[int]] | None:
    """Stages as lists of ranks (see the module docstring), or None when the ranks do not look
    like a pipeline (some rank without point-to-point traffic, or no first/other stage split)."""
    first: list[int] = []
    rest: list[tuple[float, int]] = []
    step_start: dict[int, int] = {}  # earliest start of each step over the ranks (aligned clock)
    for cs in cuts.values():
        for c in cs:
            step_start[c.step] = min(step_start.get(c.step, c.start), c.start)
    for r, cs in cuts.items():
        if not cs or median(c.sends + c.recvs for c in cs) < 1:
            return None
        opens = [c.first_op for c in cs if c.first_op]
        if opens.count("send") > len(opens) / 2:
            first.append(r)
        else:
            rest.append((_wait_key(cs, step_start), r))
    if not first or not rest:
        return None
    d = len(first)
    rest.sort()
    if len(rest) % d:
        return None  # the other ranks do not split into groups of d replicas
    stages = [sorted(first)]
    ranks = [r for _, r in rest]
    stages += [sorted(ranks[i : i + d]) for i in range(0, len(ranks), d)]
    return stages


def _p2p_groups(colls: dict[int, pl.DataFrame]) -> dict[int, list[int]]:
    """Per rank, the recorded ranks of the group of its send/recv (a pipeline group lists its
    ranks in stage order), when it has one."""
    out: dict[int, list[int]] = {}
    for r, c in colls.items():
        if c.is_empty() or "pg_ranks" not in c.columns:
            continue
        g = c.filter((pl.col("coll") == "sendrecv") & pl.col("pg_ranks").is_not_null())["pg_ranks"]
        if g.len():
            out[r] = [int(x) for x in str(g.mode().sort().first()).split(",")]
    return out


def _stages_from_p2p(cuts: dict[int, list[StepCut]], groups: dict[int, list[int]]) -> list[list[int]] | None:
    """Stages from the pipeline groups: a rank's stage is its position in its send/recv group
    (reversed when the groups' last ranks are the ones opening their steps with a send)."""
    if set(groups) != set(cuts):
        return None
    lists = {tuple(g) for g in groups.values()}
    p = {len(g) for g in lists}
    seen = [r for g in lists for r in g]
    if len(p) != 1 or min(p) < 2 or len(seen) != len(set(seen)) or set(seen) != set(cuts):
        return None
    n = p.pop()
    stages = [sorted(g[s] for g in lists) for s in range(n)]
    if _opens_with_send(cuts, stages[-1]) > _opens_with_send(cuts, stages[0]):
        stages.reverse()
    return stages


def _opens_with_send(cuts: dict[int, list[StepCut]], ranks: list[int]) -> float:
    """Share of the ranks' steps that open with a send (the first stage has its input)."""
    opens = [c.first_op for r in ranks for c in cuts[r] if c.first_op]
    return opens.count("send") / len(opens) if opens else 0.0


def _stages_from_links(cuts: dict[int, list[StepCut]], links: pl.DataFrame | None) -> list[list[int]] | None:
    """Stages by transfer hops from the ranks opening their steps with a send (``links``:
    ``whatif.p2p.p2p_links``, instances ``p2p@<src>><dst>#<k>``), or None unless every rank is
    reached and every stage holds as many ranks as the first."""
    if links is None or links.is_empty():
        return None
    near: dict[int, set[int]] = {}
    for inst in links["instance"].unique().to_list():
        a, b = (int(x) for x in inst[4:].split("#", 1)[0].split(">", 1))
        near.setdefault(a, set()).add(b)
        near.setdefault(b, set()).add(a)
    heads = [r for r in cuts if _opens_with_send(cuts, [r]) > 0.5]
    stage_of = hop_stages(heads, near)
    if not heads or set(stage_of) != set(cuts):
        return None
    stages = [sorted(r for r, s in stage_of.items() if s == k) for k in range(max(stage_of.values()) + 1)]
    return stages if len(stages) > 1 and all(len(s) == len(heads) for s in stages) else None


def _stages_from_groups(
    cuts: dict[int, list[StepCut]], colls: dict[int, pl.DataFrame]
) -> list[list[int]] | None:
    """Stages from the collective groups (data-parallel groups are the stages: each holds one
    replica of a stage): the groups that split the ranks into blocks of the first stage's size,
    one of them the first stage, the others ordered by their median first receive (a whole
    stage's, so a slowed replica moves no rank into another stage)."""
    first = sorted(r for r in cuts if _opens_with_send(cuts, [r]) > 0.5)
    if not first:
        return None
    blocks: set[tuple[int, ...]] = set()
    for frame in colls.values():
        if "group" in frame.columns and frame.height:
            for g in frame.filter(pl.col("coll") != "sendrecv")["group"].drop_nulls().unique().to_list():
                if g != "*":
                    blocks.add(tuple(sorted(int(x) for x in g.split(","))))
    cand = [b for b in blocks if len(b) == len(first)]
    covered = [r for b in cand for r in b]
    if not cand or sorted(covered) != sorted(cuts) or tuple(first) not in cand:
        return None
    step_start: dict[int, int] = {}
    for cs in cuts.values():
        for c in cs:
            step_start[c.step] = min(step_start.get(c.step, c.start), c.start)
    rest = []
    for b in cand:
        if b == tuple(first):
            continue
        rest.append((_wait_key([c for r in b for c in cuts[r]], step_start), list(b)))
    rest.sort()
    return [list(first)] + [b for _, b in rest]


def _wait_key(cs: list[StepCut], step_start: dict[int, int]) -> float:
    """Where a rank (or a stage's ranks) sits in the pipeline: the median of its steps' waits
    for upstream (``StepCut.upstream_wait``), else of its first receive's completion from the
    job's step start."""
    waits = [c.upstream_wait for c in cs if c.upstream_wait is not None]
    if waits:
        return float(median(waits))
    ends = [c.first_recv_end - step_start[c.step] for c in cs if c.first_recv_end is not None]
    return float(median(ends)) if ends else float("inf")


def _schedule(cuts: dict[int, list[StepCut]], last: list[int], m: int | None) -> tuple[str | None, str]:
    """The schedule as recognised and what it was recognised from (module docstring)."""
    all_cuts = [c for cs in cuts.values() for c in cs]
    if any(c.stage_ids > 1 for c in all_cuts):
        return (
            "interleaved-zero-bubble" if any(c.split_backward for c in all_cuts) else "interleaved"
        ), "PP annotations"
    if any(c.split_backward for c in all_cuts):
        return "zero-bubble", "PP annotations"
    orders = [c.order for c in all_cuts if c.order]
    if orders:
        gpipe = all(re.fullmatch(r"F*B*", o) for o in orders)
        return ("GPipe" if gpipe else "1F1B"), "micro-batch annotations"
    lead = [c.leading_recvs for r in last for c in cuts[r]]
    if m and lead:
        k = median(lead)
        if k >= m:
            return "GPipe", "last stage's receives before its first send"
        if k <= 1:
            return "1F1B", "last stage's receives before its first send"
    return None, "not recognised"


def _microbatches(cuts: dict[int, list[StepCut]], stage0: list[int]) -> int | None:
    """Micro-batches per step: distinct ids of the F marks, else the first stage's receives
    (one gradient per micro-batch)."""
    marked = [c.microbatches for cs in cuts.values() for c in cs if c.microbatches]
    if marked:
        return int(median(marked))
    recvs = [c.recvs for r in stage0 for c in cuts[r]]
    return int(median(recvs)) if recvs and median(recvs) >= 1 else None


def analyze_pipeline(
    job: Job,
    steps: pl.DataFrame,
    offsets: dict[int, int],
    colls: dict[int, pl.DataFrame] | None = None,
    links: pl.DataFrame | None = None,
) -> PipelineReport | None:
    """The pipeline analysis of ``job`` (``steps``: ``breakdown.step_table``; ``offsets``: the
    clock alignment's per-rank ns offsets; ``colls``: the collectives with their process
    ``group``, ``groups.assign_groups``; ``links``: the transfers paired with their peers,
    ``whatif.p2p.p2p_links``), or None when the job is not pipeline-parallel."""
    if len(job.traces) < 2 or steps.is_empty():
        return None
    ranks = {r: figures_of(t).pipe for r, t in job.traces.items()}
    if any(rc is None for rc in ranks.values()):
        return None
    common = (
        steps.group_by("step")
        .agg(pl.col("rank").n_unique().alias("n"))
        .filter(pl.col("n") == len(job.traces))["step"]
    )
    st = steps.filter(pl.col("step").is_in(common.implode()))
    if st.is_empty():
        return None
    cuts: dict[int, list[StepCut]] = {r: [] for r in job.traces}
    for r, step, local in st.select("rank", "step", "local_step").iter_rows():
        own = (ranks[r] or {}).get(int(local))
        if own is not None:  # every window of the job's table is one of the rank's own steps
            cuts[r].append(placed(own, r, step, int(offsets.get(r, 0))))
    # the first step holds one-off work (shape exchange, warm caches): leave it out when others remain
    if len(common) > 2:
        first = int(common.min())  # type: ignore[arg-type]
        cuts = {r: [c for c in cs if c.step != first] for r, cs in cuts.items()}
    if any(not cs or median(c.sends + c.recvs for c in cs) < 1 for cs in cuts.values()):
        return None
    order = _stages_from_p2p(cuts, _p2p_groups(colls)) if colls else None
    order = order or _stages_from_links(cuts, links)
    if colls:
        order = order or _stages_from_groups(cuts, colls)
    order = order or _stage_order(cuts)
    if order is None:
        return None
    m = _microbatches(cuts, order[0])
    schedule, source = _schedule(cuts, order[-1], m)
    return _report(cuts, order, m, schedule, source)


def _stage_rows(cuts: dict[int, list[StepCut]], order: list[list[int]]) -> list[dict[str, Any]]:
    rows = []
    for s, ranks in enumerate(order):
        comp = [median(c.compute_ns for c in cuts[r]) for r in ranks]
        bub = [median(c.idle / c.duration for c in cuts[r] if c.duration) for r in ranks]
        per_step = [c.compute_ns for r in ranks for c in cuts[r]]
        fwd = [x for r in ranks for c in cuts[r] for x in c.fwd_ns]
        bwd = [x for r in ranks for c in cuts[r] for x in c.bwd_ns]
        rows.append(
            {
                "stage": s,
                "ranks": ranks,
                # the median replica: one slow replica is a replica issue (``replica_spread``), not
                # its stage's compute nor the pipeline's bubble
                "compute_ms": round(median(comp) / 1e6, 3),
                "bubble_fraction": round(median(bub), 4),
                "fwd_ms_per_microbatch": round(median(fwd) / 1e6, 3) if fwd else None,
                "bwd_ms_per_microbatch": round(median(bwd) / 1e6, 3) if bwd else None,
                "replica_spread": round(max(comp) / min(comp) - 1.0, 4)
                if len(comp) > 1 and min(comp) > 0
                else None,
                "step_cv": round(float(np.std(per_step) / np.mean(per_step)), 4)
                if len(per_step) > 1 and np.mean(per_step) > 0
                else None,
            }
        )
    return rows


REPLICA_SPREAD = 0.2
WORKER_SPREAD = 0.5


def _replica_issue(cuts: dict[int, list[StepCut]], order: list[list[int]]) -> dict[str, Any] | None:
    """A worker issue, not stage imbalance, or None: the ranks whose own compute is
    ``WORKER_SPREAD`` (50 %) or more above their stage's median replica (a slowed worker), else
    ``REPLICA_SPREAD`` (20 %) or more when such ranks are found in every stage (a slowed
    replica). Ranks of a loaded host differ by 20-30 % now and then: in some stages only."""
    slow: list[dict[str, Any]] = []
    for s, ranks in enumerate(order):
        comp = {r: median(c.compute_ns for c in cuts[r]) for r in ranks if cuts[r]}
        if len(comp) < 2:
            continue
        mid = median(comp.values())
        for r, v in comp.items():
            if mid > 0 and v / mid - 1.0 >= REPLICA_SPREAD:
                slow.append({"rank": r, "stage": s, "excess_fraction": round(v / mid - 1.0, 4)})
    strong = [x for x in slow if x["excess_fraction"] >= WORKER_SPREAD]
    if strong:
        slow = strong
    elif {x["stage"] for x in slow} != set(range(len(order))):
        return None
    if not slow:
        return None
    return {"ranks": sorted(x["rank"] for x in slow), "per_rank": slow}


def _report(
    cuts: dict[int, list[StepCut]], order: list[list[int]], m: int | None, schedule: str | None, source: str
) -> PipelineReport:
    rows = _stage_rows(cuts, order)
    by_step: dict[int, int] = {}
    for cs in cuts.values():
        for c in cs:
            by_step[c.step] = max(by_step.get(c.step, 0), c.duration)
    t_ms = median(by_step.values()) / 1e6
    comp = [row["compute_ms"] for row in rows]
    c_mean, c_max = mean(comp), max(comp)
    slowest = comp.index(c_max)
    mm = m or 1
    balanced = t_ms - (mm - 1) / mm * (c_max - c_mean)
    p = len(order)
    imbalance = {
        "slowest_stage": slowest,
        "slowest_ranks": order[slowest],
        "excess_fraction": round(c_max / c_mean - 1.0, 4) if c_mean > 0 else 0.0,
        "stage_compute_ms": comp,
        "mean_stage_compute_ms": round(c_mean, 3),
        "est_step_time_balanced_ms": round(balanced, 3),
        "est_speedup_balanced": round(t_ms / balanced, 4) if balanced > 0 else None,
    }
    return PipelineReport(
        replica_issue=_replica_issue(cuts, order),
        schedule=schedule,
        schedule_source=source,
        stages=rows,
        microbatches=m,
        bubble_fraction=mean(row["bubble_fraction"] for row in rows),
        expected_bubble_fraction=expected_bubble(p, m) if m and schedule in ("GPipe", "1F1B", None) else None,
        step_time_ms=t_ms,
        imbalance=imbalance,
        steps_analysed=len(by_step),
        replicas=len(order[0]),
    )
