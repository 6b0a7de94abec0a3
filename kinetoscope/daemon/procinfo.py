"""What /proc says about a registered process: command line, rank variables, identity.

Why: ``dyno`` only knows pids; to name trace files by rank and to tell launchers from ranks,
the daemon reads ``/proc/<pid>/{stat,cmdline,environ}`` **once** when a process first polls
(the registry caches the result; polls arrive every 5 s from every rank, so nothing here runs
per poll). ``environ`` is only readable for processes of the same user (or by root); fields
are ``None`` when unknown, never guessed.

The same single read gives the process's place in a container (``NSpid`` in ``status``: the
host pid first, the container's own last), its mount namespace, its host ancestors, and its
job identity (kinetoscope.protocol.jobident: environment, ``cgroup`` and launcher).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from kinetoscope.protocol import jobident
from kinetoscope.protocol.jobident import JobIdentity, Launcher

PROC = "/proc"
MAX_CGROUP = 65536  # bytes of /proc/<pid>/cgroup read (a few lines on a real host)

# Environment variables worth knowing about a training process (torchrun / Slurm / MPI-free).
_INT_VARS = {
    "RANK": "rank",
    "LOCAL_RANK": "local_rank",
    "WORLD_SIZE": "world_size",
    "GROUP_RANK": "group_rank",
    "MASTER_PORT": "master_port",
}
_STR_VARS = {
    "TORCHELASTIC_RUN_ID": "torchelastic_run_id",
    "MASTER_ADDR": "master_addr",
    "SLURM_JOB_ID": "slurm_job_id",
    "KSCOPE_AUTOPILOT": "autopilot",  # "off" opts the job out of kscope autopilot
}
_WANTED = {k.encode() for k in (*_INT_VARS, *_STR_VARS, *jobident.ENV_VARS)}
_MPI_RANKS = ("OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK")  # rank when RANK is unset
MAX_CMDLINE = 4096


@dataclass(frozen=True)
class ProcInfo:
    """A snapshot of one process as the daemon's pid namespace sees it."""

    pid: int
    ppid: int | None = None
    start_time: int | None = None  # clock ticks since boot (stat field 22): pid + this = identity
    uid: int | None = None
    pid_ns: str | None = None  # e.g. "pid:[4026531836]"; pids compare only within one namespace
    cmdline: str | None = None
    environ_readable: bool = False
    rank: int | None = None
    local_rank: int | None = None
    world_size: int | None = None
    group_rank: int | None = None
    master_port: int | None = None
    torchelastic_run_id: str | None = None
    master_addr: str | None = None
    slurm_job_id: str | None = None
    autopilot: str | None = None
    # Namespaces and job identity (docs/deploy.md): the pids of this process from the daemon's
    # pid namespace inwards (``NSpid``: host pid first, the container's own pid last).
    nspids: tuple[int, ...] = ()
    host_ancestors: tuple[int, ...] = ()  # ppid, its ppid, ... in the daemon's pid namespace
    mnt_ns: str | None = None
    job: JobIdentity | None = None

    @property
    def container_pid(self) -> int | None:
        """The pid the process has in its own (innermost) pid namespace, when known."""
        return self.nspids[-1] if self.nspids else None

    @property
    def in_other_pid_ns(self) -> bool:
        """Whether the process lives in a pid namespace nested below the daemon's."""
        return len(self.nspids) > 1


def _read(path: str) -> bytes | None:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:
        return None


def parse_stat(data: bytes) -> tuple[str, int, int]:
    """(state, ppid, starttime) from the text of /proc/<pid>/stat.

    The command name is in parentheses and may itself contain spaces or ``)``, so split at
    the **last** ``)``; after it come state (field 3), ppid (4) ... starttime (22).
    """
    rest = data[data.rindex(b")") + 2 :].split()
    return rest[0].decode(), int(rest[1]), int(rest[19])


def stat_of(pid: int, proc: str = PROC) -> tuple[str, int, int] | None:
    """(state, ppid, starttime) or None when the process does not exist (or /proc is unreadable)."""
    data = _read(f"{proc}/{pid}/stat")
    if not data:
        return None
    try:
        return parse_stat(data)
    except (ValueError, IndexError):
        return None


def parse_environ(data: bytes) -> dict[str, int | str | None]:
    """The rank-related fields from the NUL-separated text of /proc/<pid>/environ."""
    return _fields(environ_vars(data))


def environ_vars(data: bytes) -> dict[str, str]:
    """The variables this module wants (rank and job identity) from /proc/<pid>/environ."""
    out: dict[str, str] = {}
    for entry in data.split(b"\0"):
        key, sep, value = entry.partition(b"=")
        if sep and key in _WANTED:
            out[key.decode()] = value.decode("utf-8", "replace")
    return out


