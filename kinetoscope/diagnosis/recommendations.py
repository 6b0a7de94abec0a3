"""Recommendations tied to measured causes. Every recommendation carries the numbers that
triggered it (``evidence``); nothing is recommended without them.

Each is ``{"id", "severity", "title", "evidence", "action"}``; severity is ``high`` | ``medium``
| ``low`` | ``info``. Thresholds (fractions of the summed step time of all ranks and steps):

=====================  ==========================================================  ==========
id                     trigger                                                     severity
=====================  ==========================================================  ==========
straggler-persistent   straggler kind ``persistent`` or ``mixed``                  high if lost >= 10 %, else medium
straggler-intermittent straggler kind ``intermittent`` or ``rotating``             medium if lost >= 10 %, else low (hierarchical SGD not worth it); rotating: high if lost >= 10 % (the plan first), else medium
sync-jitter            no straggler, but arrival skew (``skew_fraction``) >= 15 %    low
launch-bound           GPU idle waiting on kernel launches >= 10 % of step time     high >= 30 %, medium >= 15 %, else low
exposed-comm           collective transfer time not hidden by compute >= 10 %       high >= 25 %, else medium
dataloader-stall       DataLoader ``__next__`` time >= 5 % of step time             medium >= 15 %, else low
attention-math-path    math-path SDPA or matmul-softmax-matmul, no fused kernels    medium
recompilation          TorchDynamo recompiles or compiles inside the trace window   high if compile time >= 10 % of the window, else medium
low-mfu                MFU < 30 %                                                  high < 10 %, else medium
pipeline-bubble        pipeline stages idle >= 15 % of the step                    high >= 40 %, medium >= 25 %, else low
pipeline-imbalance     slowest stage computes >= 20 % above the mean stage         by balanced speed-up: high >= 1.25x, medium >= 1.10x
uneven-inputs          ranks ran different numbers of steps/collectives            high if a collective hangs, else medium >= 5 % idle
=====================  ==========================================================  ==========

One rule function per row, in ``RULES`` (docs/diagnosis.md sections 7 and 11).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import polars as pl

from kinetoscope.diagnosis.assembly import Job
from kinetoscope.diagnosis.detectors import AttentionFinding, CompileFinding, pooled_launch_gaps
from kinetoscope.diagnosis.extract import figures_of
from kinetoscope.diagnosis.hsgd import plan as hsgd_plan
from kinetoscope.diagnosis.mfu import MFUResult
from kinetoscope.diagnosis.stragglers.verdict import StragglerReport

SEVERITY_ORDER = {"high": 0, "medium": 1, "low": 2, "info": 3}

# One recommendation: {"id", "severity", "title", "evidence", "action"} (the JSON contract).
Recommendation = dict[str, Any]


def _rec(rid: str, severity: str, title: str, evidence: dict[str, Any], action: str) -> dict[str, Any]:
    return {"id": rid, "severity": severity, "title": title, "evidence": evidence, "action": action}


def _r(x: float | None, nd: int = 3) -> float | None:
    """Round for display: ``nd`` decimals, or ``nd`` significant digits below 1."""
    if x is None:
        return None
    x = float(x)
    return round(x, nd) if abs(x) >= 1 or x == 0 else float(f"{x:.{nd}g}")


def _ms(us: float | None) -> float | None:
    return None if us is None else round(float(us) / 1000.0, 3)


@dataclass(frozen=True)
class RuleInput:
    """Everything a rule may look at: the job, its per-rank/per-step breakdown and the analyses
    built on it. ``total`` is the summed step time of all ranks and steps (µs), the denominator
    of every ``*_fraction``; ``gpu`` is whether any rank ran on an accelerator.

    Measurements are typed fields: the optional analyses of docs/diagnosis.md section 11 (given
    by ``diagnose``, each in its JSON form and ``None`` when the job does not show the problem),
    and ``cached_property`` measurements computed from the fields above (CONTRIBUTING.md,
    "Adding a measurement to a recommendation")."""

    job: Job
    breakdown: pl.DataFrame
    stragglers: StragglerReport
    mfu: MFUResult
    attention: dict[int, AttentionFinding]
    compile_: dict[int, CompileFinding]
    comm_by_type: dict[str, float] | None = None
    pipeline: dict[str, Any] | None = None  # diagnosis.pipeline (``pipeline`` document key)
    uneven_inputs: dict[str, Any] | None = None  # diagnosis.uneven (``uneven_inputs`` key)
    recompilation: dict[str, Any] | None = None  # diagnosis.recompile.recompilation_summary
    collective_bandwidth: dict[str, Any] | None = None  # diagnosis.bandwidth, per collective type

    @property
    def gpu(self) -> bool:
        return any(t.meta.device_type not in ("CPU", "UNKNOWN") for t in self.job.traces.values())

    @property
    def total(self) -> float:
        return float(self.breakdown["step_time(us)"].sum()) if self.breakdown.height else 0.0

    def frac(self, col: str) -> float:
        """Share of the summed step time spent in breakdown column ``col``."""
        total = self.total
        return float(self.breakdown[col].fill_null(0).sum()) / total if total > 0 else 0.0


Rule = Callable[[RuleInput], list[Recommendation]]


def _what_if(s: StragglerReport) -> dict[str, Any]:
    """The straggler what-if numbers every straggler recommendation carries."""
    return {
        "mean_step_time_ms": _ms(s.mean_step_time_us),
        "est_step_time_without_stragglers_ms": _ms(s.est_step_time_us),
        "lost_fraction": _r(s.lost_fraction or 0.0),
        "steps_analysed": s.steps_analysed,
        "straggled_steps": s.straggled_steps,
    }


def p2p_is_pipeline(ri: RuleInput) -> bool:
    """Whether the job is pipeline-parallel and point-to-point traffic is all its collectives:
    then arrival order at the send/recv pairs is the schedule (the bubble), not stragglers."""
    return ri.pipeline is not None and set(ri.comm_by_type or {"sendrecv": 1.0}) <= {"sendrecv"}


def _together(groups: list[dict[str, Any]]) -> str:
    """How ranks named as a group (``stragglers.groups``) were late: together, as a set."""
    return "; ".join(
        f"arrive late together (ranks {', '.join(map(str, g['ranks']))}: the {len(g['ranks'])} latest "
        f"at {g['latest_together']}/{g['instances']} collectives, chance {100 * g['chance']:.2g}%)"
        for g in groups
    )


def straggler_persistent(ri: RuleInput) -> list[Recommendation]:
    """``straggler-persistent``: the same rank(s) make the others wait (seed 000)."""
    s = ri.stragglers
    if s.kind not in ("persistent", "mixed") or p2p_is_pipeline(ri):
        return []
    lost = s.lost_fraction or 0.0
    pr = s.per_rank.filter(pl.col("rank").is_in(s.ranks))
    who = ", ".join(f"rank {r}" + (f" (host {s.hosts.get(r)})" if s.hosts.get(r) else "") for r in s.ranks)
    return [
        _rec(
            "straggler-persistent",
            "high" if lost >= 0.10 else "medium",
            f"Persistent straggler: {who} "
            + (
                "has collectives that end late after its peers' (slow link / its collectives' transfer)"
                if all((s.causes.get(r) or {}).get("explained_by") == "slow_link" for r in s.ranks)
                else _together(s.groups)
                if s.groups
                else "arrives last at the collectives far more often than chance"
            ),
            {
                **_what_if(s),
                "ranks": s.ranks,
                "hosts": {str(r): s.hosts.get(r) for r in s.ranks},
                "late_steps": dict(
                    zip(map(str, pr["rank"].to_list()), pr["late_steps"].to_list(), strict=True)
                ),
                "mean_lateness_ms": dict(
                    zip(
                        map(str, pr["rank"].to_list()),
                        [_ms(v) for v in pr["mean_lateness(us)"].to_list()],
                        strict=True,
                    )
                ),
                "compute_vs_median": dict(
                    zip(
                        map(str, pr["rank"].to_list()),
                        [_r(v) for v in pr["compute_vs_median"].to_list()],
                        strict=True,
                    )
                ),
                "last_at_collectives": {
                    str(r): f"{k}/{n}"
                    for r, k, n in zip(
                        pr["rank"].to_list(),
                        pr["last_count"].to_list(),
                        pr["instances"].to_list(),
                        strict=True,
                    )
                },
                "p_value": dict(
                    zip(map(str, pr["rank"].to_list()), [_r(v) for v in pr["p_value"].to_list()], strict=True)
                ),
                "share_of_waiting": dict(
                    zip(
                        map(str, pr["rank"].to_list()),
                        [_r(v) for v in pr["imposed_share"].to_list()],
                        strict=True,
                    )
                ),
                "cause": s.cause,
            },
            f"Inspect {who}: the same "
            + (
                "ranks are late together every time (one slow node or switch?)"
                if s.groups
                else "rank is late every time"
            )
            + ", so it is that host, device or link, not "
            "random noise. Check its GPU/CPU clocks and throttling (nvidia-smi -q -d PERFORMANCE, "
            "dmesg), other processes on the host, its data pipeline and NIC (slow link: its link "
            "error counters and an nccl-tests run on its pairs); compare its kernel "
            "times with a healthy rank (compute_vs_median). If it cannot be fixed, exclude/replace "
            "the node. Hierarchical SGD does NOT help a persistent straggler: it slows the same "
            "subgroup at every synchronisation.",
        )
    ]


HSGD_LIMITS = (
    "Limits (PyTorch straggler-mitigation post): it only helps non-persistent, low-frequency "
    "stragglers (if ~30 % of workers are randomly slow at every step, most subgroups are still "
    "slowed); it averages parameters instead of overlapping gradient all-reduce with backward, "
    "so it pays off only when stragglers cost more than ~10 %; use a warm-up of synchronous "
    "steps for accuracy."
)


def late_rank_frequency(ri: RuleInput) -> float:
    """Mean share of the ranks that are late in a straggled step (0 when no step straggled)."""
    s = ri.stragglers
    if not s.per_step.height:
        return 0.0
    late_per_step = s.per_step.filter(pl.col("late_ranks").list.len() > 0)["late_ranks"].list.len()
    nr = max(len(ri.job.traces), 1)
    return float(late_per_step.mean()) / nr if late_per_step.len() else 0.0  # type: ignore[arg-type]


def _hsgd_plan(ri: RuleInput, late_share: float) -> dict[str, Any]:
    """The hierarchical-SGD plan for this job's hosts and stragglers (``hsgd.plan``)."""
    s, bd = ri.stragglers, ri.breakdown
    overlapped = (
        float((bd["comm(us)"].fill_null(0) - bd["exposed_comm(us)"].fill_null(0)).clip(lower_bound=0).sum())
        / ri.total
        if ri.total > 0
        else 0.0
    )
    rate = None
    if s.per_step.height and s.steps_analysed:
        late = int(s.per_step["late_ranks"].list.len().sum())
        rate = late / (s.steps_analysed * max(len(ri.job.traces), 1))
    return hsgd_plan(ri.job.hosts(), s.lost_fraction or 0.0, late_share, overlapped, rate)


