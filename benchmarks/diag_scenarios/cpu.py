"""Real CPU DDP jobs (torchrun + gloo) with injected stragglers, traced through ``kscope daemon``.

Each scenario runs ``train_knobs.py`` under torchrun with a private ``LocalDaemon``'s Kineto
environment (``KINETO_USE_DAEMON=1``: no profiling code in the script), next to one extra
CPU-burning process (a shared, loaded node), waits until every rank steps, triggers an
iteration-based trace of the job by job id over the daemon's RPC (the same calls as
``kscope trace --job-id``, iteration roundup far enough ahead that all ranks start together),
and labels the traced steps from the job's own step logs (``tests/diagnosis/daemon_runs.py``'s
``ground_truth``). Expected ranks: the hit ranks (intermittent: the ranks that actually slept
in the traced steps).
"""

from __future__ import annotations

import importlib.util
import random
import subprocess
import sys
import time
from collections.abc import Collection
from dataclasses import dataclass, field
from itertools import count
from pathlib import Path
from typing import Any

from kinetoscope.collect.trigger import Target, TraceOptions, TraceRequest, trigger_trace, wait_for_trace
from kinetoscope.demo.local import LocalDaemon, TrainingJob, child_env
from kinetoscope.diagnosis.stragglers.kinds import job_kind, rank_kind
from kinetoscope.protocol.manifest import read_manifest

REPO_ROOT = Path(__file__).resolve().parents[2]
ITERATIONS = 16


def _daemon_runs() -> Any:
    """``tests/diagnosis/daemon_runs.py`` (the real-DDP harness of the tests), imported by path."""
    path = REPO_ROOT / "tests" / "diagnosis" / "daemon_runs.py"
    spec = importlib.util.spec_from_file_location("kscope_daemon_runs", path)
    assert spec and spec.loader, path
    if spec.name in sys.modules:
        return sys.modules[spec.name]
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


@dataclass
class CpuScenario:
    sid: str
    type: str
    world: int
    mode: str  # train_knobs --mode
    hit: list[int]
    ms: float
    kind: str  # expected kind
    extra: dict[str, Any] = field(default_factory=dict)

    def args(self) -> list[str]:
        a = ["--mode", self.mode, "--ms", f"{self.ms:g}", "--ranks-hit", ",".join(map(str, self.hit))]
        if self.mode == "intermittent":
            a += ["--prob", str(self.extra.get("prob", 0.3)), "--seed", str(self.extra.get("seed", 0))]
        if "step_frac" in self.extra:
            a += ["--step-frac", f"{self.extra['step_frac']:g}"]
        if self.mode == "mixed":
            a += ["--spec", self.extra["spec"], "--seed", str(self.extra.get("seed", 0))]
        return a


# type -> (mode, number of hit ranks, ms, expected kind). Steps are ~40-120 ms (30 ms emulated
# I/O per batch on every rank plus compute, slower with more ranks and under load).
CPU_TYPES: dict[str, tuple[str, int, float, str]] = {
    "clean": ("none", 0, 0.0, "none"),
    "persistent": ("sleep", 1, 30.0, "persistent"),
    "compute": ("compute", 1, 30.0, "persistent"),
    "intermittent": ("intermittent", 0, 60.0, "intermittent"),
    "persistent2": ("sleep", 2, 30.0, "persistent"),
    "slow_input": ("slow_input", 1, 30.0, "persistent"),
    "small": ("compute", 1, 3.0, "persistent"),
    "comm_hook": ("comm_hook", 1, 15.0, "persistent"),
}
# Types whose delay is a fraction of the step instead of ``ms`` (train_knobs ``--step-frac``;
# ``ms`` is then only the first steps' delay): "small" holds 8 % of the step it would have
# without the delay, i.e. 7.4 % of the step, between the 5 % below which a verdict is `none`
# (docs/diagnosis-stragglers.md) and issue 9's "<= 8 % of a step".
STEP_FRACTION: dict[str, float] = {"small": 0.08}
# How "small" holds its delay: busy (``compute``, the default) or asleep (``sleep``, how the runs
# before diag15 held it). A rank asleep on a host with more runnable processes than cores gets its
# CPU share back when it wakes, so the host absorbs much of a small sleep and its label is false
# by the arrival-order truth (docs/validation-diagnosis.md "Results: diag15"); extra host work does not.
SMALL_MODES = ("compute", "sleep")
WORLDS = (2, 3, 4, 5, 6, 8)


