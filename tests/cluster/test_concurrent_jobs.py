"""Four concurrent torchrun jobs on one host, no Slurm: four jobs, each with its own traces.

Kineto reports job id 0 for all four (no SLURM_JOB_ID); before job identity they became one
"job 0". Two jobs use ``--standalone`` (a random TORCHELASTIC_RUN_ID each), two torchrun's
default static rendezvous (run id "none", different ports), so both torchrun rules are exercised.
Tiny jobs: one rank each.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest
from cluster_helpers import REPO_ROOT, kscope_env, run_kscope, trace_json, wait_for

from kinetoscope.demo.local import LocalDaemon, ManagedProcess, child_env

pytest.importorskip("torch")
pytestmark = [pytest.mark.torch, pytest.mark.slow]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _job(workdir: Path, daemon: LocalDaemon, name: str, standalone: bool) -> ManagedProcess:
    rdzv = ["--standalone"] if standalone else ["--master-addr=127.0.0.1", f"--master-port={_free_port()}"]
    argv = [
        sys.executable, "-m", "torch.distributed.run", *rdzv, "--nproc-per-node=1",
        "-m", "kinetoscope.demo.train_ddp", "--steps", "0", "--max-seconds", "240", "--quiet",
    ]  # fmt: skip
    env = child_env({**daemon.kineto_env(), "OMP_NUM_THREADS": "1"})
    for key in [k for k in env if k.startswith(("SLURM_", "TORCHELASTIC_"))]:
        del env[key]
    return ManagedProcess(name, argv, workdir / f"{name}.log", env, cwd=str(REPO_ROOT)).start()


def test_four_torchrun_jobs_are_four_jobs_with_their_own_traces(tmp_path: Path) -> None:
    catalog = str(tmp_path / "catalog.db")
    with LocalDaemon(tmp_path / "d") as daemon:
        jobs = [_job(tmp_path, daemon, f"job{i}", standalone=i < 2) for i in range(4)]
        try:

            def ranks() -> list[dict] | None:
                for j in jobs:
                    assert j.poll() is None, f"{j.name} stopped:\n{j.tail()}"
                procs = [
                    msgspec.to_builtins(p)
                    for p in daemon.list_processes()
                    if p.rank is not None and not p.is_launcher
                ]
                return procs if len(procs) >= 4 else None

            procs = wait_for(ranks, 240, "4 ranks to register")
            assert {p["kineto_job_id"] for p in procs} == {"0"}  # what Kineto itself reports
            ids = {p["job_id"] for p in procs}
            assert len(ids) == 4 and all(i.startswith("torchrun:") for i in ids), ids
            launchers = {p["pids"][1] for p in procs}
            assert len(launchers) == 4  # each rank under its own torchrun agent
            runs = [
                subprocess.Popen(
                    [
                        sys.executable,
                        "-m",
                        "kinetoscope.cli.main",
                        "trace",
                        "--host",
                        str(daemon.address),
                        "--job-id",
                        job_id,
                        "--iterations",
                        "2",
                        "--wait",
                        "--timeout",
                        "200",
                        "--catalog",
                        catalog,
                        "--json",
                    ],
                    cwd=REPO_ROOT,
                    env=kscope_env(),
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                )  # fmt: skip
                for job_id in sorted(ids)
            ]
            docs = {}
            for job_id, run in zip(sorted(ids), runs):
                out, err = run.communicate(timeout=300)
                docs[job_id] = trace_json(subprocess.CompletedProcess(run.args, run.returncode, out, err))
        finally:
            for j in jobs:
                j.stop()
    for job_id, doc in docs.items():
        (m,) = [m for m in doc["matched"] if m["triggered"]]  # its own rank, nobody else's
        assert m["job_id"] == job_id and m["job_source"] == "torchrun"
        assert len(doc["files"]) == 1 and doc["files"][0]["complete"], doc["files"]
    listed = run_kscope("jobs", "--catalog", catalog, "--json")
    assert listed.returncode == 0, listed.stderr
    catalog_jobs = {j["job_id"]: j for j in json.loads(listed.stdout)["jobs"]}
    assert set(catalog_jobs) == ids
    assert all(j["traces"] == 1 and j.get("job_source") == "torchrun" for j in catalog_jobs.values()), (
        catalog_jobs
    )
