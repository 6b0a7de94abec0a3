"""Real DDP jobs (gloo, CPU) traced on demand through a private ``kscope daemon``.

``collect_traces`` is what production does, end to end, with nothing in the training script:

1. start a ``LocalDaemon`` (private port, IPC socket and trace root);
2. run ``kinetoscope.demo.train_ddp`` under torchrun (``TrainingJob``) with the daemon's Kineto
   environment (``KINETO_USE_DAEMON=1``, its socket dir, 1 s polling) and ``SLURM_JOB_ID``;
3. wait until every rank is registered *and stepping* (an iteration request that reaches a rank
   before its first ``optimizer.step()`` becomes a 500 ms duration trace);
4. trigger an iteration-based trace of the job by job id over the daemon's RPC
   (``trigger_trace`` = ``kscope trace --job-id ID --iterations N --iteration-roundup R``, R far
   enough ahead that every rank starts at the same iteration), wait for the files
   (``wait_for_trace``), stop the job.

The trace folder holds one ``rank-<r>_<pid>.pt.trace.json`` per rank and the ``manifest.json``
written by the trigger (ranks come from it: on-demand traces have no ``distributedInfo``).

Ground truth comes from the job's own progress files (``rank-<r>.steps.jsonl``: per step, its
wall-clock start/duration, the straggler sleep and the end of its ``optimizer.step()``). Each
traced iteration is matched to the job's step by time: a trace's timestamps are
``baseTimeNanoseconds`` + ``ts`` on the wall clock, and its ``Optimizer.step#`` annotation ends
when the job logs ``opt_end``. ``TracedRun.injected`` maps the
diagnosis's step labels (0 = the first traced iteration) to ``{rank: ms slept}``.

Usable outside pytest (e.g. to collect many runs when tuning thresholds)::

    PYTHONPATH=. python tests/diagnosis/daemon_runs.py OUT_DIR none persistent intermittent
"""

from __future__ import annotations

import json
import random
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

REPO_ROOT = Path(__file__).resolve().parents[2]
if str(REPO_ROOT) not in sys.path:  # when run as a script
    sys.path.insert(0, str(REPO_ROOT))

from kinetoscope.collect.trigger import Target, TraceOptions, TraceRequest, trigger_trace, wait_for_trace  # noqa: E402
from kinetoscope.demo.local import LocalDaemon, TrainingJob  # noqa: E402
from kinetoscope.protocol.manifest import read_manifest  # noqa: E402

RANKS = 4
ITERATIONS = 16
# Every rank reads each batch through a DataLoader whose dataset sleeps 30 ms (emulated I/O): it
# keeps the 4 ranks from all competing for the 2 CPU cores at once. Small DDP buckets (0.02 MiB):
# two all-reduces per step (several, as in real models).
COMMON: dict[str, Any] = {"model": "tiny", "load_ms": 30.0, "bucket_cap_mb": 0.02}
DELAY_MS = 150.0
# Injected stragglers: a sleep between the loss and backward() (the PyTorch post's emulation).
SCENARIOS: dict[str, dict[str, Any]] = {
    "none": {"straggler": "none"},
    # rank 2 sleeps 150 ms in every step
    "persistent": {"straggler": "persistent", "straggler_rank": 2, "straggler_ms": (DELAY_MS, DELAY_MS)},
    # each step, with p = 0.5, one rank drawn at random (seeded: the same draw on every rank)
    # sleeps. Seed 0: every 16-step window starting after step 10..400 has >= 5 such events on
    # >= 2 ranks (where the trace starts depends on the roundup, i.e. on timing)
    "intermittent": {
        "straggler": "intermittent",
        "straggler_rank": -1,
        "straggler_prob": 0.5,
        "straggler_ms": (DELAY_MS, DELAY_MS),
        "seed": 0,
    },
}


class CollectFailed(RuntimeError):
    pass