def scenarios(
    n: int, seed: int = 0, only: Collection[str] | None = None, small_mode: str | None = None
) -> list[CpuScenario]:
    """``n`` scenarios: the types in order, then again, with world sizes cycling over 2..8.
    ``seed`` 0 is the set earlier rounds were scored on; another seed draws other straggler ranks,
    intermittent draws and world sizes (jobs the thresholds were not tuned on). ``only``: the
    first ``n`` scenarios of these types in that same sequence (same names, worlds and ranks).
    ``small_mode``: how the "small" type holds its delay (``SMALL_MODES``; None: ``CPU_TYPES``')."""
    if only is not None and not set(only) <= set(CPU_TYPES):
        raise ValueError(f"unknown CPU scenario type(s): {sorted(set(only) - set(CPU_TYPES))}")
    if small_mode is not None and small_mode not in SMALL_MODES:
        raise ValueError(f"unknown small mode {small_mode!r} (one of {', '.join(SMALL_MODES)})")
    out: list[CpuScenario] = []
    types = list(CPU_TYPES)
    if only is not None and not only:
        return out
    for k in count():
        if len(out) == n:
            break
        t = types[k % len(types)]
        if only is not None and t not in only:
            continue
        world = WORLDS[(k + k // len(types) + seed) % len(WORLDS)]
        mode, nhit, ms, kind = CPU_TYPES[t]
        mode = small_mode if t == "small" and small_mode else mode
        # a straggler needs a punctual peer: with every rank hit (two of two) nobody waits for
        # anybody in particular and `none` is the right verdict (seed 2 drew such a job)
        world = max(world, nhit + 1)
        rng = random.Random(f"cpu/{t}/{k}/{seed}")
        hit = sorted(rng.sample(range(world), min(nhit, world)))
        name = f"cpu-{t}-w{world}-{k}" + (f"-s{seed}" if seed else "")
        extra: dict[str, Any] = {"seed": k + 1000 * seed, "prob": 0.3}
        if t in STEP_FRACTION:
            extra["step_frac"] = STEP_FRACTION[t]
        out.append(CpuScenario(name, t, world, mode, hit, ms, kind, extra))
    return out


# Issue 27's scenario types, drawn only when asked (``new_scenarios``; ``bench_diagnosis.py
# --new-cpu-jobs``): ``scenarios`` and its seeds' jobs are unchanged. type -> (mode, per-rank
# kinds of the hit ranks, ms, expected kind). Each needs two punctual ranks beside its stragglers.
NEW_CPU_TYPES: dict[str, tuple[str, tuple[str, ...], float, str]] = {
    # each step with p ~ U(0.2, 0.4) (drawn per job), one random rank stalls 80 % of its step
    "rotating": ("intermittent", (), 60.0, "rotating"),
    # two ranks asleep exactly as long every step: each is last only by the host's noise
    "masking": ("mixed", ("sleep", "sleep"), 30.0, "persistent"),
    # a persistent rank (asleep every step) and an intermittent one (60 ms, p = 0.3 per step)
    "mixed": ("mixed", ("sleep", "intermittent"), 30.0, "mixed"),
    # the same plus a third rank busy computing 30 ms every step
    "mixed3": ("mixed", ("sleep", "compute", "intermittent"), 30.0, "mixed"),
}
ROTATING_STEP_FRACTION = 0.8  # a rotating stall: 80 % of the stalled rank's step (issue 27)
MIXED_PROB, MIXED_INTERMITTENT_MS = 0.3, 60.0
# an intermittent rank of a mixed job is labelled when it stalled in this many traced steps or
# more (fewer are noise to the verdict by design: docs/diagnosis.md section 5b, MIN_RECURRING);
# stalled in more than half of the steps it is persistent by the verdict's definition (section 5b)
MIN_RECURRING = 3
NEW_WORLDS = (4, 5, 6, 8)


def new_scenarios(
    n: int, seed: int = 0, only: Collection[str] | None = None, worlds: Collection[int] | None = None
) -> list[CpuScenario]:
    """``n`` scenarios of ``NEW_CPU_TYPES`` (or of ``only``), the types in order then again, world
    sizes cycling over ``worlds`` (default ``NEW_WORLDS``), at least two more than the hit ranks;
    every schedule is a function of the names (rank draws, ``--seed`` of the job)."""
    if only is not None and not set(only) <= set(NEW_CPU_TYPES):
        raise ValueError(f"unknown new CPU scenario type(s): {sorted(set(only) - set(NEW_CPU_TYPES))}")
    types = [t for t in NEW_CPU_TYPES if only is None or t in only]
    sizes = tuple(worlds or NEW_WORLDS)
    out: list[CpuScenario] = []
    for k in range(n if types else 0):
        t = types[k % len(types)]
        mode, kinds, ms, kind = NEW_CPU_TYPES[t]
        world = max(sizes[(k + k // len(types) + seed) % len(sizes)], len(kinds) + 2)
        rng = random.Random(f"cpu-new/{t}/{k}/{seed}")
        hit = rng.sample(range(world), len(kinds))
        extra: dict[str, Any] = {"seed": 7000 + k + 1000 * seed}
        if t == "rotating":
            extra |= {"prob": round(rng.uniform(0.2, 0.4), 3), "step_frac": ROTATING_STEP_FRACTION}
        else:
            extra["spec"] = ",".join(
                f"{r}:{kd}:{MIXED_INTERMITTENT_MS:g}:{MIXED_PROB:g}"
                if kd == "intermittent"
                else f"{r}:{kd}:{ms:g}"
                for r, kd in zip(hit, kinds, strict=True)
            )
            extra["kinds"] = dict(zip(map(str, hit), kinds, strict=True))
        name = f"cpu-{t}-w{world}-n{k}-s{seed}"
        out.append(CpuScenario(name, t, world, mode, sorted(hit), ms, kind, extra))
    return out


def stall_steps(injected: dict[int, dict[int, float]]) -> dict[int, list[int]]:
    """Rank -> the traced steps (indices) it was made to stall in, from the job's own log."""
    out: dict[int, list[int]] = {}
    for k, by_rank in sorted(injected.items()):
        for r in by_rank:
            out.setdefault(int(r), []).append(int(k))
    return out


def stall_label(injected: dict[int, dict[int, float]], n_steps: int) -> tuple[str, list[int]]:
    """Expected (kind, ranks) of a job whose ranks stall at random (``intermittent`` and
    ``rotating`` types): every rank that stalled, the kind by the verdict's own taxonomy
    (``kinetoscope.diagnosis.stragglers.kinds.job_kind``) applied to the steps each rank was made
    to stall in (the injection log, not the product's reading of the trace): ``rotating`` when
    the stalls move between ranks, ``intermittent`` for a specific few, ``none`` when nobody
    stalled."""
    late = stall_steps(injected)
    return job_kind(late, n_steps), sorted(late)


def new_label(sc: CpuScenario, injected: dict[int, dict[int, float]], n_steps: int) -> tuple[str, list[int]]:
    """Expected (kind, ranks) of a new-type job from who stalled in the traced steps:
    ``rotating``: ``stall_label``; ``mixed``: the persistent ranks and
    the intermittent rank when it stalled in ``MIN_RECURRING`` of the ``n_steps`` traced steps or
    more (else its kind is the rest's), as a persistent one when in more than half of them (the
    verdict's definition); ``masking``: the two ranks."""
    stalls: dict[int, int] = {}
    for by_rank in injected.values():
        for r in by_rank:
            stalls[r] = stalls.get(r, 0) + 1
    if sc.type == "rotating":
        return stall_label(injected, n_steps)
    kinds = {int(r): k for r, k in sc.extra.get("kinds", {}).items()}
    ranks = sorted(r for r, k in kinds.items() if k != "intermittent" or stalls.get(r, 0) >= MIN_RECURRING)
    has_int = any(
        kinds[r] == "intermittent" and rank_kind(stalls[r], n_steps) == "intermittent" for r in ranks
    )
    return ("mixed" if has_int else "persistent"), ranks


def _burner() -> subprocess.Popen[bytes]:
    """One extra CPU-bound process (the other load of a shared node)."""
    return subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True)


def run(
    sc: CpuScenario,
    workdir: Path,
    timeout_s: float = 240.0,
    *,
    burners: int = 1,
    job_args: tuple[str, ...] = (),
    daemon_args: tuple[str, ...] = (),
    while_running: Any = None,
) -> tuple[list[str], list[int], dict[str, Any]]:
    """Run, trace and label one scenario: (trace files, expected ranks, facts).

    ``burners``: how many extra CPU-burning processes run beside the job; ``job_args``: more
    ``train_knobs`` arguments (``--device cuda``); ``daemon_args``: more ``kscope daemon`` arguments; ``while_running``:
    called with the daemon once the traced steps are written (a metrics scrape, say)."""
    dr = _daemon_runs()
    workdir.mkdir(parents=True, exist_ok=True)
    job_id = random.randint(10_000, 2**31 - 1)
    deadline = time.monotonic() + timeout_s
    left = lambda cap: max(1.0, min(cap, deadline - time.monotonic()))  # noqa: E731
    load = [_burner() for _ in range(burners)]
    try:
        with LocalDaemon(workdir, trace_root=workdir / "traces", extra_args=daemon_args) as daemon:
            env = {**daemon.kineto_env(), "SLURM_JOB_ID": str(job_id)}
            job = TrainingJob(workdir, ranks=sc.world, env=env, max_seconds=timeout_s + 30)
            job.argv = [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--standalone",
                f"--nproc-per-node={sc.world}",
                "-m",
                "benchmarks.diag_scenarios.train_knobs",
                *sc.args(),
                *job_args,
                "--max-seconds",
                str(timeout_s + 30),
                "--progress-dir",
                str(job.progress_dir),
            ]
            job.env = child_env(
                {
                    **env,
                    "OMP_NUM_THREADS": "1",
                    "PYTHONPATH": f"{REPO_ROOT}:{child_env().get('PYTHONPATH', '')}",
                }
            )
            with job:
                daemon.wait_for_processes(sc.world, job_id=job_id, timeout=left(150), alive=job.alive)
                # enough steps that the rate the roundup is computed from is past start-up (a GPU
                # job's first steps are 10x slower: with 3, ranks straddled the roundup on an H200)
                job.wait_for_steps(8, timeout=left(90))
                roundup = job.iteration_roundup(2.5 + 0.3 * sc.world)
                res = trigger_trace(
                    TraceRequest(
                        [daemon.address],
                        Target(job_id=job_id, job_id_text=str(job_id)),
                        TraceOptions(iterations=ITERATIONS, iteration_roundup=roundup),
                    )
                )
                if res.errors or len(res.triggered) != sc.world:
                    raise RuntimeError(
                        f"trigger: {[e.message for e in res.errors]}, {len(res.triggered)}/{sc.world}"
                    )
                res = wait_for_trace(res, timeout=left(90), poll_interval=0.3)
                if not res.ok:
                    raise RuntimeError("; ".join(e.message for e in res.errors) + f"\n{job.tail()}")
                if while_running is not None:
                    while_running(daemon)
                job.stop()
    finally:
        for b in load:
            b.kill()
            b.wait()
    trace_dir = Path(res.output_dir or "")
    files = {f.rank: str(trace_dir / f.file) for f in read_manifest(trace_dir).files if f.rank is not None}
    steps, injected = dr.ground_truth(job, files, roundup, ITERATIONS)
    slept = sorted({r for d in injected.values() for r in d})
    expected = slept if sc.type == "intermittent" else sorted(sc.hit)
    new_kind = sc.kind
    if sc.type in NEW_CPU_TYPES:
        new_kind, expected = new_label(sc, injected, len(steps))
    elif sc.type == "intermittent":  # the same taxonomy as the new rotating type
        new_kind, expected = stall_label(injected, len(steps))
    facts = {
        "traced_steps": [steps[0], steps[-1]],
        "ranks_injected_in_window": slept,
        "events": sum(len(d) for d in injected.values()),
        "step_ms": _median_step_ms(job, sc.world, steps),
    }
    if sc.type in NEW_CPU_TYPES or sc.type == "intermittent":
        facts |= {
            "expected_kind": new_kind,
            "stalls": {r: sum(r in d for d in injected.values()) for r in slept},
            "stall_steps": stall_steps(injected),
        }
    return [str(trace_dir)], expected, facts


def _median_step_ms(job: TrainingJob, world: int, steps: list[int]) -> float:
    """Median wall time from one step's start to the next (batch loading included), traced steps."""
    want = set(steps)
    gaps = []
    for r in range(world):
        log = {s["step"]: s["t0"] for s in job.step_log(r)}
        gaps += [(log[k + 1] - log[k]) * 1000.0 for k in sorted(want) if k in log and k + 1 in log]
    gaps.sort()
    return round(gaps[len(gaps) // 2], 1) if gaps else 0.0
