"""The evidence under a verdict: what the traces hold, what is wrong with them, what was left out.

Why: a verdict is only as good as the trace under it. A trace taken while the job was starting,
a rank file cut short, an empty file or corrupted timestamps make the straggler and uneven-inputs
analyses confidently wrong. The ``evidence`` key of the diagnosis document (docs/diagnosis.md,
§Evidence) says, for every verdict, what it rests on; the verdict follows it (``headline``):

* fewer than ``MIN_COMMON_STEPS`` steps held by every rank (or fewer than ``MIN_ASKED_SHARE``
  of the steps the request asked for), windows that do not overlap, or an empty rank file ->
  ``NOT ASSESSED`` with the reason and the command that gives a good trace;
* anomalous data under a verdict (timestamp anomalies, salvaged ranks, a large clock residual)
  -> the first line says so and the straggler confidence is lowered.

Terms:

``steps in common``
    job steps (``breakdown.step_table`` labels) that every rank's trace holds.
``window``
    a rank's trace span on the aligned clock (ms from the earliest rank's start).
``aligned``
    every rank's window starts and ends within one median step of the others'.
``salvaged``
    the loader kept the complete events of a damaged (truncated) file (``--salvage``): its end
    is missing, so its last step says nothing about its data running out.
``empty`` / ``near-empty``
    a file with 0 events / with fewer than ``NEAR_EMPTY_EVENTS``.
``start-up step``
    a rank's first traced step lasting ``STARTUP_RATIO`` times its median later step or more
    (the profiler starting, a warm-up iteration, the trace starting inside a step).
``clock residual``
    how far collective ends still disagree after clock alignment (``clock.residual_us``);
    anomalous above ``CLOCK_RESIDUAL_SHARE`` of the median step.
``clock unaligned``
    ranks on another host than the reference rank's whose clock no collective placed.
``fell back to a duration trace``
    an iteration request (``--iterations N``, from the kscope manifest) that Kineto traced as
    its default ``DEFAULT_DURATION_MS`` duration trace instead: it reached the process before
    its first optimizer step (or the process counts no iterations). Read as a window within
    ``FALLBACK_TOLERANCE`` of that length holding a number of steps other than N (an iteration
    trace holds exactly N). Each such window started when its rank's config arrived, not at a
    common step, so the ranks traced different steps.
"""

from __future__ import annotations

import os
from typing import Any

import msgspec
import polars as pl

from kinetoscope.diagnosis.assembly import Job, event_count
from kinetoscope.diagnosis.clock import ClockAlignment
from kinetoscope.diagnosis.stragglers.model import StragglerReport
from kinetoscope.diagnosis.timestamps import TimestampAnomalies
from kinetoscope.protocol.kineto_config import DEFAULT_DURATION_MS
from kinetoscope.protocol.structinfo import prime_structs

MIN_COMMON_STEPS = 2
# ...unless the steps in common hold this many collective instances: one step of a large model
# (the straggler analysis' own bar for medium confidence, ``stragglers._confidence``)
MIN_COMMON_INSTANCES = 8
NEAR_EMPTY_EVENTS = 50
STARTUP_RATIO = 2.0
CLOCK_RESIDUAL_SHARE = 0.25
SUGGESTED_ITERATIONS = 20
# ...and, for a request of N iterations (kscope manifest), at least this share of N: windows that
# share fewer of the steps asked did not trace what was asked (each rank's started on its own),
# and the few steps left carry too little to tell a straggler from the host's noise
MIN_ASKED_SHARE = 0.5
FALLBACK_TOLERANCE = 0.1  # of DEFAULT_DURATION_MS: the window of a duration fallback