def straggler_intermittent(ri: RuleInput) -> list[Recommendation]:
    """``straggler-intermittent``: different ranks late at different times; hierarchical SGD
    when it is worth it (seed 000)."""
    s = ri.stragglers
    if s.kind not in ("intermittent", "rotating") or p2p_is_pipeline(ri):
        return []
    lost = s.lost_fraction or 0.0
    worth = lost >= 0.10
    rotating = s.kind == "rotating"  # the replay's verdict: stalls moving between ranks
    share = 1 / max(len(ri.job.traces), 1) if rotating else late_rank_frequency(ri)
    frequent = share >= 0.3 and not rotating
    limits = HSGD_LIMITS
    plan = _hsgd_plan(ri, share) if worth and not frequent else None
    if worth and not frequent:
        if len(s.ranks) == 1:
            who = (
                f"Only rank {s.ranks[0]} was late, in some steps but not most (if it stays the only "
                "one, inspect its host as for a persistent straggler)"
            )
        else:
            who = "Stragglers hit different ranks at different times"
        action = (
            who + ": use hierarchical SGD or post-local "
            "SGD so a random straggler only delays a small group: register "
            "post_localSGD_hook(PostLocalSGDState(subgroup=..., start_localSGD_iter=warmup)) and wrap "
            "the optimizer in PostLocalSGDOptimizer(averager=HierarchicalModelAverager("
            "period_group_size_dict=OrderedDict([(2, 8), (4, world_size)]), warmup_steps=warmup)). " + limits
        )
        if plan is not None and plan["applies"]:
            action += (
                f" Plan for this job ({plan['hosts']} hosts x {plan['ranks_per_host'][0]} ranks): "
                f"period_group_size_dict {plan['period_group_size_dict']}, warmup_steps {plan['warmup_steps']}, "
                f"expected gain up to {plan['expected_gain_fraction_max']:.0%} of step time, "
                f"{plan['expected_net_gain_fraction']:.0%} net of the lost backward overlap: {plan['code']}"
            )
        elif plan is not None:
            action += f" No hierarchical-SGD plan for this job: {plan['reason']}."
    elif frequent:
        action = (
            "Late ranks are too frequent for hierarchical SGD to help (most subgroups would still "
            "wait at each step). Find the common cause instead (shared storage or input pipeline, "
            "host contention, network congestion). " + limits
        )
    else:
        action = (
            "Stragglers cost less than ~10 % of step time: hierarchical/post-local SGD would likely "
            "lose more (no backward/communication overlap) than it gains. Watch the trend; find the "
            "cause of the occasional stalls (GC, I/O, checkpointing, data outliers). " + limits
        )
    if s.recurrent_ranks:
        action += f" Ranks {s.recurrent_ranks} recur among the late ranks: check them first."
    evidence: dict[str, Any] = {
        **_what_if(s),
        "late_ranks": s.ranks,
        "recurrent_ranks": s.recurrent_ranks,
        "frequent": frequent,
    }
    if plan is not None and worth and not frequent:
        evidence["hsgd_plan"] = plan
    return [
        _rec(
            "straggler-intermittent",
            "high" if rotating and worth else "medium" if worth or rotating else "low",
            "Rotating stragglers: the slowdown moves between ranks from step to step"
            if rotating
            else "Intermittent stragglers: different ranks arrive late in some steps"
            if len(s.ranks) != 1
            else f"Intermittent straggler: rank {s.ranks[0]} arrives late in some steps",
            evidence,
            action,
        )
    ]


