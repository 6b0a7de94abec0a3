"""``kscope demo``: trace a real 2-rank DDP job with an emulated straggler, end to end.

The demo is a list of :class:`DemoStep` run in order over one :class:`DemoContext`. Later work
(analysis, straggler diagnosis, report) adds steps with :func:`insert_step` — e.g. an
``analyze`` step after ``inspect`` — without touching the others. Every step reads what it needs
from the context and stores what it produces there.

Cleanup is guaranteed: the daemon and the job run in their own process groups and are stopped in
``finally`` (also on Ctrl-C/SIGTERM); if the demo itself is killed, the children get SIGTERM
through PR_SET_PDEATHSIG, and the job has a ``--max-seconds`` safety net.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
from rich.console import Console
from rich.markup import escape
from rich.panel import Panel

from kinetoscope.collect.render import files_table, matched_table
from kinetoscope.collect.trigger import (
    Target,
    TraceOptions,
    TraceRequest,
    TraceResult,
)
from kinetoscope.collect.workflow import Delivery, TraceEvent, TraceWorkflow, Waiting
from kinetoscope.demo.local import LocalDaemon, TrainingJob, terminate_on_sigterm
from kinetoscope.document import decode
from kinetoscope.errors import KinetoscopeError
from kinetoscope.protocol import rpc
from kinetoscope.termtext import num, print_marked, print_titled, table, text

OPTIMIZER_STEP_PREFIX = "Optimizer.step#"
INDENT = "   "  # a step's lines stand under its title


@dataclass
class DemoOptions:
    workdir: str = "demo-output"
    ranks: int = 2
    iterations: int = 10
    straggler: str = "intermittent"
    straggler_rank: int = -1  # -1: the last rank
    straggler_prob: float = 0.3
    straggler_ms: tuple[float, float] = (250.0, 400.0)
    straggler_block: int = 10  # intermittent: exactly prob x 10 stalls in every 10 steps (docs/demo.md)
    model: str = "small"
    seed: int = 0
    job_id: int | None = None  # SLURM_JOB_ID given to the job; default derived from the clock
    timeout_s: float = 110.0  # the whole demo; each wait gets what is left
    align_margin_s: float = 3.0  # start the trace this far ahead so every rank has the config
    catalog: str | None = None  # catalog URL; default: <workdir>/catalog.db (never the user's default)
    report: bool = True  # analyse, record and write the HTML report after collecting


class DemoFailed(KinetoscopeError):
    """A demo step failed; the message says which and why (and where the logs are)."""


@dataclass
class DemoContext:
    options: DemoOptions
    console: Console
    workdir: Path
    deadline: float
    job_id: int = 0
    daemon: LocalDaemon | None = None
    job: TrainingJob | None = None
    registered: list[rpc.ProcessInfo] = field(default_factory=list)
    start_iteration: int | None = None  # first traced Kineto iteration (the roundup target)
    trace: TraceResult | None = None
    inspection: list[dict[str, Any]] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)
    extras: dict[str, Any] = field(default_factory=dict)  # for steps added later

    def remaining(self, cap: float) -> float:
        left = self.deadline - time.monotonic()
        if left <= 1:
            raise DemoFailed(f"the demo ran out of time ({self.options.timeout_s:g} s)")
        return min(cap, left)

    @property
    def straggler_rank(self) -> int:
        o = self.options
        return o.straggler_rank if o.straggler_rank >= 0 else o.ranks - 1

    def say(self, markup: str) -> None:
        """One narrative line (Rich markup), indented under its step, wrapped between words at the
        console's width (wrapped lines stay indented; a path or id stays whole)."""
        print_marked(self.console, markup, indent=INDENT)


@dataclass
class DemoStep:
    name: str
    title: str
    run: Callable[[DemoContext], None]