class RankEvidence(msgspec.Struct, kw_only=True):
    """What one rank's trace holds (module docstring defines the terms)."""

    rank: int
    path: str
    events: int
    steps: int
    asked_steps: int | None = None  # the trace request's --iterations (manifest), when known
    first_step: int | None = None
    last_step: int | None = None
    window_start_ms: float | None = None
    window_end_ms: float | None = None
    salvaged: str | None = None  # the loader's message for a damaged file
    empty: bool = False
    near_empty: bool = False
    startup_step_ratio: float | None = None  # set when the first step is a start-up step
    fell_back_to_duration: bool = False  # module docstring
    timestamps: TimestampAnomalies = msgspec.field(default_factory=TimestampAnomalies)


class Anomaly(msgspec.Struct, kw_only=True):
    """One named problem of the data: ``kind`` (stable id), the ranks, a count, what it is and
    what the verdict left out because of it (empty when nothing)."""

    kind: str
    ranks: list[int]
    count: int
    message: str
    left_out: str = ""


class Evidence(msgspec.Struct, kw_only=True):
    """The ``evidence`` key of the diagnosis document."""

    assessed: bool = True
    reason: str | None = None  # why NOT ASSESSED
    command: str | None = None  # what to run for a trace that can be assessed
    confidence_lowered: bool = False
    ranks: list[RankEvidence] = []
    steps_in_common: int = 0
    instances_in_common: int = 0  # collective instances in the steps in common
    steps_asked: int | None = None
    windows_overlap: bool | None = None
    windows_aligned: bool | None = None
    starts_aligned: bool | None = None  # the windows start within one median step of each other
    start_spread_ms: float | None = None
    end_spread_ms: float | None = None
    clock_residual_us: float | None = None
    unaligned_ranks: list[int] = []  # ``clock unaligned`` (module docstring)
    timestamp_anomalies: int = 0
    excluded_steps: list[int] = []
    anomalies: list[Anomaly] = []

    @property
    def anomalous(self) -> bool:
        """Whether the verdict rests on data with an anomaly that can bias it."""
        return any(a.kind in BIASING and not a.left_out for a in self.anomalies)

    def lines(self) -> list[str]:
        """The human lines under the verdict (``evidence_lines``)."""
        return evidence_lines(self)

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = msgspec.to_builtins(self)
        for r, rank in zip(d["ranks"], self.ranks, strict=True):
            r["timestamps"]["total"] = rank.timestamps.total
        d["anomalous"] = self.anomalous
        d["usable"] = self.assessed  # the same judgement under the name the autopilot reads
        d["lines"] = self.lines()
        return d


# Anomalies that can bias a verdict resting on the data (the others are named, not held against it).
BIASING = {"device_before_launch", "negative_duration", "salvaged", "clock_residual", "clock_unaligned"}


def _ms(ns: float) -> float:
    return round(ns / 1e6, 3)


def _rank_evidence(r: int, job: Job, mine: pl.DataFrame, offset: int, t0: int | None) -> RankEvidence:
    """``mine``: the rank's rows of ``breakdown.step_table``, sorted by step."""
    t = job.traces[r]
    f = job.figures.get(r)
    n = event_count(t)
    span = f.span if f is not None else t.span_ns()
    salv = next((w for w in t.meta.warnings if w.startswith("salvaged")), None)
    ev = RankEvidence(
        rank=r,
        path=t.meta.path,
        events=n,
        steps=mine.height,
        asked_steps=_asked(t.meta.path),
        first_step=int(mine["step"][0]) if mine.height else None,
        last_step=int(mine["step"][-1]) if mine.height else None,
        salvaged=salv,
        empty=n == 0,
        near_empty=0 < n < NEAR_EMPTY_EVENTS,
        timestamps=(f.timestamps if f is not None and f.timestamps is not None else TimestampAnomalies()),
    )
    if span is not None and t0 is not None:
        ev.window_start_ms = _ms(span[0] + offset - t0)
        ev.window_end_ms = _ms(span[1] + offset - t0)
    ev.fell_back_to_duration = fell_back_to_duration(ev, ev.asked_steps)
    if mine.height >= 3:
        d = (mine["end"] - mine["start"]).cast(pl.Float64)
        rest = float(d[1:].median() or 0.0)
        if rest > 0 and float(d[0]) >= STARTUP_RATIO * rest:
            ev.startup_step_ratio = round(float(d[0]) / rest, 2)
    return ev


