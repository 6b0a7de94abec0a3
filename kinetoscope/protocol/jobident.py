"""Job identity: which job a traced process belongs to, whatever started it (docs/deploy.md §5).

Why: libkineto reports ``SLURM_JOB_ID`` (or ``0``) as its job id, so outside Slurm every job
used to be "job 0": four unrelated ``torchrun`` jobs on one workstation became one catalog job.
The daemon derives a **job identity** instead, once per process, from what the process carries:
its environment, its ``/proc/<pid>/cgroup`` and its launcher. One precedence, the first that
applies wins:

1. **Slurm**: ``SLURM_JOB_ID``'s leading number, exactly the job id libkineto registers
   (``4242``; an array task ``36199_0`` is ``36199``), so ``--job-id $SLURM_JOB_ID`` and old
   catalogs keep working. A non-zero job id reported by libkineto counts as Slurm too.
2. **Kubernetes**, when the pod's owner is known: a Kubeflow PyTorchJob (``MASTER_ADDR`` of
   the form ``<name>-master-0``, or ``PET_MASTER_ADDR``), a JobSet (``JOBSET_NAME``) or an
   explicit ``KSCOPE_JOB_NAME``: ``k8s:<namespace>:<owner>``. Pod name, namespace and pod UID
   are recorded in any case (``POD_NAME``/``HOSTNAME``, ``POD_NAMESPACE``, the cgroup path).
3. **Ray**: ``RAY_JOB_SUBMISSION_ID`` or ``RAY_JOB_ID``: ``ray:<id>``.
4. **torchrun**: ``TORCHELASTIC_RUN_ID`` unless it is torchrun's default ``none``:
   ``torchrun:<run id>``; with ``none``, the rendezvous endpoint and the launcher:
   ``torchrun:<addr>:<port>:<launcher hash>`` (a port reused by a later job is another job).
5. **MPI**: ``PMIX_NAMESPACE`` or ``OMPI_MCA_ess_base_jobid``: ``mpi:<id>``.
6. **Kubernetes pod** without a known owner: ``k8s:<namespace>:<pod>``.
7. **Launcher**: a hash of the host's boot id, the launcher's pid and its start time
   (the parent when the process was started by a launcher, i.e. has ``RANK``/``LOCAL_RANK``;
   else the process itself): ``launcher:<16 hex>``. Never ``0``.

An identity is at most 200 characters of ``[A-Za-z0-9._:-]`` (values are sanitised), so it is
usable in a URL path segment, a file name and a Prometheus label as is.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping

import msgspec

from kinetoscope.protocol.structinfo import prime_structs

MAX_IDENTITY = 200
IDENTITY_RE = re.compile(r"[A-Za-z0-9._:-]{1,200}")
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")

# Sources, in precedence order (the ``job_source`` field of listings and manifests).
SLURM = "slurm"
KUBERNETES = "kubernetes"
RAY = "ray"
TORCHRUN = "torchrun"
MPI = "mpi"
POD = "kubernetes-pod"
LAUNCHER = "launcher"
KINETO = "kineto"  # the process is not visible in /proc: Kineto's own job id, or its pid
SOURCES = (SLURM, KUBERNETES, RAY, TORCHRUN, MPI, POD, LAUNCHER, KINETO)

# Every environment variable the identity (and the pod labels) may read.
ENV_VARS = frozenset(
    {
        "SLURM_JOB_ID",
        "KUBERNETES_SERVICE_HOST",
        "POD_NAME",
        "POD_NAMESPACE",
        "HOSTNAME",
        "KSCOPE_JOB_NAME",
        "JOBSET_NAME",
        "MASTER_ADDR",
        "MASTER_PORT",
        "PET_MASTER_ADDR",
        "RAY_JOB_SUBMISSION_ID",
        "RAY_JOB_ID",
        "TORCHELASTIC_RUN_ID",
        "PMIX_NAMESPACE",
        "OMPI_MCA_ess_base_jobid",
        "RANK",
        "LOCAL_RANK",
        "OMPI_COMM_WORLD_RANK",
        "PMI_RANK",
        "PMIX_RANK",
    }
)
# kubelet cgroup paths: ".../kubepods-burstable-pod<uid with _>.slice/..." (systemd driver) or
# ".../kubepods/burstable/pod<uid>/<container>" (cgroupfs driver).
_POD_UID_RE = re.compile(
    r"kubepods[^\n]*?[/-]pod([0-9a-fA-F]{8}[-_][0-9a-fA-F]{4}[-_][0-9a-fA-F]{4}[-_][0-9a-fA-F]{4}[-_][0-9a-fA-F]{12})"
)
_PYTORCHJOB_MASTER = re.compile(r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?)-master-0(\..*)?$")


class Launcher(msgspec.Struct, frozen=True, kw_only=True):
    """The process that started the job on this host, as the daemon's /proc sees it."""

    host_pid: int
    start_time: int | None  # clock ticks since boot (stat field 22)
    boot_id: str = ""  # /proc/sys/kernel/random/boot_id: pids and start times repeat across boots


class JobIdentity(msgspec.Struct, frozen=True, kw_only=True):
    """Which job a process belongs to: ``id`` (the catalog's job id) and where it came from."""

    id: str
    source: str  # one of SOURCES
    pod: str | None = None
    namespace: str | None = None
    pod_uid: str | None = None
    owner: str | None = None  # e.g. "PyTorchJob/bert", "JobSet/llm"


def sanitise(value: str, limit: int = 96) -> str:
    """``value`` with every character outside ``[A-Za-z0-9._-]`` replaced by ``_``, cut to ``limit``."""
    return _UNSAFE.sub("_", value.strip())[:limit] or "_"