def sync_jitter(ri: RuleInput) -> list[Recommendation]:
    """``sync-jitter``: no straggler, but ranks reach the collectives at random times."""
    s = ri.stragglers
    if not (s.kind == "none" and (s.skew_fraction or 0.0) >= 0.15) or p2p_is_pipeline(ri):
        return []
    action = "No rank stands out, but ranks reach the collectives at randomly different times. " + (
        "Reduce host-side jitter: CUDA graphs make launch timing deterministic "
        '(torch.compile(mode="reduce-overhead")), keep data-loader workers off the training '
        "cores, avoid per-step host syncs (.item(), printing)."
        if ri.gpu
        else "On CPU this is usually oversubscription: give each rank dedicated cores "
        "(torch.set_num_threads / OMP_NUM_THREADS per rank, fewer ranks per host, taskset/numactl) "
        "and keep other work off the host."
    )
    return [
        _rec(
            "sync-jitter",
            "low",
            "Arrival jitter at collectives without a consistent straggler",
            {
                "skew_fraction": _r(s.skew_fraction),
                "noise_sigma_ms": _ms(s.sigma_us),
                "steps_analysed": s.steps_analysed,
            },
            action,
        )
    ]


def _cuda_graph_gain(ri: RuleInput) -> dict[str, Any]:
    """What capturing the step in a CUDA graph would give: the graph replays its kernels
    back to back, so the host-bound gaps go (one launch per graph remains). Per step, over all
    ranks: ``est_step_time_cuda_graph_ms = mean step − mean launch gap``."""
    bd = ri.breakdown
    median_gap, n_gaps = pooled_launch_gaps([figures_of(t).launch_gaps for t in ri.job.traces.values()])
    steps = max(bd.height, 1)
    mean_step = float(bd["step_time(us)"].mean() or 0.0)  # type: ignore[arg-type]
    mean_gap = float(bd["launch_gap(us)"].fill_null(0).mean() or 0.0)  # type: ignore[arg-type]
    graph = mean_step - mean_gap
    return {
        "median_launch_gap_us": _r(median_gap, 2) if median_gap is not None else None,
        "host_bound_gaps_per_step": _r(n_gaps / steps, 1),
        "est_step_time_cuda_graph_ms": _ms(graph),
        "est_speedup_cuda_graph": _r(mean_step / graph) if graph > 0 else None,
    }


