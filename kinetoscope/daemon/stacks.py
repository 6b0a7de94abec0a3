"""Python stack snapshots of registered processes, for ``kscopeStacks`` (docs/stacks.md).

Why py-spy: it reads another process's interpreter state from outside (``ptrace`` +
``process_vm_readv``), with no change to the job and no code run inside it, so it answers even
when every Python thread is blocked in C++ (a collective that never completes) - the case a
stack dump from inside (``faulthandler``, a signal handler) cannot serve. It is a pinned
dependency that ships its binary in the wheel; the daemon looks for it next to its own Python
first (a virtualenv's ``bin/``), then on ``PATH``, and ``KSCOPE_PY_SPY`` names it explicitly.

Bounds: one py-spy per process, ``timeout_s`` each (killed after), its JSON read up to
``MAX_OUTPUT_BYTES``; at most ``MAX_THREADS`` threads per process and ``MAX_FRAMES`` frames per
thread (the innermost and the outermost kept, the middle dropped and counted), strings cut at
``MAX_TEXT`` characters, and locals only when short. So one answer stays small whatever the job.

Terms: a **snapshot** is one py-spy dump of every thread of one process; the target is stopped
(``ptrace``) while py-spy copies its thread states, which is the **pause** docs/stacks.md
measures. ``active``/``owns_gil`` per thread are py-spy's own judgement.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import orjson

from kinetoscope.daemon.registry import Process
from kinetoscope.protocol import rpc

PY_SPY_ENV = "KSCOPE_PY_SPY"
DEFAULT_TIMEOUT_S = 10.0
MAX_TIMEOUT_S = 60.0
MAX_OUTPUT_BYTES = 16 << 20
MAX_STDERR_BYTES = 64 << 10
MAX_THREADS = 64
MAX_FRAMES = 64
KEEP_OUTER = 24  # of a deeper stack: the outermost frames kept (the script), the rest innermost
MAX_TEXT = 300
MAX_LOCALS = 24
MAX_LOCAL_REPR = 120
CAP_SYS_PTRACE = 19  # bit in /proc/<pid>/status CapEff

# error_kind values (ProcessStacks.error_kind)
PERMISSION = "permission"
TIMEOUT = "timeout"
GONE = "gone"
NOT_VISIBLE = "not_visible"
NO_PY_SPY = "no_py_spy"
FAILED = "failed"


def find_py_spy() -> str | None:
    """The py-spy binary: ``$KSCOPE_PY_SPY``, else next to this Python, else on ``PATH``."""
    named = os.environ.get(PY_SPY_ENV)
    if named:
        return named if os.access(named, os.X_OK) else None
    beside = os.path.join(os.path.dirname(sys.executable), "py-spy")
    if os.access(beside, os.X_OK):
        return beside
    return shutil.which("py-spy")


@functools.lru_cache(maxsize=4)
def py_spy_version(path: str) -> str | None:
    """``py-spy --version``'s number (``0.4.3``), or None when it does not run."""
    try:
        out = subprocess.run([path, "--version"], capture_output=True, timeout=10, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    text = out.stdout.decode("utf-8", "replace").strip()
    return text.split()[-1] if out.returncode == 0 and text else None


@dataclass
class Snapshot:
    """What :func:`snapshot` found for one process."""

    threads: list[rpc.ThreadStack]
    threads_dropped: int = 0
    error: str | None = None
    error_kind: str | None = None
    pause_ms: float | None = None
    cpu_s: float | None = None
    taken_at: float | None = None


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of ``pid`` (all its threads) from ``/proc/<pid>/stat``."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            text = f.read().decode("ascii", "replace")
    except OSError:
        return None
    fields = text.rsplit(")", 1)[-1].split()
    try:
        ticks = int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15 of stat)
    except (IndexError, ValueError):
        return None
    return round(ticks / os.sysconf("SC_CLK_TCK"), 3)