def fell_back_to_duration(ev: RankEvidence, asked: int | None) -> bool:
    """Whether a request for ``asked`` iterations was traced as Kineto's default duration trace
    (module docstring): a window of about ``DEFAULT_DURATION_MS`` holding other than ``asked`` steps."""
    if not asked or ev.empty or ev.window_start_ms is None or ev.window_end_ms is None:
        return False
    window = ev.window_end_ms - ev.window_start_ms
    near = abs(window - DEFAULT_DURATION_MS) <= FALLBACK_TOLERANCE * DEFAULT_DURATION_MS
    return near and ev.steps != asked


def _asked(path: str) -> int | None:
    """The ``--iterations`` of the request that wrote ``path`` (its kscope manifest), if any."""
    from kinetoscope.trace.metadata import read_manifest_entry

    try:
        entry = read_manifest_entry(path)
    except (OSError, ValueError):
        return None
    if not entry:
        return None
    n = entry.get("iterations")
    if n is None:
        n = ((entry.get("request") or {}).get("options") or {}).get("iterations")
    return int(n) if isinstance(n, int) and not isinstance(n, bool) and n > 0 else None


def gather_evidence(job: Job, steps: pl.DataFrame, clock: ClockAlignment, instances: int = 0) -> Evidence:
    """The evidence of ``job`` before any verdict (``steps``: ``breakdown.step_table``;
    ``instances``: collective instances in the steps every rank holds)."""
    starts = [
        sp[0] + int(clock.offsets.get(r, 0))
        for r in job.ranks
        if (sp := (job.figures[r].span if r in job.figures else job.traces[r].span_ns()))
    ]
    t0 = min(starts) if starts else None
    by_rank = {int(k[0]): g.sort("step") for k, g in steps.group_by("rank")} if steps.height else {}
    empty = steps.clear()
    ranks = [
        _rank_evidence(r, job, by_rank.get(r, empty), int(clock.offsets.get(r, 0)), t0) for r in job.ranks
    ]
    ev = Evidence(ranks=ranks, clock_residual_us=clock.residual_us(), unaligned_ranks=_unaligned(clock))
    asked = {r.asked_steps for r in ranks if r.asked_steps is not None}
    ev.steps_asked = max(asked) if asked else None
    ev.steps_in_common = _common(steps, len(job.traces))
    ev.instances_in_common = instances
    ev.timestamp_anomalies = sum(r.timestamps.total for r in ranks)
    _windows(ev, steps)
    _name_anomalies(ev, job, steps)
    _judge(ev, job)
    return ev


def _unaligned(clock: ClockAlignment) -> list[int]:
    """Ranks on a host other than the reference rank's whose clock no collective placed
    (``clock.align_clocks``: method ``unaligned``; their host shares no process group with the
    reference's)."""
    t = clock.table
    if t.is_empty() or clock.reference is None:
        return []
    host = dict(zip(t["rank"].to_list(), t["host"].to_list(), strict=True))
    ref_host = host.get(clock.reference)
    if ref_host is None:
        return []
    return [r for r in clock.unaligned_ranks() if host.get(r) not in (None, ref_host)]


def _common(steps: pl.DataFrame, n_ranks: int) -> int:
    if steps.is_empty() or n_ranks == 0:
        return 0
    per = steps.group_by("step").agg(pl.col("rank").n_unique().alias("n"))
    return int(per.filter(pl.col("n") == n_ranks).height)


def median_step_ms(steps: pl.DataFrame) -> float | None:
    if steps.is_empty():
        return None
    return _ms(float((steps["end"] - steps["start"]).median() or 0.0))