def valid_identity(text: object) -> bool:
    """Whether ``text`` is a well-formed job identity (or a decimal Kineto/Slurm job id)."""
    return isinstance(text, str) and IDENTITY_RE.fullmatch(text) is not None


def pod_uid_from_cgroup(cgroup: str | None) -> str | None:
    """The Kubernetes pod UID named in the text of ``/proc/<pid>/cgroup``, or None."""
    if not cgroup:
        return None
    m = _POD_UID_RE.search(cgroup)
    return m.group(1).replace("_", "-").lower() if m else None


def _kubernetes(env: Mapping[str, str], cgroup: str | None) -> JobIdentity | None:
    """Pod, namespace, UID and owner when the process runs in a Kubernetes pod (else None)."""
    uid = pod_uid_from_cgroup(cgroup)
    if uid is None and not env.get("KUBERNETES_SERVICE_HOST"):
        return None
    pod = env.get("POD_NAME") or env.get("HOSTNAME") or None
    namespace = env.get("POD_NAMESPACE") or None
    owner = None
    if env.get("KSCOPE_JOB_NAME"):
        owner = f"Job/{env['KSCOPE_JOB_NAME']}"
    elif env.get("JOBSET_NAME"):
        owner = f"JobSet/{env['JOBSET_NAME']}"
    else:
        for var in ("PET_MASTER_ADDR", "MASTER_ADDR"):
            m = _PYTORCHJOB_MASTER.match(env.get(var) or "")
            if m:
                owner = f"PyTorchJob/{m.group(1)}"
                break
    ns = sanitise(namespace or "default", 63)
    if owner is not None:
        ident = f"k8s:{ns}:{sanitise(owner.split('/', 1)[1])}"
        return JobIdentity(
            id=ident, source=KUBERNETES, pod=pod, namespace=namespace, pod_uid=uid, owner=owner
        )
    name = pod or uid or "pod"
    return JobIdentity(id=f"k8s:{ns}:{sanitise(name)}", source=POD, pod=pod, namespace=namespace, pod_uid=uid)


def slurm_job(value: str | None) -> str | None:
    """The job id libkineto registers for ``SLURM_JOB_ID``: its leading number (``strtoll``),
    so ``36199_0`` is ``36199`` as before; a value without one is kept whole (sanitised)."""
    text = (value or "").strip()
    if not text:
        return None
    m = re.match(r"\d+", text)
    return str(int(m.group(0))) if m else sanitise(text, MAX_IDENTITY)


def launcher_hash(launcher: Launcher | None, fallback_pid: int) -> str:
    """16 hex digits naming the launcher process on this boot of this host."""
    if launcher is None:
        seed = f"pid:{fallback_pid}"
    else:
        seed = f"{launcher.boot_id}:{launcher.host_pid}:{launcher.start_time}"
    return hashlib.blake2b(seed.encode(), digest_size=8).hexdigest()


def identify(
    env: Mapping[str, str], cgroup: str | None, launcher: Launcher | None, *, pid: int
) -> JobIdentity:
    """The job identity of a process (module docstring); ``pid`` is its host pid."""
    k8s = _kubernetes(env, cgroup)
    pod_fields = {}
    if k8s is not None:
        pod_fields = {"pod": k8s.pod, "namespace": k8s.namespace, "pod_uid": k8s.pod_uid}
    slurm = slurm_job(env.get("SLURM_JOB_ID"))
    if slurm:
        return JobIdentity(id=slurm, source=SLURM, **pod_fields)
    if k8s is not None and k8s.source == KUBERNETES:
        return k8s
    for var in ("RAY_JOB_SUBMISSION_ID", "RAY_JOB_ID"):
        if env.get(var):
            return JobIdentity(id=f"ray:{sanitise(env[var])}", source=RAY, **pod_fields)
    run_id = (env.get("TORCHELASTIC_RUN_ID") or "").strip()
    if run_id and run_id != "none":
        return JobIdentity(id=f"torchrun:{sanitise(run_id)}", source=TORCHRUN, **pod_fields)
    if run_id == "none" and env.get("MASTER_ADDR") and env.get("MASTER_PORT"):
        ident = (
            f"torchrun:{sanitise(env['MASTER_ADDR'], 64)}:{sanitise(env['MASTER_PORT'], 8)}:"
            f"{launcher_hash(launcher, pid)[:8]}"
        )
        return JobIdentity(id=ident, source=TORCHRUN, **pod_fields)
    for var in ("PMIX_NAMESPACE", "OMPI_MCA_ess_base_jobid"):
        if env.get(var):
            return JobIdentity(id=f"mpi:{sanitise(env[var])}", source=MPI, **pod_fields)
    if k8s is not None:
        return k8s
    return JobIdentity(id=f"launcher:{launcher_hash(launcher, pid)}", source=LAUNCHER)


def started_by_launcher(env: Mapping[str, str]) -> bool:
    """Whether a launcher set the process's rank (then its parent is the job's launcher)."""
    return any(env.get(v) for v in ("RANK", "LOCAL_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK"))


def fallback_identity(kineto_job_id: str, pid: int) -> JobIdentity:
    """For a process the daemon cannot see in /proc: Kineto's job id if set, else its pid."""
    if kineto_job_id not in ("", "0"):
        return JobIdentity(id=sanitise(kineto_job_id, MAX_IDENTITY), source=KINETO)
    return JobIdentity(id=f"pid:{pid}", source=KINETO)


prime_structs(globals())