def _cut(text: Any) -> str:
    s = "" if text is None else str(text)
    return s if len(s) <= MAX_TEXT else s[: MAX_TEXT - 1] + "…"


def _locals(raw: Any) -> dict[str, str] | None:
    if not isinstance(raw, list):
        return None
    out: dict[str, str] = {}
    for item in raw[:MAX_LOCALS]:
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            continue
        value = item.get("repr")
        if isinstance(value, str) and len(value) <= MAX_LOCAL_REPR:
            out[_cut(item["name"])] = value
    return out


def _frame(raw: dict[str, Any]) -> rpc.StackFrame:
    file = _cut(raw.get("filename"))
    line = raw.get("line")
    return rpc.StackFrame(
        name=_cut(raw.get("name")),
        file=file,
        short_file=_cut(raw.get("short_filename") or os.path.basename(file)),
        line=line if isinstance(line, int) and not isinstance(line, bool) else 0,
        native=raw.get("module") is not None and not file.endswith(".py"),
        locals=_locals(raw.get("locals")),
    )


def _thread(raw: dict[str, Any]) -> rpc.ThreadStack:
    frames = [f for f in raw.get("frames") or [] if isinstance(f, dict)]
    dropped = 0
    if len(frames) > MAX_FRAMES:
        dropped = len(frames) - MAX_FRAMES
        frames = frames[: MAX_FRAMES - KEEP_OUTER] + frames[-KEEP_OUTER:]
    os_tid = raw.get("os_thread_id")
    tid = raw.get("thread_id")
    return rpc.ThreadStack(
        thread_id=tid if isinstance(tid, int) else 0,
        os_thread_id=os_tid if isinstance(os_tid, int) else None,
        name=_cut(raw["thread_name"]) if isinstance(raw.get("thread_name"), str) else None,
        active=bool(raw.get("active")),
        owns_gil=bool(raw.get("owns_gil")),
        frames=[_frame(f) for f in frames],
        frames_dropped=dropped,
    )


def parse_dump(data: bytes) -> tuple[list[rpc.ThreadStack], int]:
    """py-spy's ``dump --json`` output -> bounded threads and how many threads were dropped."""
    doc = orjson.loads(data)
    if not isinstance(doc, list):
        raise ValueError("py-spy's JSON is not a list of threads")
    raw = [t for t in doc if isinstance(t, dict)]
    return [_thread(t) for t in raw[:MAX_THREADS]], max(0, len(raw) - MAX_THREADS)


def _bounded_run(argv: list[str], timeout_s: float) -> tuple[int | None, bytes, bytes, bool]:
    """Run ``argv``; (return code, or None when it was killed at ``timeout_s``; stdout; stderr;
    whether stdout went over ``MAX_OUTPUT_BYTES``)."""
    env = {**os.environ, "RUST_BACKTRACE": "0", "RUST_LIB_BACKTRACE": "0"}
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    expired = threading.Event()

    def expire() -> None:
        expired.set()
        proc.kill()

    timer = threading.Timer(timeout_s, expire)
    timer.start()
    err_chunks: list[bytes] = []

    def read_err() -> None:
        assert proc.stderr is not None
        err_chunks.append(proc.stderr.read(MAX_STDERR_BYTES))
        proc.stderr.read()  # drain the rest so py-spy never blocks on a full pipe

    reader = threading.Thread(target=read_err, daemon=True)
    reader.start()
    try:
        assert proc.stdout is not None
        out = proc.stdout.read(MAX_OUTPUT_BYTES + 1)
        too_large = len(out) > MAX_OUTPUT_BYTES
        if too_large:
            proc.kill()
        proc.stdout.read()
        code = proc.wait()
        reader.join(timeout=5)
    finally:
        timer.cancel()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return (None if expired.is_set() else code), out, b"".join(err_chunks), too_large


def _has_cap_ptrace() -> bool:
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("CapEff:"):
                    return bool(int(line.split()[1], 16) >> CAP_SYS_PTRACE & 1)
    except (OSError, ValueError, IndexError):
        pass
    return False


