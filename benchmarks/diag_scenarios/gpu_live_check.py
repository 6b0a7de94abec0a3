"""Check the verdicts on the real GPU jobs that ``gpu_live`` collected (off the GPU machine).

For each ``<sid>.tar.gz``: the straggler verdict against the injection label (ranks, kind) and
against the standard-library arrival-order truth (``truth.cpu_ground_truth``: gloo carries the
all-reduces, so the ``c10d::allreduce_`` ops are the instances), plus what the traces hold on the
GPU side (kernels, memcpys, their busy time), from the raw JSON, so a reader sees that the
verdict was reached on real CUDA traces. Prints one row per job and the precision/recall summary.
"""

from __future__ import annotations

import json
import tarfile
import tempfile
from pathlib import Path
from typing import Any

from benchmarks.diag_scenarios import truth
from benchmarks.diag_scenarios.score import Outcome, summary_by_type, table


def gpu_side(files: list[Path]) -> dict[str, Any]:
    """Kernels and memcpys of the traces (raw JSON), and the GPU's share of the traced span."""
    kernels = memcpys = 0
    busy_us = span_us = 0.0
    for f in files:
        events = truth.load_json(f).get("traceEvents", [])
        cats = [e for e in events if e.get("ph") == "X"]
        k = [e for e in cats if e.get("cat") == "kernel"]
        kernels += len(k)
        memcpys += sum(1 for e in cats if e.get("cat") in ("gpu_memcpy", "gpu_memset"))
        busy_us += sum(float(e.get("dur", 0)) for e in k)
        ts = [float(e["ts"]) for e in cats if "ts" in e]
        span_us += (max(ts) - min(ts)) if ts else 0.0
    return {
        "kernels": kernels,
        "memcpys": memcpys,
        "kernel_busy_share": round(busy_us / span_us, 3) if span_us else 0.0,
    }


def check_one(tarball: Path, into: Path) -> tuple[Outcome, dict[str, Any]]:
    from benchmarks.bench_diagnosis import check_cpu_truth, verdict

    with tarfile.open(tarball) as tar:
        tar.extractall(into, filter="data")
    sid = tarball.name.removesuffix(".tar.gz")
    label = json.loads((into / sid / "label.json").read_text())
    traces = into / sid / "traces"
    kind = label["kind"] if label["expected"] or label["type"] != "intermittent" else "none"
    o = Outcome(sid, "gpu-live", label["type"], kind, sorted(label["expected"]), "error", [])
    o.params = {"step_ms": label.get("step_ms"), "traced_steps": label.get("traced_steps")}
    files = sorted(traces.glob("rank-*.json"))
    check_cpu_truth(o, [traces])
    v = verdict([traces])
    o.kind, o.ranks, o.reason = str(v["kind"]), sorted(int(r) for r in v["ranks"]), v.get("reason")
    gt, step, n_steps = truth.cpu_ground_truth(files)
    extra = gpu_side(files) | {
        "truth_stragglers": gt.stragglers,
        "truth_share_per_step": {r: round(us / step / max(n_steps, 1), 3) for r, us in gt.imposed_us.items()}
        if step > 0
        else {},
        "lost_fraction": v.get("lost_fraction"),
    }
    return o, extra


def check(folder: Path) -> int:
    outcomes: list[Outcome] = []
    with tempfile.TemporaryDirectory() as tmp:
        for tb in sorted(folder.glob("*.tar.gz")):
            if tb.name.endswith(".failed.tar.gz"):  # collected, but not labelled: not scored
                print(json.dumps({"sid": tb.name, "skipped": "not labelled (see env.json)"}))
                continue
            o, extra = check_one(tb, Path(tmp))
            outcomes.append(o)
            print(
                json.dumps(
                    {
                        "sid": o.sid,
                        "verdict": [o.kind, o.ranks],
                        "expected": [o.expected_kind, o.expected_ranks],
                        "truth_ok": o.truth_ok,
                        **extra,
                    }
                )
            )
    print(table(summary_by_type(outcomes, sorted({o.type for o in outcomes}))))
    return 0