def launch_bound(ri: RuleInput) -> list[Recommendation]:
    """``launch-bound``: the GPU waits for the host to launch kernels (seed 001)."""
    if not (ri.gpu and ri.total > 0):
        return []
    breakdown = ri.breakdown
    lg = ri.frac("launch_gap(us)")
    if lg < 0.10:
        return []
    kernels = breakdown["n_kernels"].fill_null(0)
    evidence: dict[str, Any] = {
        "launch_gap_fraction": _r(lg),
        "gpu_idle_fraction": _r(ri.frac("idle(us)")),
        "kernels_per_step": _r(float(kernels.sum()) / max(breakdown.height, 1), 1),
    }
    try:  # HTA-style launch statistics (kinetoscope.analysis.launch_stats)
        from kinetoscope.analysis.launch_stats import kernel_launch_summary

        ls = kernel_launch_summary(list(ri.job.traces.values()))
        for col, key in (
            ("short_kernels_pctg", "short_kernels_pctg"),
            ("cpu_duration_mean(us)", "launch_cpu_mean_us"),
            ("gpu_duration_mean(us)", "kernel_gpu_mean_us"),
            ("launch_delay_p50(us)", "launch_delay_p50_us"),
        ):
            if ls.height and col in ls.columns:
                evidence[key] = _r(float(ls[col].mean()), 2)  # type: ignore[arg-type]
    except ImportError:  # pragma: no cover - the analysis module is part of the package
        pass
    evidence |= _cuda_graph_gain(ri)
    return [
        _rec(
            "launch-bound",
            "high" if lg >= 0.30 else ("medium" if lg >= 0.15 else "low"),
            "CPU launch-bound: the GPU waits for the host to launch kernels",
            evidence,
            "Cut per-kernel launch overhead: capture the step in CUDA graphs with "
            'torch.compile(model, mode="reduce-overhead") (or torch.cuda.CUDAGraph / '
            "torch.cuda.make_graphed_callables for static parts), fuse small ops (torch.compile "
            "default mode), and give each kernel more work (larger batch). Remove host syncs "
            "(.item(), .cpu(), data-dependent shapes) that stall the launch queue.",
        )
    ]


def _exposed_comm_action(top: str) -> str:
    """The exposed-communication advice for the collective type with the most time."""
    if top in ("allgather", "reducescatter"):
        return (
            "Sharded data parallel (FSDP) all-gathers/reduce-scatters are exposed: prefetch them "
            "under compute (FSDP backward_prefetch=BackwardPrefetch.BACKWARD_PRE, forward_prefetch=True; "
            "FSDP2 reshard_after_forward=False for the last blocks), use larger wrapping units so "
            "fewer, bigger collectives run, and communicate in bf16 (MixedPrecision(param_dtype="
            "torch.bfloat16, reduce_dtype=torch.bfloat16))."
        )
    if top in ("alltoall", "sendrecv", "broadcast", "gather", "scatter"):
        return (
            f"{top} traffic is exposed: overlap it with compute (pipeline the input distribution, "
            "e.g. TorchRec's TrainPipelineSparseDist for embedding all-to-alls; issue it async and "
            "wait later), and send fewer bytes (fp16/bf16 or quantized communication)."
        )
    return (
        "Overlap gradient all-reduce with backward and send fewer bytes: tune "
        "DistributedDataParallel(bucket_cap_mb=...) (default 25 MB; smaller buckets start "
        "communicating earlier in backward, larger ones cut per-collective overhead), set "
        "gradient_as_bucket_view=True (no copy into buckets), and compress gradients with a "
        "comm hook: ddp.register_comm_hook(process_group, "
        "torch.distributed.algorithms.ddp_comm_hooks.default_hooks.bf16_compress_hook) "
        "(or fp16_compress_hook), which halves the bytes on the wire."
    )