def _ptrace_scope() -> int | None:
    try:
        with open("/proc/sys/kernel/yama/ptrace_scope", encoding="ascii") as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return None


def _owner(pid: int) -> int | None:
    try:
        return os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return None


def permission_advice(pid: int, euid: int | None = None, cap: bool | None = None) -> str:
    """Why ptrace of ``pid`` is refused to this daemon (effective uid ``euid``, with or without
    CAP_SYS_PTRACE: this process's own by default), and what fixes it (one sentence each)."""
    me = os.geteuid() if euid is None else euid
    owner = _owner(pid)
    cap = _has_cap_ptrace() if cap is None else cap
    scope = _ptrace_scope()
    if scope == 3:
        return (
            "kernel.yama.ptrace_scope is 3 (no process may attach to another, not even root); "
            "fix: set it to 0 or 1 at boot (sysctl kernel.yama.ptrace_scope=1 needs a reboot once it is 3)"
        )
    if owner is not None and owner != me and me != 0 and not cap:
        return (
            f"the process belongs to uid {owner} and the daemon runs as uid {me} without CAP_SYS_PTRACE; "
            "fix: run `kscope daemon` as root or as the job's user, or grant it CAP_SYS_PTRACE "
            "(systemd: AmbientCapabilities=CAP_SYS_PTRACE)"
        )
    if not cap and me == 0:
        return (
            "the daemon runs as root but without CAP_SYS_PTRACE (a container drops it by default); "
            "fix: docker run --cap-add SYS_PTRACE, or in Kubernetes "
            'securityContext.capabilities.add: ["SYS_PTRACE"]'
        )
    if scope in (1, 2) and not cap:
        return (
            f"kernel.yama.ptrace_scope is {scope} (only a parent, or CAP_SYS_PTRACE, may attach); "
            "fix: grant the daemon CAP_SYS_PTRACE (systemd: AmbientCapabilities=CAP_SYS_PTRACE; "
            "docker: --cap-add SYS_PTRACE) or set sysctl kernel.yama.ptrace_scope=0"
        )
    return (
        "the kernel refused ptrace (a security module, seccomp, or a different user namespace); "
        "fix: run the daemon in the job's namespace with CAP_SYS_PTRACE (docker: --cap-add SYS_PTRACE)"
    )


def classify(pid: int, stderr: bytes, euid: int | None = None, cap: bool | None = None) -> tuple[str, str]:
    """py-spy's failure text -> (error_kind, one-line message naming the process and the fix);
    ``euid``/``cap``: who ran py-spy (default: this process)."""
    text = stderr.decode("utf-8", "replace")
    first = next((ln.strip() for ln in text.splitlines() if ln.strip()), "py-spy failed without a message")
    low = text.lower()
    if "permission denied" in low or "operation not permitted" in low or "os error 1)" in low:
        return PERMISSION, f"pid {pid}: ptrace refused: {permission_advice(pid, euid, cap)}"
    if not os.path.exists(f"/proc/{pid}") or "check that the process is running" in low:
        return GONE, f"pid {pid}: the process exited before its stack could be read"
    if "failed to find python version" in low:
        return FAILED, f"pid {pid}: not a Python process py-spy can read ({first[:200]})"
    return FAILED, f"pid {pid}: py-spy failed: {first[:300]}"


