"""Real 8-rank CPU jobs on 2-D device meshes (``mesh_job.py``: DP x TP, DP x PP), traced
through ``kscope daemon``, with an arrival-order truth per process group from the job's own logs.

Scenarios (``SCENARIOS``): one slowed rank (DP x TP), one slowed replica (every rank of one
data-parallel replica of DP x PP), one heavy stage (DP x PP, one stage with 3x the layers); then
one slowed rank of a pipeline (DP x PP), two slowed ranks in different groups (DP x TP: ranks 1
and 6; DP x PP: one in each replica, at different stages) and a slowed tensor-parallel group (a
slow node, ranks 4-7 of DP x TP).

Truth (``group_truth``, independent of the product): every rank logs, for each collective it
issues, its group's ranks, a per-group count and the wall time (one host: one clock). The k-th
collective of a group is one instance; its last rank kept the others waiting for its lead over
the next-latest member. Per rank: the share of all that waiting it imposed. On a pipeline the
logged collectives are the data-parallel all-reduces, not the transfers, so the truth charges the
replica that reached them last, not the rank within it that held it back; which ranks slept is
in each rank's step log (``straggle_ms``), and ``slowed`` is the injection.

    python -m benchmarks.diag_scenarios.mesh [--only dp_tp-slow-rank] [--out DIR]

prints, per scenario, the truth's top ranks, the process groups the diagnosis found, how many
instances it matched complete, what its straggler verdict and pipeline report name, and whether
it headlined uneven inputs.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.diag_scenarios.cpu import REPO_ROOT, _daemon_runs
from kinetoscope.collect.trigger import Target, TraceOptions, TraceRequest, trigger_trace, wait_for_trace
from kinetoscope.demo.local import LocalDaemon, TrainingJob, child_env
from kinetoscope.protocol.manifest import read_manifest

ITERATIONS = 8


@dataclass
class MeshScenario:
    sid: str
    layout: str
    slow: list[int]
    slow_ms: float = 0.0
    heavy_stage: int = -1
    extra: list[str] = field(default_factory=list)

    def args(self) -> list[str]:
        a = ["--layout", self.layout, "--dp", "2"]
        if self.slow:
            a += ["--slow-ranks", ",".join(map(str, self.slow)), "--slow-ms", f"{self.slow_ms:g}"]
        if self.heavy_stage >= 0:
            a += ["--heavy-stage", str(self.heavy_stage), "--heavy-factor", "3"]
        return a + self.extra


SCENARIOS = [
    MeshScenario("dp_tp-slow-rank", "dp_tp", [5], 40.0),
    MeshScenario("dp_pp-slow-replica", "dp_pp", [4, 5, 6, 7], 40.0),
    MeshScenario("dp_pp-heavy-stage", "dp_pp", [], heavy_stage=2),
    MeshScenario("dp_pp-slow-rank", "dp_pp", [5], 40.0),
    MeshScenario("dp_tp-slow-pair", "dp_tp", [1, 6], 40.0),
    MeshScenario("dp_pp-slow-pair", "dp_pp", [1, 6], 40.0),
    MeshScenario("dp_tp-slow-node", "dp_tp", [4, 5, 6, 7], 40.0),
]


def run(
    sc: MeshScenario, workdir: Path, world: int = 8, timeout_s: float = 300.0
) -> tuple[Path, Path, list[int]]:
    """Run and trace one scenario: (trace folder, progress folder, traced steps)."""
    dr = _daemon_runs()
    workdir.mkdir(parents=True, exist_ok=True)
    job_id = random.randint(10_000, 2**31 - 1)
    deadline = time.monotonic() + timeout_s
    left = lambda cap: max(1.0, min(cap, deadline - time.monotonic()))  # noqa: E731
    with LocalDaemon(workdir, trace_root=workdir / "traces") as daemon:
        env = {**daemon.kineto_env(), "SLURM_JOB_ID": str(job_id)}
        job = TrainingJob(workdir, ranks=world, env=env, max_seconds=timeout_s + 30)
        job.argv = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc-per-node={world}",
            "-m",
            "benchmarks.diag_scenarios.mesh_job",
            *sc.args(),
            "--max-seconds",
            str(timeout_s + 30),
            "--progress-dir",
            str(job.progress_dir),
        ]
        job.env = child_env(
            {**env, "OMP_NUM_THREADS": "1", "PYTHONPATH": f"{REPO_ROOT}:{child_env().get('PYTHONPATH', '')}"}
        )
        with job:
            daemon.wait_for_processes(world, job_id=job_id, timeout=left(180), alive=job.alive)
            job.wait_for_steps(6, timeout=left(120))
            roundup = job.iteration_roundup(2.5 + 0.3 * world)
            res = trigger_trace(
                TraceRequest(
                    [daemon.address],
                    Target(job_id=job_id, job_id_text=str(job_id)),
                    TraceOptions(iterations=ITERATIONS, iteration_roundup=roundup, record_shapes=True),
                )
            )
            if res.errors or len(res.triggered) != world:
                raise RuntimeError(
                    f"trigger: {[e.message for e in res.errors]}, {len(res.triggered)}/{world}"
                )
            res = wait_for_trace(res, timeout=left(120), poll_interval=0.3)
            if not res.ok:
                raise RuntimeError("; ".join(e.message for e in res.errors) + f"\n{job.tail()}")
            job.stop()
    trace_dir = Path(res.output_dir or "")
    files = {f.rank: str(trace_dir / f.file) for f in read_manifest(trace_dir).files if f.rank is not None}
    steps, _injected = dr.ground_truth(job, files, roundup, ITERATIONS)
    return trace_dir, job.progress_dir, steps


def group_truth(progress: Path, steps: list[int]) -> dict[str, Any]:
    """The arrival-order truth per process group over ``steps`` (module docstring): per rank the
    share of the imposed waiting, the groups seen, and the instances counted."""
    arrivals: dict[tuple[str, int], dict[int, float]] = defaultdict(dict)
    want = set(steps)
    for f in sorted(progress.glob("rank-*.colls.jsonl")):
        rank = int(f.name.split("-")[1].split(".")[0])
        for line in f.read_text().splitlines():
            row = json.loads(line)
            if row["step"] in want:
                arrivals[(row["group"], row["k"])][rank] = row["t"]
    imposed: dict[int, float] = defaultdict(float)
    groups: set[str] = set()
    n = 0
    for (g, _k), arr in arrivals.items():
        members = [int(x) for x in g.split(",")]
        if len(arr) != len(members) or len(members) < 2:
            continue
        n += 1
        groups.add(g)
        order = sorted(arr.items(), key=lambda kv: kv[1])
        imposed[order[-1][0]] += order[-1][1] - order[-2][1]
    total = sum(imposed.values()) or 1.0
    share = {r: round(v / total, 3) for r, v in sorted(imposed.items(), key=lambda kv: -kv[1])}
    return {"instances": n, "groups": sorted(groups), "share": share}


def diagnosis_figures(trace_dir: Path) -> dict[str, Any]:
    """What the product says: groups, matched instances, verdict, pipeline, uneven inputs."""
    from kinetoscope.diagnosis import diagnose

    d = diagnose(trace_dir)
    doc = d.to_dict()
    pipe = doc.get("pipeline") or {}
    return {
        "first_line": d.summary()[0] if d.summary() else "",
        "straggler_kind": d.stragglers.kind,
        "straggler_ranks": d.stragglers.ranks,
        "complete_instances": d.stragglers.instances,
        "partial_instances": d.stragglers.partial_instances,
        "groups": sorted({g for g in d.clock.pairs["group"].unique().to_list() if g}),
        "pipeline_stages": [s["ranks"] for s in pipe.get("stages", [])],
        "pipeline_replica_issue": (pipe.get("replica_issue") or {}).get("ranks"),
        "pipeline_slowest_stage": (pipe.get("imbalance") or {}).get("slowest_stage"),
        "pipeline_excess": (pipe.get("imbalance") or {}).get("excess_fraction"),
        "uneven_inputs": doc.get("uneven_inputs") is not None,
        "max_offset_us": float(d.clock.table["offset_us"].abs().max() or 0.0),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", action="append", help="scenario id (repeatable)")
    ap.add_argument("--out", type=Path, default=Path("mesh-runs"))
    a = ap.parse_args(argv)
    for sc in SCENARIOS:
        if a.only and sc.sid not in a.only:
            continue
        trace_dir, progress, steps = run(sc, a.out / sc.sid)
        row = {"scenario": sc.sid, "slowed": sc.slow, "heavy_stage": sc.heavy_stage}
        row["truth"] = group_truth(progress, steps)
        row["diagnosis"] = diagnosis_figures(trace_dir)
        print(json.dumps(row))
    return 0


if __name__ == "__main__":
    sys.exit(main())
