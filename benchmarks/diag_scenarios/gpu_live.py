"""Real DDP jobs on a GPU, traced through ``kscope daemon``: the device check of the diagnosis.

Every rank of each job runs its model and batches on the machine's GPU(s) (``train_knobs
--device cuda``; several ranks share one GPU, so gloo carries the all-reduces of CUDA tensors),
with a straggler injected as in the CPU benchmark. Kineto records CUDA kernels and memcpys next
to the CPU ops, so the traces are real CUDA traces collected the way a user collects them
(``KINETO_USE_DAEMON=1``, no profiling code in the script).

For each scenario it writes ``OUT/<sid>.tar.gz`` (the trace folder with its manifest, the
ranks' step logs and ``label.json``: expected ranks, kind, the traced steps) and, for all,
``OUT/env.json`` (GPU, torch, timings, errors, a scrape of the first daemon's ``/metrics``;
``LocalDaemon`` turns NVML off, so for the GPU gauges run a plain ``kscope daemon
--metrics-port N`` beside it, as the device command of docs/diagnosis.md "Results: gpu-live" did). The
verdicts are checked off the device (``python -m benchmarks.diag_scenarios.gpu_live --check
DIR``) against the labels and against the standard-library arrival-order truth of
``truth.py``: the device machine is lent for minutes, the analysis needs none of it.

A scenario's ``extra["burners"]`` runs that many CPU-bound processes beside the job (a loaded
host; set 4).

    python -m benchmarks.diag_scenarios.gpu_live --out OUT [--set N]  # on the GPU machine
    python -m benchmarks.diag_scenarios.gpu_live --check OUT          # here: verdict vs truth
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from benchmarks.diag_scenarios.cpu import CpuScenario, run

# sid, type, world, mode, hit ranks, ms, expected kind. One GPU holds every rank of a job.
SCENARIOS = [
    CpuScenario("gpu-clean-w4", "clean", 4, "none", [], 0.0, "none"),
    CpuScenario("gpu-compute-w4", "compute", 4, "compute", [2], 30.0, "persistent"),
    CpuScenario("gpu-persistent-w4", "persistent", 4, "sleep", [1], 30.0, "persistent"),
    CpuScenario(
        "gpu-intermittent-w4", "intermittent", 4, "intermittent", [], 60.0, "intermittent", {"seed": 7}
    ),
    CpuScenario("gpu-comm_hook-w4", "comm_hook", 4, "comm_hook", [0], 15.0, "persistent"),
    CpuScenario("gpu-persistent2-w8", "persistent2", 8, "sleep", [3, 6], 30.0, "persistent"),
    CpuScenario("gpu-clean-w8", "clean", 8, "none", [], 0.0, "none"),
]
# A second set, collected after the first had been checked (other ranks, sizes and types): the
# held-out check of changes made from the first set's findings.
SCENARIOS_2 = [
    CpuScenario("gpu2-clean-w6", "clean", 6, "none", [], 0.0, "none"),
    CpuScenario("gpu2-persistent-w5", "persistent", 5, "sleep", [4], 20.0, "persistent"),
    CpuScenario("gpu2-compute-w3", "compute", 3, "compute", [0], 20.0, "persistent"),
    CpuScenario("gpu2-slow_input-w4", "slow_input", 4, "slow_input", [3], 30.0, "persistent"),
    CpuScenario("gpu2-small-w4", "small", 4, "sleep", [2], 3.0, "persistent"),
    CpuScenario(
        "gpu2-intermittent-w6", "intermittent", 6, "intermittent", [], 60.0, "intermittent", {"seed": 11}
    ),
    CpuScenario("gpu2-persistent2-w6", "persistent2", 6, "sleep", [1, 4], 30.0, "persistent"),
]
# A third, mostly clean jobs (the verdict users see most), collected after set 2 was scored.
SCENARIOS_3 = [
    CpuScenario("gpu3-clean-w6", "clean", 6, "none", [], 0.0, "none"),
    CpuScenario("gpu3-clean-w3", "clean", 3, "none", [], 0.0, "none"),
    CpuScenario("gpu3-compute-w6", "compute", 6, "compute", [5], 15.0, "persistent"),
    CpuScenario("gpu3-clean-w5", "clean", 5, "none", [], 0.0, "none"),
    CpuScenario("gpu3-comm_hook-w5", "comm_hook", 5, "comm_hook", [2], 10.0, "persistent"),
]
# A fourth, the held-out check of the naming rules written since set 3 (diag6-diag13): every CPU
# type, 2-8 ranks, "small" as 8 % of the rank's own step, and a loaded host on about half of the
# jobs (``burners``: that many extra CPU-bound processes on the machine's 16 cores, so the ranks,
# the daemon and gloo's threads compete for them as on a shared node).
_LOAD = {"burners": 14}
SCENARIOS_4 = [
    CpuScenario("gpu4-persistent-w8", "persistent", 8, "sleep", [5], 20.0, "persistent", _LOAD),
    CpuScenario("gpu4-clean-w8", "clean", 8, "none", [], 0.0, "none", _LOAD),
    CpuScenario("gpu4-small-w6", "small", 6, "sleep", [1], 3.0, "persistent", {"step_frac": 0.08}),
    CpuScenario(
        "gpu4-intermittent-w8", "intermittent", 8, "intermittent", [], 60.0, "intermittent", {"seed": 13}
    ),
    CpuScenario("gpu4-persistent2-w8", "persistent2", 8, "sleep", [0, 7], 20.0, "persistent", _LOAD),
    CpuScenario("gpu4-compute-w5", "compute", 5, "compute", [3], 20.0, "persistent", _LOAD),
    CpuScenario("gpu4-clean-w2", "clean", 2, "none", [], 0.0, "none", _LOAD),
    CpuScenario("gpu4-comm_hook-w8", "comm_hook", 8, "comm_hook", [4], 10.0, "persistent"),
    CpuScenario("gpu4-small-w8", "small", 8, "sleep", [6], 3.0, "persistent", {"step_frac": 0.08, **_LOAD}),
    CpuScenario("gpu4-slow_input-w6", "slow_input", 6, "slow_input", [2], 30.0, "persistent"),
    CpuScenario("gpu4-persistent-w2", "persistent", 2, "sleep", [0], 10.0, "persistent"),
    CpuScenario(
        "gpu4-intermittent-w5",
        "intermittent",
        5,
        "intermittent",
        [],
        60.0,
        "intermittent",
        {"seed": 21, **_LOAD},
    ),
    CpuScenario("gpu4-clean-w5", "clean", 5, "none", [], 0.0, "none"),
    CpuScenario("gpu4-persistent2-w4", "persistent2", 4, "sleep", [1, 2], 15.0, "persistent", _LOAD),
    CpuScenario("gpu4-comm_hook-w3", "comm_hook", 3, "comm_hook", [1], 10.0, "persistent", _LOAD),
    CpuScenario("gpu4-compute-w8", "compute", 8, "compute", [0], 10.0, "persistent"),
    CpuScenario("gpu4-small-w3", "small", 3, "sleep", [2], 3.0, "persistent", {"step_frac": 0.08, **_LOAD}),
    CpuScenario("gpu4-clean-w6", "clean", 6, "none", [], 0.0, "none", _LOAD),
]
# A fifth, the held-out check of diag14 (written from set 4's loaded intermittent job): loaded
# intermittent jobs of other seeds and sizes, and a loaded clean, two-straggler and small job.
# Prepared on 2026-11-28 and not collected yet: the device loans were paused before it ran.
SCENARIOS_5 = [
    CpuScenario(
        "gpu5-intermittent-w6",
        "intermittent",
        6,
        "intermittent",
        [],
        60.0,
        "intermittent",
        {"seed": 31, **_LOAD},
    ),
    CpuScenario("gpu5-clean-w4", "clean", 4, "none", [], 0.0, "none", _LOAD),
    CpuScenario(
        "gpu5-intermittent-w8",
        "intermittent",
        8,
        "intermittent",
        [],
        60.0,
        "intermittent",
        {"seed": 37, **_LOAD},
    ),
    CpuScenario("gpu5-persistent2-w6", "persistent2", 6, "sleep", [2, 5], 20.0, "persistent", _LOAD),
    CpuScenario(
        "gpu5-intermittent-w4",
        "intermittent",
        4,
        "intermittent",
        [],
        60.0,
        "intermittent",
        {"seed": 41, **_LOAD},
    ),
    CpuScenario("gpu5-small-w5", "small", 5, "sleep", [3], 3.0, "persistent", {"step_frac": 0.08, **_LOAD}),
]
# A sixth, held out from the what-if verdict's development (issue 27's cases on real GPU jobs):
# stalls rotating over random ranks (p = 0.2-0.4 per step), two near-equal stragglers, and clean
# jobs, half on a loaded host.
SCENARIOS_6 = [
    CpuScenario(
        "gpu6-rotating-w5",
        "intermittent",
        5,
        "intermittent",
        [],
        80.0,
        "intermittent",
        {"seed": 61, "prob": 0.3},
    ),
    CpuScenario(
        "gpu6-rotating-w8",
        "intermittent",
        8,
        "intermittent",
        [],
        80.0,
        "intermittent",
        {"seed": 67, "prob": 0.4, **_LOAD},
    ),
    CpuScenario("gpu6-persistent2-w8", "persistent2", 8, "sleep", [2, 5], 25.0, "persistent", _LOAD),
    CpuScenario("gpu6-persistent2-w4", "persistent2", 4, "sleep", [0, 3], 20.0, "persistent"),
    CpuScenario(
        "gpu6-rotating-w6",
        "intermittent",
        6,
        "intermittent",
        [],
        80.0,
        "intermittent",
        {"seed": 71, "prob": 0.2},
    ),
    CpuScenario("gpu6-clean-w8", "clean", 8, "none", [], 0.0, "none", _LOAD),
]
SETS = {1: SCENARIOS, 2: SCENARIOS_2, 3: SCENARIOS_3, 4: SCENARIOS_4, 5: SCENARIOS_5, 6: SCENARIOS_6}
JOB_ARGS = ("--model", "medium", "--batch-size", "256", "--bucket-cap-mb", "1")
METRICS_PORT = 19464


def _scrape_metrics(into: dict[str, Any]) -> Any:
    def scrape(_daemon: Any) -> None:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{METRICS_PORT}/metrics", timeout=5) as r:
                text = r.read().decode()
            lines = [ln for ln in text.splitlines() if not ln.startswith("#")]
            into["metrics_gpu_lines"] = [ln for ln in lines if "gpu" in ln.lower()][:60]
            into["metrics_names"] = sorted({ln.split("{")[0].split(" ")[0] for ln in lines})[:200]
        except OSError as e:
            into["metrics_error"] = repr(e)

    return scrape


def _gpu_facts() -> dict[str, Any]:
    facts: dict[str, Any] = {}
    try:
        import torch

        facts["torch"] = torch.__version__
        facts["cuda_available"] = torch.cuda.is_available()
        if torch.cuda.is_available():
            facts["gpu"] = torch.cuda.get_device_name(0)
            facts["gpu_count"] = torch.cuda.device_count()
    except Exception as e:  # noqa: BLE001 - a report of what the machine has
        facts["torch_error"] = repr(e)
    smi = shutil.which("nvidia-smi")
    if smi:
        facts["nvidia_smi"] = subprocess.run([smi, "-L"], capture_output=True, text=True).stdout.strip()
    return facts


def _pack(tarball: Path, sid: str, work: Path, traces: Path, label: dict[str, Any]) -> None:
    """The trace folder, its label and the job's step logs and output, as one tarball."""
    (work / "label.json").write_text(json.dumps(label, indent=1))
    with tarfile.open(tarball, "w:gz") as tar:
        tar.add(traces, arcname=f"{sid}/traces")
        tar.add(work / "label.json", arcname=f"{sid}/label.json")
        for extra in [*work.glob("*-progress"), *work.glob("*.log")]:
            tar.add(extra, arcname=f"{sid}/{extra.name}")