SMALL_MESSAGE_BYTES = 1 << 20


def comm_decision(bw: dict[str, Any] | None) -> tuple[str, str] | None:
    """Compress vs overlap vs slow link, from the top collective's sizes and bus bandwidth
    (``bandwidth.collective_bandwidth``): messages under 1 MiB are latency-bound (fewer, larger
    buckets); a median bus bandwidth under half the job's own 90th percentile means the same
    transfer runs at very different speeds (a slow or shared link); else bandwidth-bound
    (send fewer bytes, overlap more)."""
    if not bw:
        return None
    if bw["bytes_median"] < SMALL_MESSAGE_BYTES:
        return "latency-bound", (
            f"Messages are small ({bw['bytes_median']:,} B median per collective, bus bandwidth "
            f"{bw['busbw_GBps']} GB/s): per-collective latency dominates, so send fewer, larger ones "
            "(raise bucket_cap_mb) rather than compressing."
        )
    if bw["busbw_GBps"] < 0.5 * bw["busbw_GBps_p90"]:
        return "slow-link", (
            f"The same collective runs at very different speeds (bus bandwidth median {bw['busbw_GBps']} "
            f"vs p90 {bw['busbw_GBps_p90']} GB/s): suspect a slow or shared link; run nccl-tests on the "
            "ranks' pairs before tuning the job."
        )
    return "bandwidth-bound", (
        f"Transfers are bandwidth-bound ({bw['bytes_median']:,} B per collective at {bw['busbw_GBps']} GB/s "
        "bus bandwidth, as nccl-tests define it): send fewer bytes or hide them under compute."
    )


def exposed_comm(ri: RuleInput) -> list[Recommendation]:
    """``exposed-comm``: collective transfer time not hidden behind compute (seed 004)."""
    breakdown, total = ri.breakdown, ri.total
    if not (total > 0 and breakdown["comm(us)"].sum() > 0):
        return []
    exposed = breakdown.select(
        (pl.col("exposed_comm(us)") - pl.col("sync_wait(us)")).clip(lower_bound=0).sum()
    ).item()
    ef = float(exposed) / total
    if ef < 0.10:
        return []
    comm = float(breakdown["comm(us)"].sum())
    shares = {k: round(v, 3) for k, v in sorted((ri.comm_by_type or {}).items(), key=lambda kv: -kv[1])}
    top = next(iter(shares), "allreduce")
    if top == "sendrecv" and ri.pipeline is not None:
        return []  # a pipeline's send/recv waits are its bubble: pipeline-bubble reports them
    action = _exposed_comm_action(top)
    bw = ri.collective_bandwidth or {}
    decision = comm_decision(bw.get(top))
    if decision:
        action = decision[1] + " " + action
    split = len(ri.job.traces) > 1
    if not split:
        action = (
            "Only one rank's trace: waiting for other ranks cannot be separated from transfer, so "
            "part of this may be stragglers elsewhere; load all ranks to tell. " + action
        )
    return [
        _rec(
            "exposed-comm",
            ("high" if ef >= 0.25 else "medium") if split else "low",
            "Communication is exposed: collective transfer time is not hidden behind compute",
            {
                "exposed_transfer_fraction": _r(ef),
                "comm_fraction": _r(comm / total),
                "sync_wait_fraction": _r(ri.frac("sync_wait(us)")),
                "transfer_fraction": _r(ri.frac("transfer(us)")),
                "overlap_fraction_of_comm": _r(
                    1.0 - float(breakdown["exposed_comm(us)"].sum()) / comm if comm else None
                ),
                "comm_time_by_collective": shares,
                "wait_vs_transfer_separable": split,
                **(
                    {"collective_bandwidth": bw, "comm_decision": decision[0] if decision else None}
                    if bw
                    else {}
                ),
            },
            action,
        )
    ]


def dataloader_stall(ri: RuleInput) -> list[Recommendation]:
    """``dataloader-stall``: the loop waits on DataLoader ``__next__``."""
    breakdown = ri.breakdown
    if not ri.total > 0:
        return []
    dl = ri.frac("dataloader(us)")
    if dl < 0.05:
        return []
    worst = (
        breakdown.group_by("rank")
        .agg((pl.col("dataloader(us)").sum() / pl.col("step_time(us)").sum()).alias("f"))
        .sort("f", descending=True)
    )
    return [
        _rec(
            "dataloader-stall",
            "medium" if dl >= 0.15 else "low",
            "Data-loader stalls: the training loop waits for the next batch",
            {
                "dataloader_fraction": _r(dl),
                "dataloader_ms_per_step": _ms(float(breakdown["dataloader(us)"].mean())),  # type: ignore[arg-type]
                "worst_rank": int(worst["rank"][0]),
                "worst_rank_fraction": _r(float(worst["f"][0])),
            },
            "Load batches in the background: DataLoader(num_workers=N (> 0; e.g. the CPU cores "
            "per rank), pin_memory=True, persistent_workers=True, prefetch_factor=2-4); move "
            "decoding/augmentation out of the training process or pre-process the data set.",
        )
    ]