# ---------------------------------------------------------------------------------------
# Steps
# ---------------------------------------------------------------------------------------
def step_start_daemon(ctx: DemoContext) -> None:
    ctx.daemon = LocalDaemon(ctx.workdir, trace_root=ctx.workdir / "traces")
    ctx.daemon.start(timeout=ctx.remaining(30))
    ctx.say(
        f"kscope daemon on [bold]{ctx.daemon.address}[/] (pid {ctx.daemon.process.pid if ctx.daemon.process else '?'})"
    )
    ctx.say(
        f"IPC socket dir {escape(str(ctx.daemon.socket_dir))}, trace root {escape(show_path(ctx.daemon.trace_root))}"
    )


def step_start_job(ctx: DemoContext) -> None:
    assert ctx.daemon is not None
    o = ctx.options
    env = ctx.daemon.kineto_env()
    env["SLURM_JOB_ID"] = str(ctx.job_id)
    ctx.job = TrainingJob(
        ctx.workdir,
        ranks=o.ranks,
        steps=0,  # runs until the demo stops it, like a long training run
        straggler=o.straggler,
        straggler_rank=ctx.straggler_rank,
        straggler_prob=o.straggler_prob,
        straggler_ms=o.straggler_ms,
        model=o.model,
        seed=o.seed,
        extra_args=("--straggler-block", str(o.straggler_block)) if o.straggler_block > 0 else (),
        max_seconds=max(30.0, o.timeout_s + 10),
        env=env,
    ).start()
    ctx.say(
        f"torchrun (pid {ctx.job.pid}): {o.ranks} ranks, gloo on CPU, {o.model} MLP, "
        f"SLURM_JOB_ID={ctx.job_id}"
    )
    if o.straggler == "intermittent":
        ctx.say(
            f"emulated straggler: rank {ctx.straggler_rank} sleeps {o.straggler_ms[0]:g}-{o.straggler_ms[1]:g} ms "
            f"between loss and backward in "
            + (
                f"{round(o.straggler_prob * o.straggler_block)} of every {o.straggler_block} steps"
                if o.straggler_block > 0
                else f"{o.straggler_prob:.0%} of the steps"
            )
        )
    elif o.straggler == "persistent":
        ctx.say(
            f"emulated straggler: rank {ctx.straggler_rank} sleeps {o.straggler_ms[0]:g}-{o.straggler_ms[1]:g} ms "
            "every step"
        )
    ctx.say(
        "no profiling code in the script; its environment has KINETO_USE_DAEMON=1 and the daemon's socket dir"
    )


def step_wait_registered(ctx: DemoContext) -> None:
    assert ctx.daemon is not None and ctx.job is not None
    with ctx.console.status("   waiting for the ranks to import torch and register with the daemon..."):
        ctx.registered = ctx.daemon.wait_for_processes(
            ctx.options.ranks, job_id=ctx.job_id, timeout=ctx.remaining(60), alive=ctx.job.alive
        )
    ranks = ", ".join(
        f"rank {p.rank} = pid {p.pid}" for p in sorted(ctx.registered, key=lambda p: p.rank or 0)
    )
    ctx.say(f"registered: {ranks}; they poll the daemon every second")
    # An iteration request that arrives before a process's first optimizer.step() becomes a 500 ms
    # duration trace (Kineto's fallback), so wait until every rank is stepping.
    with ctx.console.status("   waiting for every rank to run its first optimizer steps..."):
        ctx.job.wait_for_steps(3, timeout=ctx.remaining(60))
    time.sleep(0.5)
    rate = ctx.job.step_rate()
    ctx.say(f"training: {rate:.1f} steps/s" if rate else "training")


