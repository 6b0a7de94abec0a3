"""The job identity precedence (kinetoscope.protocol.jobident), one launcher at a time, and the
/proc side (procinfo) on real processes: cgroup, NSpid, launcher."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from kinetoscope.daemon import procinfo
from kinetoscope.protocol import jobident as ji

L = ji.Launcher(host_pid=4100, start_time=123456, boot_id="b")
SYSTEMD_CGROUP = (
    "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod"
    "1b2c3d4e_5f60_7182_93a4_b5c6d7e8f901.slice/cri-containerd-abc.scope\n"
)
CGROUPFS_CGROUP = "12:memory:/kubepods/besteffort/pod1b2c3d4e-5f60-7182-93a4-b5c6d7e8f901/0123abcd\n"
K8S = {"KUBERNETES_SERVICE_HOST": "10.0.0.1", "HOSTNAME": "bert-worker-3", "POD_NAMESPACE": "ml"}


def ident(env: dict[str, str], cgroup: str | None = None, launcher: ji.Launcher | None = L) -> ji.JobIdentity:
    return ji.identify(env, cgroup, launcher, pid=4242)


@pytest.mark.parametrize("cgroup", [SYSTEMD_CGROUP, CGROUPFS_CGROUP])
def test_pod_uid_from_both_cgroup_drivers(cgroup: str) -> None:
    assert ji.pod_uid_from_cgroup(cgroup) == "1b2c3d4e-5f60-7182-93a4-b5c6d7e8f901"
    assert ji.pod_uid_from_cgroup("0::/user.slice/user-0.slice/session-1.scope\n") is None


def test_precedence_slurm_first_then_kubernetes_owner() -> None:
    everything = {
        **K8S, "SLURM_JOB_ID": "36199_4", "MASTER_ADDR": "bert-master-0", "RAY_JOB_ID": "02000000",
        "TORCHELASTIC_RUN_ID": "abc", "PMIX_NAMESPACE": "prterun-x-1",
    }  # fmt: skip
    first = ident(everything, SYSTEMD_CGROUP)
    assert (first.id, first.source, first.namespace, first.pod) == ("36199", "slurm", "ml", "bert-worker-3")
    del everything["SLURM_JOB_ID"]
    pytorchjob = ident(everything, SYSTEMD_CGROUP)
    assert (pytorchjob.id, pytorchjob.owner) == ("k8s:ml:bert", "PyTorchJob/bert")
    assert pytorchjob.pod_uid == "1b2c3d4e-5f60-7182-93a4-b5c6d7e8f901"
    del everything["MASTER_ADDR"]
    assert ident(everything).id == "ray:02000000"  # a pod without a known owner falls through
    del everything["RAY_JOB_ID"]
    assert ident(everything).id == "torchrun:abc"
    del everything["TORCHELASTIC_RUN_ID"]
    assert ident(everything).id == "mpi:prterun-x-1"
    del everything["PMIX_NAMESPACE"]
    pod = ident(everything)
    assert (pod.id, pod.source) == ("k8s:ml:bert-worker-3", "kubernetes-pod")


def test_jobset_and_explicit_owner() -> None:
    assert ident({**K8S, "JOBSET_NAME": "llm"}).id == "k8s:ml:llm"
    assert ident({**K8S, "JOBSET_NAME": "llm", "KSCOPE_JOB_NAME": "mine"}).owner == "Job/mine"
    # Kubeflow Trainer's PET_MASTER_ADDR names the owner too; no namespace -> "default"
    env = {"KUBERNETES_SERVICE_HOST": "x", "PET_MASTER_ADDR": "gpt-master-0.gpt.ml.svc"}
    assert ident(env).id == "k8s:default:gpt"


def test_torchrun_default_run_id_uses_endpoint_and_launcher() -> None:
    env = {"TORCHELASTIC_RUN_ID": "none", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500", "RANK": "0"}
    a = ident(env)
    b = ident(env, launcher=ji.Launcher(host_pid=5100, start_time=999, boot_id="b"))
    assert a.source == b.source == "torchrun" and a.id.startswith("torchrun:127.0.0.1:29500:")
    assert a.id != b.id  # the same port reused by a later torchrun is another job


def test_no_launcher_variables_is_never_zero() -> None:
    a = ident({})
    assert a.source == "launcher" and a.id.startswith("launcher:") and len(a.id) == len("launcher:") + 16
    assert ident({}).id == a.id  # stable
    assert ident({}, launcher=ji.Launcher(host_pid=4100, start_time=123457, boot_id="b")).id != a.id
    assert ji.fallback_identity("0", 77).id == "pid:77" and ji.fallback_identity("4242", 77).id == "4242"


def test_identities_are_safe_everywhere() -> None:
    weird = ident({"TORCHELASTIC_RUN_ID": "a/b c\n$(x)"})
    assert weird.id == "torchrun:a_b_c___x_" and ji.valid_identity(weird.id)
    assert not ji.valid_identity("a/b") and not ji.valid_identity("") and not ji.valid_identity(7)


def test_procinfo_reads_a_real_child_launched_like_a_rank() -> None:
    """A real process with RANK set: the launcher is its parent (this test process)."""
    env = {**os.environ, "RANK": "1", "TORCHELASTIC_RUN_ID": "none", "MASTER_ADDR": "h", "MASTER_PORT": "1"}
    env.pop("SLURM_JOB_ID", None)
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], env=env)
    try:
        info = None
        for _ in range(100):
            info = procinfo.read_proc_info(child.pid)
            if info is not None and info.rank == 1:
                break
        assert info is not None and info.job is not None and info.rank == 1
        assert info.nspids[0] == child.pid and not info.in_other_pid_ns
        assert info.host_ancestors[0] == os.getpid()
        me = procinfo.stat_of(os.getpid())
        assert me is not None
        expected = ji.Launcher(host_pid=os.getpid(), start_time=me[2], boot_id=procinfo.boot_id())
        assert info.job.id == "torchrun:h:1:" + ji.launcher_hash(expected, child.pid)[:8]
    finally:
        child.kill()
        child.wait()