def snapshot(
    pid: int, *, native: bool = False, with_locals: bool = False, timeout_s: float = DEFAULT_TIMEOUT_S
) -> Snapshot:
    """One py-spy dump of ``pid`` (a pid of this daemon's namespace); never raises."""
    exe = find_py_spy()
    if exe is None:
        return Snapshot(
            [],
            error=f"pid {pid}: py-spy is not installed next to the daemon's Python nor on PATH "
            f"(pip install py-spy, or set {PY_SPY_ENV})",
            error_kind=NO_PY_SPY,
        )
    argv = [exe, "dump", "--pid", str(pid), "--json"]
    if native:
        argv.append("--native")
    if with_locals:
        argv.append("--locals")
    cpu = cpu_seconds(pid)
    taken = time.time()
    started = time.perf_counter()
    try:
        code, out, err, too_large = _bounded_run(argv, timeout_s)
    except OSError as exc:
        return Snapshot([], error=f"pid {pid}: cannot run py-spy {exe}: {exc}", error_kind=NO_PY_SPY)
    pause_ms = round((time.perf_counter() - started) * 1000, 3)
    if too_large:
        return Snapshot(
            [], error=f"pid {pid}: py-spy's answer exceeds {MAX_OUTPUT_BYTES} bytes", error_kind=FAILED
        )
    if code is None:
        return Snapshot([], error=f"pid {pid}: no snapshot within {timeout_s:g} s", error_kind=TIMEOUT)
    if code != 0:
        kind, message = classify(pid, err)
        return Snapshot([], error=message, error_kind=kind, pause_ms=pause_ms)
    try:
        threads, dropped = parse_dump(out)
    except ValueError as exc:
        return Snapshot([], error=f"pid {pid}: unreadable py-spy output ({exc})", error_kind=FAILED)
    return Snapshot(threads, dropped, pause_ms=pause_ms, cpu_s=cpu, taken_at=round(taken, 3))


MAX_PROCESSES = 256  # processes one request may snapshot (per daemon)
MAX_PARALLEL = 8  # py-spy runs at once


def _one(p: Process, native: bool, with_locals: bool, timeout_s: float, deadline: float) -> rpc.ProcessStacks:
    info = p.info
    left = deadline - time.monotonic()
    if info is not None and left <= 0:
        snap = Snapshot(
            [],
            error=f"pid {info.pid}: not read: the request's {rpc.STACKS_MAX_REQUEST_S:g} s budget ran out "
            "(ask for fewer processes)",
            error_kind=TIMEOUT,
        )
    elif info is None:
        snap = Snapshot(
            [],
            error=f"pid {p.pid}: not visible in this daemon's /proc (another pid namespace?); "
            "run the daemon in the job's pid namespace (docker: --pid host)",
            error_kind=NOT_VISIBLE,
        )
    elif p.alive() is False:
        snap = Snapshot([], error=f"pid {info.pid}: the process has exited", error_kind=GONE)
    else:
        snap = snapshot(info.pid, native=native, with_locals=with_locals, timeout_s=min(timeout_s, left))
    return rpc.ProcessStacks(
        pid=p.pid,
        host_pid=info.pid if info else None,
        rank=info.rank if info else None,
        local_rank=info.local_rank if info else None,
        world_size=info.world_size if info else None,
        job_id=p.job_id,
        cmdline=_cut(info.cmdline) if info and info.cmdline else None,
        threads=snap.threads,
        threads_dropped=snap.threads_dropped,
        error=snap.error,
        error_kind=snap.error_kind,
        pause_ms=snap.pause_ms,
        cpu_s=snap.cpu_s,
        taken_at=snap.taken_at,
    )


def take(
    processes: list[Process], *, native: bool, with_locals: bool, timeout_s: float
) -> list[rpc.ProcessStacks]:
    """Snapshots of ``processes`` (at most ``MAX_PROCESSES``), ``MAX_PARALLEL`` at a time, in
    rank order (then pid), within ``rpc.STACKS_MAX_REQUEST_S`` for the whole request."""
    ordered = sorted(
        processes,
        key=lambda p: (p.info.rank if p.info and p.info.rank is not None else 1 << 30, p.pid),
    )
    if not ordered:
        return []
    with ThreadPoolExecutor(
        max_workers=min(MAX_PARALLEL, len(ordered)), thread_name_prefix="kscope-stacks"
    ) as pool:
        deadline = time.monotonic() + rpc.STACKS_MAX_REQUEST_S
        return list(pool.map(lambda p: _one(p, native, with_locals, timeout_s, deadline), ordered))
