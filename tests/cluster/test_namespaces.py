"""A real 2-rank gloo job in its own PID, mount and network namespaces, the daemon outside.

The job runs under ``unshare --pid --fork --mount-proc --net`` (loopback brought up inside): its
ranks have small container pids, a /proc of their own, and no network but their own loopback,
so the only way to the daemon is the filesystem IPC socket directory (``KINETO_IPC_SOCKET_DIR``,
visible inside because the mount namespace starts as a copy of ours). The daemon must map the
container pids to host pids, read the ranks from the right /proc entries, and the trace files
must land where both sides see them. Then ``kscope analyze`` gives its verdict on them.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import msgspec
import pytest
from cluster_helpers import REPO_ROOT, run_kscope, trace_json, wait_for

from kinetoscope.demo.local import LocalDaemon, ManagedProcess, child_env

pytest.importorskip("torch")
pytestmark = [pytest.mark.torch, pytest.mark.slow]


def _unshare_works() -> bool:
    if not shutil.which("unshare") or not shutil.which("ip"):
        return False
    probe = subprocess.run(
        ["unshare", "--pid", "--fork", "--mount-proc", "--net", "sh", "-c", "ip link set lo up && echo ok"],
        capture_output=True,
        text=True,
        check=False,
    )
    return probe.returncode == 0 and probe.stdout.strip() == "ok"


def container_job(workdir: Path, daemon: LocalDaemon, name: str = "job") -> ManagedProcess:
    """torchrun with 2 ranks inside new PID, mount and network namespaces."""
    torchrun = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
        "-m", "kinetoscope.demo.train_ddp", "--steps", "0", "--max-seconds", "240",
        "--straggler", "persistent", "--straggler-rank", "1", "--straggler-ms", "20,20",
    ]  # fmt: skip
    argv = [
        "unshare", "--pid", "--fork", "--mount-proc", "--net",
        "sh", "-c", 'ip link set lo up && exec "$@"', "sh", *torchrun,
    ]  # fmt: skip
    env = child_env({**daemon.kineto_env(), "OMP_NUM_THREADS": "1"})
    for key in [k for k in env if k.startswith("SLURM_")]:
        del env[key]
    return ManagedProcess(name, argv, workdir / f"{name}.log", env, cwd=str(REPO_ROOT)).start()


def wait_for_ranks(daemon: LocalDaemon, job: ManagedProcess, n: int) -> list[dict[str, Any]]:
    """The registered ranks (processes with a rank; the agent registers too) once all ``n`` are."""

    def ranks() -> list[dict[str, Any]] | None:
        assert job.poll() is None, f"the job stopped:\n{job.tail()}"
        procs = [
            msgspec.to_builtins(p)
            for p in daemon.list_processes()
            if p.rank is not None and not p.is_launcher
        ]
        return procs if len(procs) >= n else None

    return wait_for(ranks, 180, f"{n} ranks to register")


def test_container_job_is_traced_by_job_id_with_right_ranks_and_both_pids(tmp_path: Path) -> None:
    if os.geteuid() != 0 or not _unshare_works():
        pytest.skip("needs root and a working `unshare --pid --fork --mount-proc --net`")
    with LocalDaemon(tmp_path / "d") as daemon:
        job = container_job(tmp_path, daemon)
        try:
            ranks = wait_for_ranks(daemon, job, 2)
            by_rank = {p["rank"]: p for p in ranks}
            assert sorted(by_rank) == [0, 1], ranks
            for p in ranks:
                # the container's pid, the host's pid, and the two differ
                assert p["container_pid"] == p["pid"] and p["host_pid"] != p["pid"], p
                hostenv = Path(f"/proc/{p['host_pid']}/environ").read_bytes().split(b"\0")
                assert f"RANK={p['rank']}".encode() in hostenv  # the rank of *that* process
            job_ids = {p["job_id"] for p in ranks}
            assert len(job_ids) == 1 and next(iter(job_ids)).startswith("torchrun:"), job_ids
            job_id = job_ids.pop()
            assert {p["kineto_job_id"] for p in ranks} == {"0"}

            for _attempt in range(3):
                result = run_kscope(
                    "trace", "--host", str(daemon.address), "--job-id", job_id, "--iterations", "3",
                    "--wait", "--timeout", "150", "--no-catalog", "--json",
                )  # fmt: skip
                # exit 3: both files written, but the windows do not overlap (a rank descheduled
                # on a loaded host): not what this test is about, so trace the job again
                if result.returncode != 3:
                    break
            doc = trace_json(result)
            files = doc["files"]
            assert sorted(f["rank"] for f in files) == [0, 1], doc
            assert all(f["complete"] for f in files), files
            trace_dir = Path(doc["output_dir"])
            manifest = json.loads((trace_dir / "manifest.json").read_text())
            entries = {e["rank"]: e for e in manifest["files"]}
            for rank, p in by_rank.items():
                e = entries[rank]
                assert (e["pid"], e["host_pid"], e["container_pid"]) == (p["pid"], p["host_pid"], p["pid"])
                assert e["job_id"] == job_id and e["job_source"] == "torchrun"
                # the file was written by the process that has this rank (its events carry the
                # pid it knows, the container's; its environment above has RANK=<rank>)
                assert f"_{p['pid']}." in e["file"]
                trace = json.loads((trace_dir / e["file"]).read_text())
                pids = {ev.get("pid") for ev in trace["traceEvents"] if isinstance(ev.get("pid"), int)}
                assert pids == {p["pid"]}, pids
            # the same job by host pid: a rank's host pid selects it
            by_pid = run_kscope(
                "trace", "--host", str(daemon.address), "--pids", str(by_rank[0]["host_pid"]),
                "--duration-ms", "300", "--no-catalog", "--json",
            )  # fmt: skip
            pid_doc = trace_json(by_pid)
            assert [m["rank"] for m in pid_doc["matched"] if m["triggered"]] == [0], pid_doc["matched"]
        finally:
            job.stop()
    analysis = run_kscope("analyze", str(trace_dir), timeout=300)
    assert analysis.returncode == 0, analysis.stderr
    assert "rank 1" in analysis.stdout.lower(), analysis.stdout[:2000]
