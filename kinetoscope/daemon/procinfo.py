"""What /proc says about a registered process: command line, rank variables, identity.

Why: ``dyno`` only knows pids; to name trace files by rank and to tell launchers from ranks,
the daemon reads ``/proc/<pid>/{stat,cmdline,environ}`` **once** when a process first polls
(the registry caches the result; polls arrive every 5 s from every rank, so nothing here runs
per poll). ``environ`` is only readable for processes of the same user (or by root); fields
are ``None`` when unknown, never guessed.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

PROC = "/proc"

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
_WANTED = {k.encode() for k in (*_INT_VARS, *_STR_VARS)}
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
    out: dict[str, int | str | None] = {}
    for entry in data.split(b"\0"):
        key, sep, value = entry.partition(b"=")
        if not sep or key not in _WANTED:
            continue
        name = key.decode()
        text = value.decode("utf-8", "replace")
        if name in _INT_VARS:
            try:
                out[_INT_VARS[name]] = int(text)
            except ValueError:
                out[_INT_VARS[name]] = None
        else:
            out[_STR_VARS[name]] = text
    return out


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
    fields = parse_environ(env) if env is not None else {}
    return ProcInfo(
        pid=pid,
        ppid=ppid,
        start_time=start_time,
        uid=uid,
        pid_ns=pid_ns,
        cmdline=cmdline,
        environ_readable=env is not None,
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