def collect(out: Path, only: list[str], timeout_s: float, device: str = "cuda", which: int = 1) -> int:
    out.mkdir(parents=True, exist_ok=True)
    env: dict[str, Any] = {"machine": _gpu_facts(), "scenarios": {}}
    failures = 0
    for k, sc in enumerate(s for s in SETS[which] if not only or s.sid in only):
        t0 = time.monotonic()
        burners = int(sc.extra.get("burners", 0))
        rec: dict[str, Any] = {"type": sc.type, "world": sc.world, "hit": sc.hit, "burners": burners}
        work = Path(tempfile.mkdtemp(prefix=f"{sc.sid}-"))
        try:
            daemon_args = ("--metrics-port", str(METRICS_PORT)) if k == 0 else ()
            dirs, expected, facts = run(
                sc,
                work,
                timeout_s,
                burners=burners,
                job_args=("--device", device, *JOB_ARGS),
                daemon_args=daemon_args,
                while_running=_scrape_metrics(env) if k == 0 else None,
            )
            label = {"sid": sc.sid, "type": sc.type, "expected": expected, "kind": sc.kind, **facts}
            _pack(out / f"{sc.sid}.tar.gz", sc.sid, work, Path(dirs[0]), label)
            rec.update(expected=expected, facts=facts, bytes=(out / f"{sc.sid}.tar.gz").stat().st_size)
        except Exception as e:  # noqa: BLE001 - one failed scenario must not lose the others
            failures += 1
            rec["error"] = f"{type(e).__name__}: {e}"[-3000:]
            daemon_log = work / "daemon.log"
            if daemon_log.exists():
                rec["daemon_log_tail"] = daemon_log.read_text(errors="replace")[-1000:]
            folders = sorted(p.parent for p in (work / "traces").rglob("manifest.json"))
            if folders:  # keep what was collected, labelled with the error
                label = {
                    "sid": sc.sid,
                    "type": sc.type,
                    "hit": sc.hit,
                    "kind": sc.kind,
                    "error": rec["error"],
                }
                _pack(out / f"{sc.sid}.failed.tar.gz", sc.sid, work, folders[-1], label)
        rec["seconds"] = round(time.monotonic() - t0, 1)
        env["scenarios"][sc.sid] = rec
        print(json.dumps({sc.sid: rec})[:600], flush=True)
        (out / "env.json").write_text(json.dumps(env, indent=1))
    return 1 if failures else 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.diag_scenarios.gpu_live")
    p.add_argument("--out", type=Path, help="run the scenarios here (the GPU machine)")
    p.add_argument("--set", type=int, choices=sorted(SETS), default=1, help="scenario set")
    p.add_argument("--only", nargs="*", default=[], help="scenario ids (default: all)")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds per scenario")
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"), help="cpu: try the script")
    p.add_argument("--check", type=Path, help="check the verdicts of the tarballs in this folder")
    args = p.parse_args(argv)
    if args.check:
        from benchmarks.diag_scenarios.gpu_live_check import check

        return check(args.check)
    if not args.out:
        p.error("--out or --check is required")
    return collect(args.out, args.only, args.timeout, args.device, args.set)


if __name__ == "__main__":
    sys.exit(main())