def step_trigger(ctx: DemoContext) -> None:
    assert ctx.daemon is not None and ctx.job is not None
    o = ctx.options
    # Ranks pick up the config at their next poll (up to 1 s apart). Kineto starts at the next
    # multiple of the roundup, so a roundup beyond the current step + a margin makes every rank
    # start at the same iteration.
    step = max((d["step"] for d in ctx.job.progress().values()), default=0)
    rate = ctx.job.step_rate() or 10.0
    roundup = int(math.ceil((step + rate * o.align_margin_s + 1) / 10.0) * 10)
    ctx.start_iteration = roundup
    request = TraceRequest(
        (ctx.daemon.address,),
        Target(job_id=ctx.job_id, job_id_text=str(ctx.job_id)),
        TraceOptions(iterations=o.iterations, iteration_roundup=roundup),
    )
    ctx.trace = TraceWorkflow().trigger(request)
    ctx.say(
        f"[dim]$ kscope trace --host {ctx.daemon.address} --job-id {ctx.job_id} --iterations {o.iterations} "
        f"--iteration-roundup {roundup}[/]"
    )
    _print_matched(ctx, ctx.trace)
    if any(m.state == "launcher" for m in ctx.trace.matched):
        ctx.say("torchrun's agent has the same job id; kscope skips launchers and traces the ranks")
    if ctx.trace.errors:
        raise DemoFailed("; ".join(e.message for e in ctx.trace.errors))
    ctx.say(
        f"the job is at step {step}; every rank starts tracing at iteration {roundup} "
        "(the roundup aligns the ranks)"
    )


def step_wait_files(ctx: DemoContext) -> None:
    assert ctx.trace is not None
    total = len(ctx.trace.files)
    with ctx.console.status(f"   waiting for {total} trace files...") as status:

        def progress(event: TraceEvent) -> None:
            if isinstance(event, Waiting):
                status.update(
                    f"   config picked up by {event.picked}/{total} ranks, {event.done}/{total} files complete..."
                )

        delivery = Delivery(timeout_s=ctx.remaining(60), poll_interval_s=0.3)
        ctx.trace = TraceWorkflow(delivery, progress).wait(ctx.trace)
    if ctx.trace.errors:
        raise DemoFailed("; ".join(e.message for e in ctx.trace.errors))
    print_files(ctx)
    if ctx.trace.manifest_paths:
        ctx.say("manifest.json written beside them: host, pid, rank, world size, job id, size of each file")


def step_stop_job(ctx: DemoContext) -> None:
    assert ctx.job is not None
    ctx.job.stop_once_logged()
    steps = max((d["step"] for d in ctx.job.progress().values()), default=0)
    ctx.say(f"stopped after {steps} steps (a real job would keep training: tracing needed no restart)")


def inspect_trace_file(path: str) -> dict[str, Any]:
    """Quick facts from one trace: events, optimizer steps and the iteration times between them."""
    doc = orjson.loads(Path(path).read_bytes())
    events = doc.get("traceEvents") or []
    steps = sorted(
        (e["ts"], e.get("dur", 0))
        for e in events
        if isinstance(e, dict)
        and str(e.get("name", "")).startswith(OPTIMIZER_STEP_PREFIX)
        and e.get("ph") == "X"
    )
    # iteration i ends with its optimizer step: duration = end of step i - end of step i-1; the
    # first traced iteration starts with the trace (Kineto starts right after an optimizer step)
    ends = [ts + dur for ts, dur in steps]
    starts = [
        e["ts"]
        for e in events
        if isinstance(e, dict) and e.get("ph") == "X" and isinstance(e.get("ts"), (int, float))
    ]
    iter_ms = [(b - a) / 1000.0 for a, b in itertools.pairwise(ends)]
    if ends and starts:
        iter_ms.insert(0, (ends[0] - min(starts)) / 1000.0)
    return {
        "events": len(events),
        "optimizer_steps": len(steps),
        "iteration_ms": iter_ms,
        "first_step_end_us": ends[0] if ends else None,  # same clock for every process of a host
        "distributed_info": doc.get("distributedInfo"),
        "trace_id": doc.get("trace_id"),
    }