@dataclass
class TracedRun:
    trace_dir: Path
    scenario: dict[str, Any]
    job_steps: list[int]  # the job's (0-based) step of each traced iteration, in order
    injected: dict[int, dict[int, float]]  # traced iteration index -> {rank: ms slept}, sleeps only
    roundup: int
    timings: dict[str, float] = field(default_factory=dict)

    def injected_pairs(self) -> set[tuple[int, int]]:
        """(step, rank) pairs where a rank slept, step = diagnosis label (0 = first traced)."""
        return {(s, r) for s, ranks in self.injected.items() for r in ranks}

    def to_json(self) -> dict[str, Any]:
        return {
            "trace_dir": str(self.trace_dir),
            "scenario": {k: list(v) if isinstance(v, tuple) else v for k, v in self.scenario.items()},
            "job_steps": self.job_steps,
            "injected": {str(s): {str(r): ms for r, ms in d.items()} for s, d in self.injected.items()},
            "roundup": self.roundup,
            "timings": self.timings,
        }


def _optimizer_step_ends(path: str) -> tuple[list[float], bool]:
    """Wall-clock ends (s) of the trace's ``Optimizer.step#`` annotations, and whether the
    trace had ``baseTimeNanoseconds`` (else the times are on the trace's own clock)."""
    doc = orjson.loads(Path(path).read_bytes())
    base = doc.get("baseTimeNanoseconds")
    ends = sorted(
        (e["ts"] + e.get("dur", 0))
        for e in doc.get("traceEvents") or []
        if isinstance(e, dict)
        and e.get("ph") == "X"
        and e.get("cat") != "gpu_user_annotation"  # a CUDA trace repeats the annotation on the GPU
        and str(e.get("name", "")).startswith("Optimizer.step#")
    )
    if base is None:
        return [t / 1e6 for t in ends], False
    return [(base / 1e3 + t) / 1e6 for t in ends], True


def _logged_optimizer_end(line: dict[str, Any]) -> float:
    """When a step-log line says the step's ``optimizer.step()`` ended: ``opt_end``; a log
    without it (older jobs) gives the step's end, which is later by ``--step-sleep-ms``."""
    if "opt_end" in line:
        return float(line["opt_end"])
    return float(line["t0"]) + float(line["dur_ms"]) / 1000.0