def _fields(env: dict[str, str]) -> dict[str, int | str | None]:
    out: dict[str, int | str | None] = {}
    for name, text in env.items():
        if name in _INT_VARS:
            try:
                out[_INT_VARS[name]] = int(text)
            except ValueError:
                out[_INT_VARS[name]] = None
        elif name in _STR_VARS:
            out[_STR_VARS[name]] = text
    if out.get("rank") is None:
        for name in _MPI_RANKS:
            if env.get(name, "").isdigit():
                out["rank"] = int(env[name])
                break
    return out


def parse_nspid(status: bytes) -> tuple[int, ...]:
    """The ``NSpid:`` line of /proc/<pid>/status: the pid in each namespace, outermost first."""
    for line in status.splitlines():
        if line.startswith(b"NSpid:"):
            try:
                return tuple(int(x) for x in line[6:].split())
            except ValueError:
                return ()
    return ()


_boot_id: str | None = None


def boot_id(proc: str = PROC) -> str:
    """This boot's id (pid + start time repeat across reboots); read once."""
    global _boot_id
    if _boot_id is None:
        raw = _read(f"{proc}/sys/kernel/random/boot_id")
        _boot_id = raw.decode("ascii", "replace").strip() if raw else ""
    return _boot_id


def _launcher(pid: int, ppid: int, start_time: int, env: dict[str, str], proc: str) -> Launcher:
    """The process that started the job here: the parent of a rank a launcher started, else itself."""
    if jobident.started_by_launcher(env) and ppid > 1:
        st = stat_of(ppid, proc)
        if st is not None:
            return Launcher(host_pid=ppid, start_time=st[2], boot_id=boot_id(proc))
    return Launcher(host_pid=pid, start_time=start_time, boot_id=boot_id(proc))


def read_identity(pid: int, ppid: int, start_time: int, env: dict[str, str], proc: str = PROC) -> JobIdentity:
    """The job identity of ``pid`` (kinetoscope.protocol.jobident) from its environment,
    its cgroup and its launcher."""
    raw = _read_limited(f"{proc}/{pid}/cgroup", MAX_CGROUP)
    cgroup = raw.decode("utf-8", "replace") if raw is not None else None
    return jobident.identify(env, cgroup, _launcher(pid, ppid, start_time, env, proc), pid=pid)


MAX_ANCESTORS = 16


def _ancestors(ppid: int, proc: str) -> tuple[int, ...]:
    """``ppid`` and its ancestors up to init (at most MAX_ANCESTORS), host pids."""
    out: list[int] = []
    pid = ppid
    while pid > 1 and len(out) < MAX_ANCESTORS and pid not in out:
        out.append(pid)
        st = stat_of(pid, proc)
        if st is None:
            break
        pid = st[1]
    return tuple(out)


def _read_limited(path: str, limit: int) -> bytes | None:
    try:
        with open(path, "rb") as f:
            return f.read(limit)
    except OSError:
        return None


def read_proc_info(pid: int, proc: str = PROC) -> ProcInfo | None:
    """Everything the daemon wants to know about ``pid``; None if it is gone or not visible."""
    if pid <= 0:
        return None
    st = stat_of(pid, proc)
    if st is None:
        return None
    _state, ppid, start_time = st
    try:
        uid: int | None = os.stat(f"{proc}/{pid}").st_uid
    except OSError:
        uid = None
    try:
        pid_ns: str | None = os.readlink(f"{proc}/{pid}/ns/pid")
    except OSError:
        pid_ns = None
    raw_cmd = _read(f"{proc}/{pid}/cmdline")
    cmdline = None
    if raw_cmd is not None:
        cmdline = " ".join(a.decode("utf-8", "replace") for a in raw_cmd.rstrip(b"\0").split(b"\0"))
        cmdline = cmdline[:MAX_CMDLINE]
    env = _read(f"{proc}/{pid}/environ")
    env_vars = environ_vars(env) if env is not None else {}
    fields = _fields(env_vars)
    status = _read(f"{proc}/{pid}/status")
    try:
        mnt_ns: str | None = os.readlink(f"{proc}/{pid}/ns/mnt")
    except OSError:
        mnt_ns = None
    return ProcInfo(
        pid=pid,
        ppid=ppid,
        start_time=start_time,
        uid=uid,
        pid_ns=pid_ns,
        cmdline=cmdline,
        environ_readable=env is not None,
        nspids=parse_nspid(status) if status else (),
        host_ancestors=_ancestors(ppid, proc),
        mnt_ns=mnt_ns,
        job=read_identity(pid, ppid, start_time, env_vars, proc),
        **fields,  # type: ignore[arg-type]
    )


def is_alive(pid: int, start_time: int | None, proc: str = PROC) -> bool:
    """True if ``pid`` runs and, when known, is still the same process (not a reused pid).

    A zombie (state Z/X) has exited: its trace, if any, is already written or never will be.
    """
    st = stat_of(pid, proc)
    if st is None or st[0] in ("Z", "X"):
        return False
    return start_time is None or st[2] == start_time
