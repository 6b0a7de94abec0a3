"""A fleet catalog as the autopilot leaves it, built through the real parts: each sample is a
synthetic GPU trace (``repeated_profiling``) recorded as a trace request (manifest import),
analysed by the real pipeline, judged (``service.sample_outcome``) and recorded in the fleet
tables, one sample an hour. Two jobs' later samples carry repeated-profiling corruption; one
Slurm job was also traced by hand, and one job only by hand; the last sweep saw every job
running but ``proc:node05:4242``, which has ended."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from pathlib import Path

from kinetoscope.autopilot.policy import Policy
from kinetoscope.autopilot.service import sample_outcome
from kinetoscope.orchestration import AnalyzeRequest, analyze, record_run
from kinetoscope.store.catalog import Catalog
from kinetoscope.store.fleet import FleetStore, SeenJob
from tests.autopilot.repeated_profiling import write_sample

# job key -> (Kineto job id, GPU busy share, samples that are later profiling runs gone bad)
JOBS: dict[str, tuple[str, float, tuple[int, ...]]] = {
    "slurm:1001": ("1001", 0.22, ()),
    "slurm:1002": ("1002", 0.35, (2, 3)),
    "torch:node03:29500:run-a": ("0", 0.48, ()),
    "slurm:1004": ("1004", 0.62, (1,)),
    "proc:node05:4242": ("0", 0.81, ()),
}
SAMPLES = 4
DEVICES = 8
HAND_TRACED = ("kst-20261128-090000-hand01", "1001")  # a trace of slurm:1001 by hand
HAND_ONLY = ("kst-20261128-090500-hand02", "777")  # a job only ever traced by hand


def _record(cat: Catalog, folder: Path, trace_id: str, job_id: str, host: str, created: str) -> None:
    manifest = {
        "kinetoscope_manifest": 1,
        "trace_id": trace_id,
        "created": created,
        "hosts": [host],
        "files": [
            {
                "file": "rank-0_4242.pt.trace.json",
                "host": host,
                "pid": 4242,
                "rank": 0,
                "world_size": 1,
                "job_id": job_id,
                "cmdline": f"python train.py --job {job_id}",
                "complete": True,
            }
        ],
    }
    (folder / "manifest.json").write_text(json.dumps(manifest), encoding="utf-8")
    cat.import_trace_dir(folder)


def seed_fleet(url: str, root: Path, policy: Policy | None = None) -> None:
    policy = policy or Policy(interval_s=3600.0)
    start = datetime.now(timezone.utc).replace(microsecond=0) - timedelta(hours=SAMPLES + 1)
    with Catalog.open(url) as cat:
        store = FleetStore(cat)
        store.upsert_jobs(
            [
                SeenJob(
                    key,
                    kid,
                    f"python train.py --job {key}",
                    [f"node0{i + 1}:1778"],
                    [{"pid": 4242}],
                    8,
                    DEVICES,
                    False,
                    60,
                )
                for i, (key, (kid, _, _)) in enumerate(JOBS.items())
            ],
            warmup_s=0,
            now=start,
        )
        for n in range(SAMPLES):
            at = start + timedelta(hours=n)
            for j, (key, (kid, busy, bad)) in enumerate(JOBS.items()):
                sid = f"kst-{at:%Y%m%d-%H%M%S}-{j:012x}"
                folder = root / sid
                write_sample(folder, busy + 0.03 * ((n + j) % 3), corrupt=24 if n in bad else 0, steps=8)
                _record(cat, folder, sid, kid, f"node0{j + 1}", f"{at:%Y-%m-%dT%H:%M:%SZ}")
                run = analyze(AnalyzeRequest(inputs=(sid,)), catalog=cat)
                rec = record_run(cat, run)
                state, reason, detail, summary = sample_outcome(
                    run.document, list(run.paths), DEVICES, policy
                )
                assert store.claim(
                    key, "seed", sid, [f"node0{j + 1}:1778"], 60, 3600, {"pids": [4242]}, now=at
                )
                store.finish(sid, state, summary=summary, analysis_id=rec.id, reason=reason, error=detail)
        seen = [
            SeenJob(
                key,
                kid,
                f"python train.py --job {key}",
                [f"node0{i + 1}:1778"],
                [{"pid": 4242}],
                8,
                DEVICES,
                False,
                3600.0 * SAMPLES,
            )
            for i, (key, (kid, _, _)) in enumerate(JOBS.items())
            if key != "proc:node05:4242"
        ]
        store.upsert_jobs(seen, warmup_s=0, interval_s=policy.interval_s)  # the latest sweep
        store.mark_ended(["node05:1778"], [j.job_key for j in seen])  # proc:node05:4242 has exited
        for trace_id, job_id in (HAND_TRACED, HAND_ONLY):
            folder = root / trace_id
            write_sample(folder, 0.5, steps=8)
            _record(cat, folder, trace_id, job_id, "node09", f"{start:%Y-%m-%dT%H:%M:%SZ}")