def attention_math_path(ri: RuleInput) -> list[Recommendation]:
    """``attention-math-path``: attention on the unfused math path."""
    math = {r: f for r, f in ri.attention.items() if f.math_path}
    if not math:
        return []
    f0 = next(iter(math.values()))
    return [
        _rec(
            "attention-math-path",
            "medium",
            "Attention runs on the unfused math path instead of flash/memory-efficient kernels",
            {
                "ranks": sorted(math),
                "math_sdpa_ops": sum(f.math_sdpa_ops for f in math.values()),
                "matmul_softmax_matmul_patterns": sum(f.manual_patterns for f in math.values()),
                "math_time_ms_rank": _ms(f0.math_time_us),
                "fused_attention_ops": 0,
            },
            "Use torch.nn.functional.scaled_dot_product_attention (not matmul-softmax-matmul) with "
            "inputs the fused kernels accept: fp16/bf16 on GPU, head_dim <= 256 and a multiple of 8, "
            "is_causal=True instead of a dense causal attn_mask, contiguous q/k/v, no unsupported "
            "dropout/mask combinations. Check with `with torch.nn.attention.sdpa_kernel("
            "[SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION]):`, which raises when they "
            "cannot be used and says why.",
        )
    ]


def recompilation(ri: RuleInput) -> list[Recommendation]:
    """``recompilation``: torch.compile recompiles or compiles inside the window (seed 003)."""
    rec_ranks = {r: f for r, f in ri.compile_.items() if f.recompiles > 0 or f.compiles_in_window > 0}
    if not rec_ranks:
        return []
    f = max(rec_ranks.values(), key=lambda x: (x.recompiles, x.compile_time_us))
    spans = [sp for t in ri.job.traces.values() if (sp := t.span_ns())]
    window = max((sp[1] - sp[0]) / 1000.0 for sp in spans) if spans else 1.0
    window = window or 1.0
    share = f.compile_time_us / window
    evidence: dict[str, Any] = {
        "ranks": sorted(rec_ranks),
        "recompiles": f.recompiles,
        "compiles_in_window": f.compiles_in_window,
        "frames": sorted(f.frames),
        "compile_time_ms": _ms(f.compile_time_us),
        "compile_time_fraction_of_window": _r(share),
        "cache_lookups": f.cache_lookups,
    }
    summary = ri.recompilation
    where = ""
    if summary and summary["recompiles"]:
        rec = [e for e in summary["events"] if e["recompile"]]
        evidence["recompile_steps"] = summary["recompile_steps"]
        evidence["recompiles_detail"] = [
            {k: e[k] for k in ("rank", "compile_id", "step", "duration_ms")} for e in rec
        ]
        worst = max(rec, key=lambda e: e["duration_ms"] or 0.0)
        where = (
            f" Recompiles at step(s) {summary['recompile_steps']}: {summary['recompile_time_ms']} ms in all "
            f"(the longest, compile {worst['compile_id']} at step {worst['step']}, {worst['duration_ms']} ms)."
        )
    return [
        _rec(
            "recompilation",
            "high" if share >= 0.10 else "medium",
            "torch.compile recompiles during training",
            evidence,
            "Keep shapes static across steps (pad or bucket sequence lengths, DataLoader(drop_last=True)), "
            "or declare the varying dimension dynamic up front: torch._dynamo.mark_dynamic(tensor, dim) "
            "or torch.compile(..., dynamic=True). Run once with TORCH_LOGS=recompiles to see which guard "
            "fails; avoid Python scalars/branches that change per step inside the compiled region." + where,
        )
    ]


def low_mfu(ri: RuleInput) -> list[Recommendation]:
    """``low-mfu``: model FLOPs utilisation under 30 % (seed 002)."""
    mfu = ri.mfu
    if not (mfu.mfu is not None and mfu.mfu < 0.30):
        return []
    return [
        _rec(
            "low-mfu",
            "high" if mfu.mfu < 0.10 else "medium",
            f"Low model FLOPs utilisation ({100 * mfu.mfu:.2g} %)",
            {
                "mfu": _r(mfu.mfu, 4),
                "achieved_tflops_per_chip": _r((mfu.achieved_flops_per_chip or 0) / 1e12, 3),
                "peak_tflops_per_chip": _r((mfu.peak_flops_per_chip or 0) / 1e12, 1),
                "peak_source": mfu.peak_source,
                "step_time_ms": _r((mfu.step_time_s or 0) * 1000.0, 3),
                "flops_source": mfu.flops_source,
            },
            "Do more math per synchronisation: raise the per-device batch (or sequence length) until "
            "memory is full (a larger global batch raises MFU as long as step time grows less than "
            "proportionally), take fewer sync points per step (gradient accumulation under "
            "DDP no_sync(), no per-step .item()/host syncs), use bf16 autocast (or TF32 for fp32 "
            "matmuls), and address the other recommendations (stragglers, exposed communication, "
            "launch overhead) that leave the device idle.",
        )
    ]