def _windows(ev: Evidence, steps: pl.DataFrame) -> None:
    w = [(r.window_start_ms, r.window_end_ms) for r in ev.ranks if r.window_start_ms is not None]
    if len(w) < 2:
        return
    s = [a for a, _ in w]
    e = [b for _, b in w if b is not None]
    ev.windows_overlap = max(s) < min(e)
    ev.start_spread_ms = round(max(s) - min(s), 3)
    ev.end_spread_ms = round(max(e) - min(e), 3)
    lengths = sorted(b - a for a, b in w if b is not None)
    tol = max(median_step_ms(steps) or 0.0, 0.05 * lengths[len(lengths) // 2])
    ev.windows_aligned = ev.windows_overlap and max(ev.start_spread_ms, ev.end_spread_ms) <= tol
    ev.starts_aligned = ev.start_spread_ms <= tol


def _ranks_text(ranks: list[int]) -> str:
    return f"rank{'s' if len(ranks) != 1 else ''} {', '.join(map(str, ranks))}"


def _name_anomalies(ev: Evidence, job: Job, steps: pl.DataFrame) -> None:
    out = ev.anomalies
    for r in ev.ranks:
        if r.empty:
            out.append(
                Anomaly(
                    kind="empty_file",
                    ranks=[r.rank],
                    count=1,
                    message=f"rank {r.rank}'s trace is empty (0 events): {os.path.basename(r.path)}",
                )
            )
        elif r.near_empty:
            out.append(
                Anomaly(
                    kind="near_empty_file",
                    ranks=[r.rank],
                    count=r.events,
                    message=f"rank {r.rank}'s trace holds only {r.events} events: {os.path.basename(r.path)}",
                )
            )
        if r.salvaged:
            out.append(
                Anomaly(
                    kind="salvaged",
                    ranks=[r.rank],
                    count=1,
                    message=f"rank {r.rank}'s file is damaged and was salvaged ({r.salvaged.split(': ', 1)[-1]}); its end is missing",
                )
            )
        ts = r.timestamps
        if ts.device_before_launch:
            out.append(
                Anomaly(
                    kind="device_before_launch",
                    ranks=[r.rank],
                    count=ts.device_before_launch,
                    message=(
                        f"rank {r.rank}: {ts.device_before_launch} device event(s) stamped before their launch (up to "
                        f"{ts.worst_before_launch_us or 0:.0f} us; repeated profiling of one process corrupts them, "
                        "PyTorch issues #192021/#175790)"
                    ),
                )
            )
        if ts.negative_durations:
            out.append(
                Anomaly(
                    kind="negative_duration",
                    ranks=[r.rank],
                    count=ts.negative_durations,
                    message=f"rank {r.rank}: {ts.negative_durations} event(s) with a negative duration",
                )
            )
        if r.startup_step_ratio is not None:
            out.append(
                Anomaly(
                    kind="startup_step",
                    ranks=[r.rank],
                    count=1,
                    message=f"rank {r.rank}'s first traced step (step {r.first_step}) lasts {r.startup_step_ratio:g}x its later steps (start-up)",
                )
            )
    if job.missing_ranks:
        out.append(
            _of_ranks(
                "missing_rank",
                job.missing_ranks,
                f"no trace of {_ranks_text(job.missing_ranks)}: the verdict covers the ranks traced",
            )
        )
    fell = [r.rank for r in ev.ranks if r.fell_back_to_duration]
    if fell:
        out.append(
            _of_ranks(
                "fell_back_to_duration",
                fell,
                f"{_ranks_text(fell)}: the iteration request was traced as Kineto's {DEFAULT_DURATION_MS} ms "
                "duration trace (it reached them before their first optimizer step, or they count no "
                "iterations): each window started when its config arrived, not at a common step",
            )
        )
    short = [
        r
        for r in ev.ranks
        if ev.steps_asked and r.steps < ev.steps_asked and not r.empty and not r.fell_back_to_duration
    ]
    if short:
        out.append(
            Anomaly(
                kind="fewer_steps_than_asked",
                ranks=[r.rank for r in short],
                count=len(short),
                message="fewer steps than the "
                + f"{ev.steps_asked} asked: "
                + ", ".join(f"rank {r.rank} holds {r.steps}" for r in short),
            )
        )
    step = median_step_ms(steps)
    res = ev.clock_residual_us
    if res is not None and step and res / 1000.0 > CLOCK_RESIDUAL_SHARE * step:
        out.append(
            Anomaly(
                kind="clock_residual",
                ranks=[],
                count=1,
                message=f"clock residual {res / 1000.0:.1f} ms after alignment, {100 * res / 1000.0 / step:.0f}% of the median step",
            )
        )
    if ev.unaligned_ranks:
        out.append(
            _of_ranks(
                "clock_unaligned",
                ev.unaligned_ranks,
                f"{_ranks_text(ev.unaligned_ranks)}: clock not aligned (no process group joins their host to "
                "the reference rank's): their timings against other hosts' are not comparable",
            )
        )
    if ev.windows_aligned is False:
        out.append(
            Anomaly(
                kind="windows_not_aligned",
                ranks=[],
                count=1,
                message=f"trace windows not aligned: starts {ev.start_spread_ms:.0f} ms apart, ends {ev.end_spread_ms:.0f} ms apart",
                left_out="" if not ev.windows_overlap else "the steps not held by every rank",
            )
        )


def _of_ranks(kind: str, ranks: list[int], message: str) -> Anomaly:
    """An anomaly of some ranks, counted by them."""
    return Anomaly(kind=kind, ranks=list(ranks), count=len(ranks), message=message)


def _judge(ev: Evidence, job: Job) -> None:
    """``assessed`` and its reason: an empty file or a rank without steps, for any job; windows
    that do not overlap and too few steps in common (of the steps asked, when known), for a
    cross-rank verdict."""
    empty = [r.rank for r in ev.ranks if r.empty]
    nosteps = [r.rank for r in ev.ranks if not r.empty and r.steps == 0]
    if empty:
        paths = ", ".join(os.path.basename(r.path) for r in ev.ranks if r.empty)
        ev.reason = f"{_ranks_text(empty)}: trace file empty (0 events): {paths}"
    elif nosteps:
        ev.reason = f"{_ranks_text(nosteps)}: no step in the trace (not stepping yet, or no ProfilerStep/Optimizer.step marks)"
    elif len(job.traces) < 2:
        pass
    elif ev.windows_overlap is False:
        ev.reason = "the ranks' trace windows do not overlap (" + _window_text(ev) + ")"
    elif ev.steps_in_common < MIN_COMMON_STEPS and ev.instances_in_common < MIN_COMMON_INSTANCES:
        per = ", ".join(f"rank {r.rank}: {r.steps}" for r in ev.ranks)
        ev.reason = (
            f"only {ev.steps_in_common} step(s) held by every rank, {MIN_COMMON_STEPS} needed "
            f"(or {MIN_COMMON_INSTANCES} collectives in them; steps per rank: {per})"
        )
    elif 0 < ev.instances_in_common < MIN_COMMON_STEPS:
        ev.reason = (
            f"only {ev.instances_in_common} collective held by every rank in the "
            f"{ev.steps_in_common} step(s) in common: no rank can be compared with its peers "
            f"({_window_text(ev)})"
        )
    elif ev.steps_asked and ev.steps_in_common < ev.steps_asked * MIN_ASKED_SHARE:
        ev.reason = (
            f"only {ev.steps_in_common} of the {ev.steps_asked} steps asked are held by every rank: "
            f"the windows traced different steps ({_window_text(ev)})"
        )
    if ev.reason is not None:
        ev.assessed = False
        ev.command = suggested_command(job)


def _window_text(ev: Evidence) -> str:
    return ", ".join(
        f"rank {r.rank} {r.window_start_ms / 1000.0:.2f}-{(r.window_end_ms or 0) / 1000.0:.2f} s"
        for r in ev.ranks
        if r.window_start_ms is not None
    )


def suggested_command(job: Job) -> str:
    """The command for a trace that can be assessed: enough aligned iterations, taken once the
    job steps steadily."""
    target = (
        f"--job-id {job.job_id}"
        if job.job_id
        else ("-p <launcher pid>" if len(job.traces) > 1 else "-p <pid>")
    )
    return f"kscope trace {target} --iterations {SUGGESTED_ITERATIONS} --when-stepping --wait"


def anomalous_steps(ev: Evidence, steps: pl.DataFrame) -> list[int]:
    """Job steps holding a timestamp anomaly on some rank (their local steps relabelled)."""
    pairs = [(r.rank, s) for r in ev.ranks for s in r.timestamps.steps]
    if not pairs or steps.is_empty():
        return []
    bad = pl.DataFrame(
        {"rank": [p[0] for p in pairs], "local_step": [p[1] for p in pairs]},
        schema={"rank": pl.Int64, "local_step": pl.Int64},
    )
    return sorted(int(s) for s in steps.join(bad, on=["rank", "local_step"])["step"].unique().to_list())


def exclude_anomalous(ev: Evidence, steps: pl.DataFrame, kept: pl.DataFrame) -> list[int]:
    """The job steps to leave out of the cross-rank verdict for their timestamp anomalies: all of
    them when at least ``MIN_COMMON_STEPS`` steps of ``kept`` (the verdict's steps) remain,
    else none (the verdict then rests on them, says so and loses confidence)."""
    bad = anomalous_steps(ev, steps)
    if not bad or kept.is_empty():
        return []
    left = set(kept["step"].unique().to_list()) - set(bad)
    if len(left) < MIN_COMMON_STEPS:
        return []
    ev.excluded_steps = bad
    for a in ev.anomalies:
        if a.kind in ("device_before_launch", "negative_duration"):
            a.left_out = f"step(s) {', '.join(map(str, bad))} left out of the verdict"
    return bad


def guard_uneven(ev: Evidence, uneven: dict[str, Any] | None) -> dict[str, Any] | None:
    """The uneven-inputs finding, or None when the evidence cannot support it: a short rank
    whose file was salvaged (its end is missing, not its data), or windows that start at
    different times (picked up at different times, they end at different times too, and a rank
    whose window merely ends earlier looks like one that ran out of data). Windows that start
    together and end apart are what uneven inputs look like, and are kept."""
    if not uneven:
        return uneven
    short = set(uneven.get("short_ranks") or [])
    salvaged = sorted(r.rank for r in ev.ranks if r.salvaged)
    why = None
    if short & set(salvaged) or (salvaged and uneven.get("mode") == "unmatched"):
        why = f"{_ranks_text(salvaged)} salvaged: a missing end is not data running out"
    elif ev.starts_aligned is False or ev.windows_overlap is False:
        why = "trace windows start at different times: a window that ends earlier is not data running out"
    if why is None:
        return uneven
    ev.anomalies.append(
        Anomaly(
            kind="uneven_inputs_not_assessed",
            ranks=sorted(short),
            count=1,
            message=f"the uneven-inputs finding ({_ranks_text(sorted(short))} short) was not used: {why}",
            left_out="the uneven-inputs verdict",
        )
    )
    return None


def evidence_lines(ev: Evidence) -> list[str]:
    """One line: steps per rank and in common, windows, anomalies counted and named; a second
    one with what was left out, when something was."""
    if not ev.ranks:
        return []
    steps = ", ".join(f"{r.rank}: {r.steps}" for r in ev.ranks)
    asked = f" of {ev.steps_asked} asked" if ev.steps_asked else ""
    if len(ev.ranks) == 1:
        head = f"Evidence: {ev.ranks[0].steps} step(s) traced{asked}"
    else:
        win = {True: "windows aligned", False: "windows NOT aligned", None: "windows unknown"}[
            ev.windows_aligned
        ]
        if ev.windows_overlap is False:
            win = "windows do NOT overlap"
        head = f"Evidence: steps per rank {steps}{asked}; {ev.steps_in_common} in common; {win}"
    named = [a for a in ev.anomalies if a.kind != "windows_not_aligned"]  # already in ``head``
    if named:
        body = f"{len(named)} anomal{'y' if len(named) == 1 else 'ies'}: " + "; ".join(
            a.message for a in named
        )
    else:
        body = "0 anomalies"
    out = [f"{head}; {body}."]
    left = [a.left_out for a in ev.anomalies if a.left_out]
    if left:
        out.append("Left out: " + "; ".join(dict.fromkeys(left)) + ".")
    return out


def headline(verdict: list[str], ev: Evidence | None, multi_rank: bool) -> list[str]:
    """The verdict lines as the evidence allows: ``NOT ASSESSED`` with the reason and the command
    when it cannot be assessed, else the verdict, its first line saying when it rests on
    anomalous data (and, for one process, when it holds fewer steps than asked); then the
    evidence lines."""
    if ev is None:
        return verdict
    if not ev.assessed:
        return [f"NOT ASSESSED: {ev.reason}.", f"For a trace that can be assessed: {ev.command}", *ev.lines()]
    lines = list(verdict)
    if lines and ev.anomalous:
        kinds = sorted(
            {a.kind.replace("_", " ") for a in ev.anomalies if a.kind in BIASING and not a.left_out}
        )
        lines[0] = f"[ON ANOMALOUS DATA: {', '.join(kinds)}; confidence lowered] {lines[0]}"
    if not multi_rank and ev.steps_asked and ev.ranks and ev.ranks[0].steps < ev.steps_asked and lines:
        lines[0] = (
            f"[WARNING: the trace holds {ev.ranks[0].steps} of the {ev.steps_asked} steps asked] {lines[0]}"
        )
    return [*lines, *ev.lines()]


# Recommendations that rest on the cross-rank verdict: not made when it cannot be assessed.
CROSS_RANK_RECOMMENDATIONS = (
    "straggler-persistent",
    "straggler-intermittent",
    "sync-jitter",
    "uneven-inputs",
)


def admissible(ev: Evidence, recs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``recs`` less the cross-rank ones when the evidence cannot carry a cross-rank verdict."""
    if ev.assessed:
        return recs
    kept = [r for r in recs if r.get("id") not in CROSS_RANK_RECOMMENDATIONS]
    gone = [str(r.get("id")) for r in recs if r.get("id") in CROSS_RANK_RECOMMENDATIONS]
    if gone:
        ev.anomalies.append(
            Anomaly(
                kind="not_assessed",
                ranks=[],
                count=len(gone),
                message="the cross-rank verdict was not assessed",
                left_out="recommendation(s) " + ", ".join(gone),
            )
        )
    return kept


def note_partial_first_step(ev: Evidence, step: int) -> None:
    """Name the first step the straggler analysis left out: the trace started inside it."""
    ev.anomalies.append(
        Anomaly(
            kind="partial_first_step",
            ranks=[],
            count=1,
            message=f"step {step} is incomplete on some rank (the trace started inside it)",
            left_out=f"step {step}",
        )
    )


def withhold(strag: StragglerReport, ev: Evidence, multi_rank: bool) -> None:
    """A straggler report that the evidence cannot carry says so: ``kind`` ``not_assessed``, no
    rank named, confidence ``n/a`` (the catalog, the fleet view and the recommendations read
    ``kind``; a verdict withheld must not count as one)."""
    if not multi_rank or ev.assessed:
        return
    strag.kind = "not_assessed"
    strag.ranks = []
    strag.intermittent_ranks = []
    strag.recurrent_ranks = []
    strag.confidence = "n/a"


def lowered(confidence: str) -> str:
    """One level lower: high -> medium -> low."""
    return {"high": "medium", "medium": "low"}.get(confidence, confidence)


prime_structs(globals())