def _match_logged_steps(
    rank: int, ends: list[float], log_ends: list[tuple[float, int]], tol_s: float = 0.02
) -> list[int]:
    """The job steps of a rank's traced optimizer-step ends, matched to its step log as one block.

    The traced steps are consecutive, so the block offset with the smallest *median* gap between
    traced and logged step ends wins (and must be within ``tol_s``). Matching each end on its
    own failed when the box was loaded: a rank preempted between ``optimizer.step()`` and its
    log line logs that step's end 30+ ms late, although the block matches exactly."""
    if not ends:
        return []
    times = [e for e, _st in log_ends]
    best: tuple[float, int] | None = None
    for i in range(len(log_ends) - len(ends) + 1):
        gaps = sorted(abs(t - times[i + j]) for j, t in enumerate(ends))
        median = gaps[len(gaps) // 2]
        if best is None or median < best[0]:
            best = (median, i)
    if best is None or best[0] > tol_s:
        nearest = "" if best is None else f"; best median gap {best[0] * 1000:.1f} ms"
        raise CollectFailed(
            f"rank {rank}: the {len(ends)} traced optimizer steps ({ends[0]:.3f}..{ends[-1]:.3f}) "
            f"match no run of its {len(log_ends)} logged steps{nearest}"
        )
    return [st for _e, st in log_ends[best[1] : best[1] + len(ends)]]


def ground_truth(
    job: TrainingJob, files: dict[int, str], roundup: int, iterations: int
) -> tuple[list[int], dict[int, dict[int, float]]]:
    """Which job steps each rank traced (matched by time to its step log) and who slept in them."""
    logs = {r: {s["step"]: s for s in job.step_log(r)} for r in files}
    traced: dict[int, list[int]] = {}
    for r, path in files.items():
        ends, wall = _optimizer_step_ends(path)
        if not wall:  # no wall clock in the trace: Kineto iteration S is the job's step S + 1
            traced[r] = list(range(roundup + 1, roundup + 1 + len(ends)))
            continue
        log_ends = sorted((_logged_optimizer_end(s), s["step"]) for s in logs[r].values())
        traced[r] = _match_logged_steps(r, ends, log_ends)
    # Every rank must start at the same iteration (the roundup's job); Kineto sometimes records
    # one optimizer step more than asked on some rank (observed: 11 of --iterations 10), so the
    # ranks' lists may differ at the end: the truth covers every step any rank traced.
    firsts = {r: v[0] if v else None for r, v in traced.items()}
    if len(set(firsts.values())) != 1 or any(v != list(range(v[0], v[0] + len(v))) for v in traced.values()):
        raise CollectFailed(f"the ranks did not trace the same consecutive iterations: {traced}")
    if min(len(v) for v in traced.values()) < iterations:
        raise CollectFailed(f"expected {iterations} traced iterations, got {traced}")
    first = next(iter(firsts.values()))
    steps = list(range(first, first + max(len(v) for v in traced.values())))
    injected: dict[int, dict[int, float]] = {}
    for k, step in enumerate(steps):
        slept = {
            r: float(logs[r][step]["straggle_ms"])
            for r in files
            if step in traced[r] and logs[r][step]["straggle_ms"] > 0
        }
        if slept:
            injected[k] = slept
    return steps, injected


def collect_traces(
    workdir: Path,
    scenario: dict[str, Any],
    *,
    ranks: int = RANKS,
    iterations: int = ITERATIONS,
    margin_s: float = 2.5,
    timeout_s: float = 120.0,
) -> TracedRun:
    """Run the job under a private daemon, trace ``iterations`` iterations of every rank by job id,
    and return the trace folder with the ground truth (module docstring)."""
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + timeout_s
    left = lambda cap: max(1.0, min(cap, deadline - time.monotonic()))  # noqa: E731
    job_id = random.randint(10_000, 2**31 - 1)
    timings: dict[str, float] = {}
    t0 = time.monotonic()
    with LocalDaemon(workdir, trace_root=workdir / "traces") as daemon:
        env = {**daemon.kineto_env(), "SLURM_JOB_ID": str(job_id)}
        kwargs = {**COMMON, **scenario}
        with TrainingJob(
            workdir,
            ranks=ranks,
            steps=0,
            max_seconds=timeout_s + 30,
            env=env,
            extra_args=["--quiet"],
            **kwargs,
        ) as job:
            daemon.wait_for_processes(ranks, job_id=job_id, timeout=left(90), alive=job.alive)
            job.wait_for_steps(3, timeout=left(60))
            timings["start"] = time.monotonic() - t0
            roundup = job.iteration_roundup(margin_s)
            res = trigger_trace(
                TraceRequest(
                    [daemon.address],
                    Target(job_id=job_id, job_id_text=str(job_id)),
                    TraceOptions(iterations=iterations, iteration_roundup=roundup),
                )
            )
            if res.errors or len(res.triggered) != ranks:
                raise CollectFailed(
                    f"trigger: {[e.message for e in res.errors]}, triggered {len(res.triggered)}/{ranks}"
                )
            res = wait_for_trace(res, timeout=left(60), poll_interval=0.3)
            if not res.ok:
                raise CollectFailed("; ".join(e.message for e in res.errors) + f"\n{job.tail()}")
            timings["traced"] = time.monotonic() - t0
            job.stop_once_logged()
    trace_dir = Path(res.output_dir or "")
    manifest = read_manifest(trace_dir)
    files = {f.rank: str(trace_dir / f.file) for f in manifest.files if f.rank is not None}
    if sorted(files) != list(range(ranks)):
        raise CollectFailed(f"manifest ranks {sorted(files)}, expected 0..{ranks - 1}")
    steps, injected = ground_truth(job, files, roundup, iterations)
    run = TracedRun(trace_dir, dict(scenario), steps, injected, roundup, timings)
    (workdir / "truth.json").write_text(json.dumps(run.to_json(), indent=1))
    return run


def main(argv: list[str]) -> int:
    out = Path(argv[0])
    for i, name in enumerate(argv[1:]):
        d = out / f"{i:02d}-{name}"
        t = time.monotonic()
        run = collect_traces(d, SCENARIOS[name])
        print(
            f"{name}: {run.trace_dir} steps {run.job_steps[0]}..{run.job_steps[-1]} "
            f"injected {sorted(run.injected_pairs())} ({time.monotonic() - t:.0f} s)",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