def _bubble_at(p: int, m: int, chunks: int = 1) -> float:
    return round((p - 1) / (chunks * m + p - 1), 4) if p > 1 and m > 0 else 0.0


def pipeline_bubble(ri: RuleInput) -> list[Recommendation]:
    """``pipeline-bubble``: pipeline stages idle (fill, drain, waits) >= 15 % of the step (seed 001)."""
    pp = ri.pipeline
    if not pp or (pp["bubble_fraction"] or 0.0) < 0.15:
        return []
    b, p, m = float(pp["bubble_fraction"]), int(pp["num_stages"]), pp["microbatches"]
    t = float(pp["step_time_ms"])
    evidence: dict[str, Any] = {
        "bubble_fraction": b,
        "expected_bubble_fraction": pp["expected_bubble_fraction"],
        "schedule": pp["schedule"],
        "stages": p,
        "microbatches": m,
        "stage_bubble_fraction": {str(s["stage"]): s["bubble_fraction"] for s in pp["stages"]},
        "step_time_ms": t,
    }
    more = ""
    if m:
        target = -(-(p - 1) * 9 // 1)  # bubble <= 10 %: (p-1)/(m+p-1) <= 0.1  <=>  m >= 9 (p-1)
        evidence["expected_bubble_at"] = {str(k): _bubble_at(p, k) for k in (2 * m, 4 * m, target)}
        evidence["microbatches_for_10pct_bubble"] = target
        evidence["expected_bubble_interleaved_2_chunks"] = _bubble_at(p, m, 2)
        # same global batch cut into 2m micro-batches: each takes half as long
        evidence["est_step_time_2x_microbatches_ms"] = _r(t * (2 * m + p - 1) / (2 * (m + p - 1)))
        more = (
            f"With p = {p} stages and m = {m} micro-batches a GPipe/1F1B schedule idles "
            f"(p-1)/(m+p-1) = {_bubble_at(p, m):.0%} of the step; {2 * m} micro-batches would idle "
            f"{_bubble_at(p, 2 * m):.0%}, {target} (the 10 % point) {_bubble_at(p, target):.0%} "
            "(smaller micro-batches run less efficiently: keep them large enough to fill the device). "
        )
    gap = b - float(pp["expected_bubble_fraction"] or 0.0)
    if pp["expected_bubble_fraction"] is not None and gap > 0.10:
        more += (
            f"The measured idle is {gap:.0%} of the step above what the schedule alone explains: the "
            "rest is stage imbalance (see pipeline-imbalance), send/recv transfer, or host overhead. "
        )
    return [
        _rec(
            "pipeline-bubble",
            "high" if b >= 0.40 else ("medium" if b >= 0.25 else "low"),
            f"Pipeline bubble: stages idle {b:.0%} of the step waiting for each other",
            evidence,
            more + "Raise n_microbatches in the schedule (ScheduleGPipe/Schedule1F1B(stage, "
            "n_microbatches=...)), or switch to an interleaved schedule (ScheduleInterleaved1F1B with "
            f"v model chunks per rank divides the bubble by v: {_bubble_at(p, m or 1, 2):.0%} at v = 2) or a "
            "zero-bubble one (ScheduleInterleavedZeroBubble / ScheduleZBVZeroBubble, which fill the "
            "bubble with weight-gradient work). Shorter pipelines (fewer stages, more data-parallel "
            "replicas) also shrink it (PipeTransformer).",
        )
    ]


# Stage compute of a balanced 2-stage CPU pipeline differed by up to 15 % on a loaded 2-core box
# (docs/diagnosis.md, "Pipeline parallelism"): below 20 % an excess is not called imbalance.
IMBALANCE_MIN = 0.20


def pipeline_imbalance(ri: RuleInput) -> list[Recommendation]:
    """``pipeline-imbalance``: the slowest stage computes >= 20 % more than the mean stage (seed 001)."""
    pp = ri.pipeline
    if not pp or (pp["imbalance"]["excess_fraction"] or 0.0) < IMBALANCE_MIN:
        return []
    im = pp["imbalance"]
    k, ex = int(im["slowest_stage"]), float(im["excess_fraction"])
    comp = im["stage_compute_ms"]
    lightest = min(range(len(comp)), key=lambda i: comp[i])
    move = 1.0 - float(im["mean_stage_compute_ms"]) / comp[k] if comp[k] else 0.0
    speedup = float(im["est_speedup_balanced"] or 1.0)
    return [
        _rec(
            "pipeline-imbalance",
            "high" if speedup >= 1.25 else ("medium" if speedup >= 1.10 else "low"),
            f"Pipeline stage {k} is the slowest: {ex:.0%} more compute than the mean stage; it sets the pace",
            {
                "slowest_stage": k,
                "slowest_ranks": im["slowest_ranks"],
                "excess_fraction": ex,
                "stage_compute_ms": comp,
                "mean_stage_compute_ms": im["mean_stage_compute_ms"],
                "step_time_ms": pp["step_time_ms"],
                "est_step_time_balanced_ms": im["est_step_time_balanced_ms"],
                "est_speedup_balanced": im["est_speedup_balanced"],
                "move_fraction_of_slowest_stage": _r(move),
                "lightest_stage": lightest,
            },
            f"Rebalance layers: move about {move:.0%} of stage {k}'s work (its compute "
            f"{comp[k]:.1f} ms per step vs the mean {float(im['mean_stage_compute_ms']):.1f} ms) to the "
            f"lighter stages, first stage {lightest} ({comp[lightest]:.1f} ms): change the split points "
            "(torch.distributed.pipelining pipe_split()/SplitPoint, or the layers given to each "
            "PipelineStage), counting the embedding/head/loss with the stage that runs them. Balanced, "
            f"the step would take about {float(im['est_step_time_balanced_ms']):.1f} ms instead of "
            f"{float(pp['step_time_ms']):.1f} ms. This is not a straggler: the stage is slower every "
            "step because it has more work, not because its rank is slow.",
        )
    ]


def uneven_inputs(ri: RuleInput) -> list[Recommendation]:
    """``uneven-inputs``: ranks ran different numbers of steps or collectives (seed 004)."""
    u = ri.uneven_inputs
    if not u:
        return []
    short = ", ".join(map(str, u["short_ranks"]))
    steps = u["steps_per_rank"]
    fix = (
        "Give every rank the same number of batches: DistributedSampler(dataset, drop_last=True) drops "
        "the tail so all ranks get floor(N / world_size) batches (drop_last=False pads by repeating "
        "samples to ceil(N / world_size)); with an IterableDataset, shard it evenly and stop all ranks "
        "at the shortest shard. If the counts must differ, run the loop under "
        "`with torch.distributed.algorithms.Join([ddp_model, zero_optimizer]):` so finished ranks "
        "shadow the others' collectives instead of hanging them."
    )
    if u["mode"] == "unmatched":
        un = u["unmatched_collective"]
        waiting = ", ".join(map(str, u["waiting_ranks"]))
        return [
            _rec(
                "uneven-inputs",
                "high",
                f"Uneven inputs: rank(s) {waiting} wait in an {un['coll']} that rank(s) {short} never enter",
                {**u, "steps_per_rank": steps},
                f"{un['coll']} instances per rank {un['instances_per_rank']}: rank(s) {short} stopped "
                f"first (out of data) and rank(s) {waiting} waited {un['waited_ms']} ms in the next one (typical "
                f"{un['typical_ms']} ms), i.e. until the process-group timeout: the job hangs when one "
                "rank runs out of data. " + fix,
            )
        ]
    lost = float(u["lost_fraction"])
    return [
        _rec(
            "uneven-inputs",
            "medium" if lost >= 0.05 else "low",
            f"Uneven inputs: rank(s) {short} ran out of data first and shadowed the others' collectives",
            u,
            f"Steps per rank {steps}: rank(s) {short} finished early and then only echoed the others' "
            f"collectives (Join) for {u['idle_ms']} ms ({lost:.0%} of the ranks' time) while they trained on. "
            "Join keeps this correct, but those ranks' devices idle and the others' gradients average over "
            "fewer ranks in those steps. " + fix,
        )
    ]


# The rules in the order of the table in docs/diagnosis.md section 7 (ties in severity keep
# this order). Add a rule: write ``def my_rule(ri: RuleInput) -> list[Recommendation]`` and
# append it here (and a row to the table).
RULES: list[Rule] = [
    straggler_persistent,
    straggler_intermittent,
    sync_jitter,
    launch_bound,
    exposed_comm,
    dataloader_stall,
    attention_math_path,
    recompilation,
    low_mfu,
    pipeline_bubble,
    pipeline_imbalance,
    uneven_inputs,
]


def recommend(
    job: Job,
    breakdown: pl.DataFrame,
    stragglers: StragglerReport,
    mfu: MFUResult,
    attention: dict[int, AttentionFinding],
    compile_: dict[int, CompileFinding],
    comm_by_type: dict[str, float] | None = None,
    *,
    rules: list[Rule] | None = None,
    **measurements: dict[str, Any] | None,
) -> list[Recommendation]:
    """All recommendations with their evidence, most severe first. ``comm_by_type``: share of
    collective time per collective type (picks DDP / FSDP / all-to-all advice);
    ``measurements``: the optional analyses, by their ``RuleInput`` field names (a name that is
    not a field is a ``TypeError``); ``rules``: default ``RULES``."""
    ri = RuleInput(job, breakdown, stragglers, mfu, attention, compile_, comm_by_type, **measurements)
    recs = [rec for rule in (RULES if rules is None else rules) for rec in rule(ri)]
    recs.sort(key=lambda r: SEVERITY_ORDER.get(r["severity"], 9))
    return recs