def step_inspect(ctx: DemoContext) -> None:
    assert ctx.trace is not None and ctx.job is not None
    cols = [num("rank"), num("events"), num("Optimizer.step"), text("iteration times in the trace (ms)")]
    rows = []
    for f in sorted(ctx.trace.files, key=lambda f: (f.rank is None, f.rank)):
        info = inspect_trace_file(f.path)
        info.update(rank=f.rank, pid=f.pid, path=f.path)
        ctx.inspection.append(info)
        times = " ".join(f"{ms:.0f}" for ms in info["iteration_ms"])
        rows.append([str(f.rank), str(info["events"]), str(info["optimizer_steps"]), times])
    t = table(None, cols, rows)
    t.box = None
    print_titled(ctx.console, t, indent=len(INDENT))
    firsts = {i["rank"]: i["first_step_end_us"] for i in ctx.inspection if i["first_step_end_us"] is not None}
    if len(firsts) > 1:
        spread_ms = (max(firsts.values()) - min(firsts.values())) / 1000.0
        iters = sorted(ms for i in ctx.inspection for ms in i["iteration_ms"])
        typical = iters[len(iters) // 2] if iters else 0.0
        ctx.extras["aligned"] = spread_ms <= max(20.0, typical / 2)
        if ctx.extras["aligned"]:
            ctx.say(
                f"the ranks traced the same iterations (their first traced steps end {spread_ms:.0f} ms apart)"
            )
        else:
            late = max(firsts, key=lambda r: firsts[r])
            ctx.say(
                f"[yellow]the ranks did not trace the same iterations[/]: rank {late} started "
                f"{spread_ms:.0f} ms later (it picked up the config after the roundup iteration; "
                "a larger --iteration-roundup margin avoids this)"
            )
    # Ground truth from the job's own step log: Kineto counts optimizer steps from 0, so tracing
    # iterations [S, S+N) covers the job's 0-based steps S+1 .. S+N.
    if (
        ctx.start_iteration is not None
        and ctx.options.straggler != "none"
        and ctx.extras.get("aligned", True)
    ):
        first, last = ctx.start_iteration + 1, ctx.start_iteration + ctx.options.iterations
        sleeps = [
            (s["step"], s["straggle_ms"])
            for s in ctx.job.step_log(ctx.straggler_rank)
            if first <= s["step"] <= last and s["straggle_ms"] > 0
        ]
        ctx.extras["ground_truth"] = {"rank": ctx.straggler_rank, "steps": (first, last), "sleeps": sleeps}
        if sleeps:
            listed = ", ".join(f"step {s} ({ms:.0f} ms)" for s, ms in sleeps)
            ctx.say(
                f"ground truth: rank {ctx.straggler_rank} straggled in {len(sleeps)} of the {ctx.options.iterations} "
                f"traced steps: {listed}"
            )
        else:
            ctx.say(
                f"ground truth: rank {ctx.straggler_rank} happened not to straggle in the traced steps "
                f"{first}-{last}"
            )
        ctx.say("every rank shows the slow iterations: the others wait for the straggler in DDP's all-reduce")
    ctx.say(
        "[dim](ProfilerStep markers are absent in on-demand traces; iterations are delimited by "
        "Optimizer.step)[/]"
    )


def step_analyze(ctx: DemoContext) -> None:
    """Run every default analysis and the job diagnosis over the collected traces (the library
    behind `kscope analyze`), print the short diagnosis and compare it with the ground truth."""
    assert ctx.trace is not None
    from kinetoscope.orchestration import AnalyzeRequest, analyze_paths

    files = sorted((f for f in ctx.trace.files if f.complete), key=lambda f: (f.rank is None, f.rank))
    paths = [f.path for f in files]
    ctx.say(f"[dim]$ kscope analyze {escape(show_path(ctx.trace.output_dir or ''))}[/]")
    with ctx.console.status("   loading the traces, running the analyses and the diagnosis..."):
        try:
            # cache=False: the demo leaves nothing in the user's trace cache
            doc = analyze_paths(paths, AnalyzeRequest(cache=False))
        except KinetoscopeError:
            raise
        except Exception as exc:  # noqa: BLE001 - the demo names the step instead of a traceback
            raise DemoFailed(f"the analysis failed: {type(exc).__name__}: {exc}") from exc
    ctx.extras["document"] = doc
    ctx.extras["analysed_paths"] = paths
    typed = decode(doc)
    summary = [s for s in typed.summary_lines or [] if not s.startswith("Recommendation (")]
    if not summary:
        why = typed.errors["diagnosis"] if "diagnosis" in typed.errors else "no diagnosis in the document"
        ctx.say(f"[yellow]no diagnosis[/]: {escape(why)}")
    for line in summary:
        ctx.say(escape(line))
    for r in (typed.recommendations or [])[:3]:
        ctx.say(f"recommendation ({escape(r.severity)}): {escape(r.title)}")
    truth = ctx.extras.get("ground_truth")
    found = list(typed.stragglers.ranks) if typed.stragglers is not None else []
    if truth:
        rank = truth["rank"]
        if truth["sleeps"] and rank in found:
            ctx.say(f"[green]the diagnosis names rank {rank}: the rank that slept (ground truth)[/]")
        elif truth["sleeps"]:
            ctx.say(
                f"[yellow]the diagnosis flags {('ranks ' + ', '.join(map(str, found))) if found else 'no rank'}; "
                f"the ground truth is rank {rank}[/]"
            )
        elif not found:
            ctx.say("no straggler in the traced steps, and none flagged")
    for name, msg in typed.errors.items():
        ctx.say(f"[yellow]warning[/]: {escape(name)}: {escape(msg)}")


def _demo_catalog(ctx: DemoContext) -> str:
    return ctx.options.catalog or str(ctx.workdir / "catalog.db")


def step_report(ctx: DemoContext) -> None:
    """Record the request and its analysis in the demo's catalog and write the HTML report."""
    assert ctx.trace is not None
    from kinetoscope.orchestration import AnalysisRun, record_run
    from kinetoscope.report.render import write_report
    from kinetoscope.store import Catalog

    doc = ctx.extras.get("document")
    if doc is None:
        raise DemoFailed("no analysis to report (the analyze step did not run)")
    trace_dir = ctx.trace.output_dir or str(Path(ctx.extras["analysed_paths"][0]).parent)
    report_path = ctx.workdir / "report.html"
    catalog_url = _demo_catalog(ctx)
    with Catalog.open(catalog_url) as cat:
        rec = cat.import_trace_dir(trace_dir)
        run = AnalysisRun(
            document=doc,
            paths=[Path(p) for p in ctx.extras["analysed_paths"]],
            inputs=[rec.trace_id],
            trace_id=rec.trace_id,
        )
        write_report(doc, report_path, title=f"Kinetoscope demo — {rec.trace_id}", inputs=[rec.trace_id])
        arec = record_run(cat, run, report_path=str(report_path))
        shown = show_path(catalog_url) if "://" not in catalog_url else cat.display_url
    ctx.extras.update(catalog=catalog_url, analysis_id=arec.id, report=str(report_path))
    ctx.say(
        f"catalog {escape(shown)}: trace request {escape(rec.trace_id)} ({rec.complete_files}/{rec.file_count} files, "
        f"sha256 recorded), analysis {arec.id}"
    )
    ctx.say(f"[bold green]report:[/] {escape(show_path(report_path))} (one offline HTML file)")
    ctx.say(f"browse it all: [bold]kscope serve --catalog {escape(shown)}[/] (then http://127.0.0.1:8000/)")


def step_summary(ctx: DemoContext) -> None:
    assert ctx.trace is not None
    d = ctx.trace.output_dir or ""
    ctx.say(f"[bold green]traces:[/] {escape(show_path(d))}/")
    if ctx.extras.get("report"):
        ctx.say(
            f"report: {escape(show_path(ctx.extras['report']))}; catalog: "
            f"{escape(show_path(ctx.extras['catalog']) if '://' not in ctx.extras['catalog'] else 'as given')}"
        )
        ctx.say("each trace also opens in the Perfetto UI that `kscope serve` bundles (no internet needed)")
    else:
        ctx.say("open a file in https://ui.perfetto.dev; manifest.json maps files to ranks")
    ctx.say(
        f"logs: {escape(show_path(ctx.workdir / 'daemon.log'))}, {escape(show_path(ctx.workdir / 'job.log'))}"
    )


DEMO_STEPS: list[DemoStep] = [
    DemoStep("daemon", "Start the collection daemon", step_start_daemon),
    DemoStep("job", "Launch a DDP training job (unmodified script)", step_start_job),
    DemoStep("register", "Wait for the ranks to register and train", step_wait_registered),
    DemoStep("trigger", "Trigger an iteration-based trace of the job, by job id", step_trigger),
    DemoStep("collect", "Wait for the trace files", step_wait_files),
    DemoStep("stop", "Stop the job", step_stop_job),
    DemoStep("inspect", "Look inside the traces", step_inspect),
    DemoStep("analyze", "Find the straggler: analyses and job diagnosis", step_analyze),
    DemoStep("report", "Record in the catalog and write the HTML report", step_report),
    DemoStep("summary", "Done", step_summary),
]
REPORT_STEPS = ("analyze", "report")


def insert_step(step: DemoStep, *, after: str, steps: list[DemoStep] | None = None) -> list[DemoStep]:
    """Insert ``step`` after the step named ``after`` (in ``steps``, default the demo's list)."""
    steps = DEMO_STEPS if steps is None else steps
    names = [s.name for s in steps]
    if after not in names:
        raise ValueError(f"no demo step named {after!r}; steps: {', '.join(names)}")
    steps.insert(names.index(after) + 1, step)
    return steps


# ---------------------------------------------------------------------------------------
# Runner
# ---------------------------------------------------------------------------------------
def run_demo(
    options: DemoOptions | None = None, console: Console | None = None, steps: list[DemoStep] | None = None
) -> DemoContext:
    options = options or DemoOptions()
    console = console or Console(highlight=False)
    steps = list(DEMO_STEPS if steps is None else steps)
    if not options.report:
        steps = [s for s in steps if s.name not in REPORT_STEPS]
    workdir = Path(options.workdir).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    ctx = DemoContext(
        options=options,
        console=console,
        workdir=workdir,
        deadline=time.monotonic() + options.timeout_s,
        job_id=options.job_id if options.job_id is not None else 10000 + int(time.time()) % 90000,
    )
    console.print(
        Panel.fit(
            "[bold]Kinetoscope demo[/]: trace a running PyTorch DDP job without touching its code, then find its straggler.\n"
            "A private daemon, a real 2-process training job on CPU, one on-demand trace by job id,\n"
            "the analyses and job diagnosis, the catalog and an offline HTML report.",
            border_style="cyan",
        )
    )
    t_start = time.monotonic()
    current = ""
    try:
        with terminate_on_sigterm():
            for i, step in enumerate(steps, 1):
                current = step.title
                print_marked(console, f"[bold cyan]{i}.[/] [bold]{escape(step.title)}[/]", subsequent=INDENT)
                t0 = time.monotonic()
                step.run(ctx)
                ctx.timings[step.name] = time.monotonic() - t0
    except KinetoscopeError as exc:
        raise DemoFailed(f"demo step '{current}' failed: {exc} (logs in {workdir})") from exc
    finally:
        with console.status("   cleaning up..."):
            if ctx.job is not None:
                with contextlib.suppress(Exception):
                    ctx.job.stop()
            if ctx.daemon is not None:
                with contextlib.suppress(Exception):
                    ctx.daemon.stop()
    ctx.timings["total"] = time.monotonic() - t_start
    console.print(f"[bold green]Demo complete[/] in {ctx.timings['total']:.0f} s.")
    return ctx


def _print_matched(ctx: DemoContext, result: TraceResult) -> None:
    """The matched processes, indented under the step (termtext: values whole at any width)."""
    print_titled(ctx.console, matched_table(result, compact=True, show_host=False), indent=len(INDENT))


def print_files(ctx: DemoContext) -> None:
    """The trace files, indented under the step (termtext: names and paths whole at any width)."""
    assert ctx.trace is not None
    print_titled(ctx.console, files_table(ctx.trace, compact=True), indent=len(INDENT))


def show_path(path: str | os.PathLike[str]) -> str:
    """``path`` relative to the current directory when it is inside it, else absolute."""
    p = Path(path).resolve()
    try:
        return str(p.relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(p)
