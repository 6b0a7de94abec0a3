"""Run a private ``kscope daemon`` and the demo training job as subprocesses, and always clean up.

Used by ``kscope demo``, by the collection tests and by later work (straggler diagnosis), so that
every caller gets the same guarantees:

* every child runs in its own process group (``start_new_session``) and is stopped by killing the
  whole group (SIGTERM, then SIGKILL), so torchrun's ranks never outlive the caller;
* on Linux the children also get ``PR_SET_PDEATHSIG``: if the caller is killed outright (SIGKILL,
  OOM), they receive SIGTERM instead of running on;
* the daemon uses a private filesystem IPC socket (``KINETO_IPC_SOCKET_DIR``) and trace root, so it
  never meets the processes of another daemon, and ``kineto_env()`` gives the environment a
  PyTorch process needs to reach it (plus ``KINETO_CONFIG`` with 1 s polling instead of 5 s).
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import kinetoscope
from kinetoscope.collect.client import DaemonClient, DaemonError, HostAddress
from kinetoscope.errors import KinetoscopeError
from kinetoscope.protocol import rpc

PACKAGE_PARENT = str(Path(kinetoscope.__file__).resolve().parent.parent)
_READY = re.compile(r"kscope daemon ready: rpc_port=(\d+)")
_PR_SET_PDEATHSIG = 1


class ProcessFailed(KinetoscopeError):
    """A child process did not start or stopped unexpectedly (message carries its log tail)."""


def _load_prctl() -> Callable[..., int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True).prctl  # resolved here, in the parent
    except (OSError, AttributeError):
        return None


_PRCTL = _load_prctl()


def _pdeathsig() -> None:
    """Runs in the child between fork and exec: only calls the already-resolved prctl."""
    if _PRCTL is not None:
        _PRCTL(_PR_SET_PDEATHSIG, int(signal.SIGTERM))


def child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The caller's environment with this kinetoscope importable (``PYTHONPATH``) and ``extra``."""
    env = dict(os.environ)
    parts = [PACKAGE_PARENT] + [
        p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != PACKAGE_PARENT
    ]
    env["PYTHONPATH"] = os.pathsep.join(parts)
    env.setdefault("PYTHONUNBUFFERED", "1")
    if extra:
        env.update(extra)
    return env


def log_tail(path: Path | str, lines: int = 15) -> str:
    try:
        text = Path(path).read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.rstrip().splitlines()[-lines:])


class ManagedProcess:
    """A subprocess in its own process group, output to a log file, stopped group-wide."""

    def __init__(
        self, name: str, argv: Sequence[str], log_path: Path, env: dict[str, str], cwd: str | None = None
    ):
        self.name = name
        self.argv = list(argv)
        self.log_path = log_path
        self.env = env
        self.cwd = cwd
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> ManagedProcess:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "ab")  # noqa: SIM115 - the child keeps it open
        try:
            self.proc = subprocess.Popen(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.env,
                cwd=self.cwd,
                start_new_session=True,
                preexec_fn=_pdeathsig if _PRCTL is not None else None,  # noqa: PLW1509
            )
        finally:
            log.close()
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def poll(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, grace: float = 5.0) -> int | None:
        """SIGTERM the whole process group, wait ``grace`` s, then SIGKILL it. Idempotent."""
        if self.proc is None:
            return None
        pgid = self.proc.pid  # start_new_session: the group id is the child's pid
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pgid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                pass
        # the leader may be gone while group members (torchrun's ranks) live on
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)
        try:
            self.proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            pass
        return self.proc.returncode

    def tail(self, lines: int = 15) -> str:
        return log_tail(self.log_path, lines)


class LocalDaemon:
    """``python -m kinetoscope.cli.main daemon`` on an ephemeral port with a private IPC socket."""

    def __init__(
        self,
        workdir: str | os.PathLike[str],
        *,
        trace_root: str | os.PathLike[str] | None = None,
        poll_interval_s: int = 1,
        token: str | None = None,
        extra_args: Sequence[str] = (),
    ) -> None:
        self.workdir = Path(workdir).resolve()
        self.trace_root = Path(trace_root).resolve() if trace_root else self.workdir / "traces"
        self.poll_interval_s = poll_interval_s
        self.token = token
        self.extra_args = list(extra_args)
        # Kineto copies the socket path into a 108-byte sun_path; keep the directory short.
        self.socket_dir = Path(tempfile.mkdtemp(prefix="kscope-ipc-", dir="/tmp"))
        self.kineto_config = self.workdir / "kineto.conf"
        self.log_path = self.workdir / "daemon.log"
        self.port: int | None = None
        self.process: ManagedProcess | None = None

    @property
    def address(self) -> HostAddress:
        if self.port is None:
            raise RuntimeError("daemon not started")
        return HostAddress("127.0.0.1", self.port)

    def client(self, timeout: float = 5.0) -> DaemonClient:
        return DaemonClient(self.address, token=self.token, timeout=timeout)

    def kineto_env(self) -> dict[str, str]:
        """What a PyTorch process needs in its environment to be traced through this daemon."""
        return {
            "KINETO_USE_DAEMON": "1",
            "KINETO_IPC_SOCKET_DIR": str(self.socket_dir),
            "KINETO_CONFIG": str(self.kineto_config),
        }

    def start(self, timeout: float = 30.0) -> LocalDaemon:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.trace_root.mkdir(parents=True, exist_ok=True)
        self.kineto_config.write_text(
            "# written by kinetoscope: poll the daemon every second instead of every 5 s\n"
            f"ON_DEMAND_CONFIG_UPDATE_INTERVAL_SECS={self.poll_interval_s}\n"
        )
        argv = [
            sys.executable,
            "-m",
            "kinetoscope.cli.main",
            "daemon",
            "--port",
            "0",
            "--bind",
            "127.0.0.1",
            "--ipc-socket-dir",
            str(self.socket_dir),
            "--trace-root",
            str(self.trace_root),
            "--metrics-port",
            "-1",
            "--no-gpu-metrics",
            *self.extra_args,
        ]
        env = child_env()
        env.pop("KINETO_IPC_SOCKET_DIR", None)
        if self.token:
            env["KSCOPE_TOKEN"] = self.token
        else:
            env.pop("KSCOPE_TOKEN", None)
        self.log_path.write_bytes(b"")
        self.process = ManagedProcess("daemon", argv, self.log_path, env).start()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            m = _READY.search(self.log_path.read_text(errors="replace"))
            if m:
                self.port = int(m.group(1))
                return self
            if not self.process.alive():
                raise ProcessFailed(
                    f"the daemon exited with code {self.process.poll()} before it was ready:\n{self.process.tail()}"
                )
            time.sleep(0.05)
        self.stop()
        raise ProcessFailed(f"the daemon was not ready within {timeout:g} s:\n{log_tail(self.log_path)}")

    def list_processes(self, job_id: int | None = None) -> list[rpc.ProcessInfo]:
        return self.client().list_processes(job_id).processes

    def wait_for_processes(
        self,
        count: int,
        *,
        job_id: int | None = None,
        timeout: float = 60.0,
        ranks_only: bool = True,
        alive: Callable[[], bool] | None = None,
    ) -> list[rpc.ProcessInfo]:
        """Until ``count`` processes (launchers excluded by default) are registered; returns them."""
        deadline = time.monotonic() + timeout
        procs: list[rpc.ProcessInfo] = []
        while True:
            try:
                procs = [p for p in self.list_processes(job_id) if not (ranks_only and p.is_launcher)]
            except DaemonError:
                procs = []
            if len(procs) >= count:
                return procs
            if alive is not None and not alive():
                raise ProcessFailed("the traced job stopped before it registered with the daemon")
            if time.monotonic() >= deadline:
                raise ProcessFailed(
                    f"only {len(procs)} of {count} processes registered with the daemon within {timeout:g} s"
                )
            time.sleep(0.2)

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()
        shutil.rmtree(self.socket_dir, ignore_errors=True)

    def __enter__(self) -> LocalDaemon:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class TrainingJob:
    """``kinetoscope.demo.train_ddp`` under torchrun (or alone for ``ranks=1, torchrun=False``)."""

    def __init__(
        self,
        workdir: str | os.PathLike[str],
        *,
        ranks: int = 2,
        steps: int = 0,
        straggler: str = "none",
        straggler_rank: int = -1,
        straggler_prob: float = 0.3,
        straggler_ms: tuple[float, float] = (50.0, 200.0),
        model: str = "small",
        seed: int = 0,
        load_ms: float = 0.0,
        bucket_cap_mb: float | None = None,
        max_seconds: float = 300.0,
        env: dict[str, str] | None = None,
        torchrun: bool | None = None,
        extra_args: Sequence[str] = (),
        name: str = "job",
    ) -> None:
        self.workdir = Path(workdir).resolve()
        self.ranks = ranks
        self.progress_dir = self.workdir / f"{name}-progress"
        self.log_path = self.workdir / f"{name}.log"
        self.torchrun = ranks > 1 if torchrun is None else torchrun
        args = [
            "--steps",
            str(steps),
            "--straggler",
            straggler,
            "--straggler-rank",
            str(straggler_rank),
            "--straggler-prob",
            str(straggler_prob),
            "--straggler-ms",
            f"{straggler_ms[0]:g},{straggler_ms[1]:g}",
            "--model",
            model,
            "--seed",
            str(seed),
            "--max-seconds",
            str(max_seconds),
            "--progress-dir",
            str(self.progress_dir),
        ]
        if load_ms:
            args += ["--load-ms", f"{load_ms:g}"]
        if bucket_cap_mb is not None:
            args += ["--bucket-cap-mb", f"{bucket_cap_mb:g}"]
        args += list(extra_args)
        if self.torchrun:
            self.argv = [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--standalone",
                f"--nproc-per-node={ranks}",
                "-m",
                "kinetoscope.demo.train_ddp",
                *args,
            ]
        else:
            self.argv = [sys.executable, "-m", "kinetoscope.demo.train_ddp", *args]
        self.env = child_env(env)
        self.env.setdefault("OMP_NUM_THREADS", "1")
        self.process: ManagedProcess | None = None

    def start(self) -> TrainingJob:
        self.workdir.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(self.progress_dir, ignore_errors=True)
        self.log_path.write_bytes(b"")
        self.process = ManagedProcess("job", self.argv, self.log_path, self.env).start()
        return self

    @property
    def pid(self) -> int:
        """The pid of what was launched: torchrun's agent (the launcher) or the single process."""
        assert self.process is not None
        return self.process.pid

    def alive(self) -> bool:
        return self.process is not None and self.process.alive()

    def progress(self) -> dict[int, dict[str, Any]]:
        """rank -> {"rank", "world_size", "pid", "step", "t"} from the ranks' progress files."""
        out: dict[int, dict[str, Any]] = {}
        for p in self.progress_dir.glob("rank-*.json"):
            try:
                doc = json.loads(p.read_text())
            except (OSError, ValueError):
                continue
            out[int(doc["rank"])] = doc
        return out

    def wait_for_steps(self, steps: int, timeout: float = 90.0) -> dict[int, dict[str, Any]]:
        """Until every rank has finished ``steps`` optimizer steps."""
        deadline = time.monotonic() + timeout
        while True:
            prog = self.progress()
            if len(prog) >= self.ranks and all(d["step"] >= steps for d in prog.values()):
                return prog
            if not self.alive():
                raise ProcessFailed(
                    f"the training job exited (code {self.process.poll() if self.process else None}) "
                    f"before step {steps}:\n{self.tail()}"
                )
            if time.monotonic() >= deadline:
                raise ProcessFailed(
                    f"the training job did not reach step {steps} within {timeout:g} s:\n{self.tail()}"
                )
            time.sleep(0.1)

    def step_rate(self, window_s: float = 1.0) -> float:
        """Recent optimizer steps per second (from rank 0's step log; 0 if unknown)."""
        t_end = time.time()
        log = self.progress_dir / "rank-0.steps.jsonl"
        try:
            lines = log.read_text().splitlines()[-200:]
        except OSError:
            return 0.0
        times: list[float] = []
        for line in lines:
            with contextlib.suppress(ValueError, KeyError):
                times.append(json.loads(line)["t0"])
        recent = [t for t in times if t >= t_end - window_s]
        if len(recent) < 2:
            recent = times[-10:]
        if len(recent) < 2 or recent[-1] <= recent[0]:
            return 0.0
        return (len(recent) - 1) / (recent[-1] - recent[0])

    def iteration_roundup(self, margin_s: float = 3.0, multiple: int = 10) -> int:
        """An ``--iteration-roundup`` that makes every rank start tracing at the same iteration:
        the next multiple of ``multiple`` at least ``margin_s`` seconds of steps ahead of the job
        (ranks pick up the config at their own polls, up to one poll interval apart)."""
        step = max((d["step"] for d in self.progress().values()), default=0)
        rate = self.step_rate() or 10.0
        return int(math.ceil((step + rate * margin_s + 1) / multiple) * multiple)

    def step_log(self, rank: int) -> list[dict[str, Any]]:
        path = self.progress_dir / f"rank-{rank}.steps.jsonl"
        try:
            return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        except (OSError, ValueError):
            return []

    def tail(self, lines: int = 15) -> str:
        return log_tail(self.log_path, lines)

    def stop(self, grace: float = 5.0) -> int | None:
        return self.process.stop(grace) if self.process is not None else None

    def stop_once_logged(self, steps: int = 2, timeout: float = 30.0, grace: float = 5.0) -> int | None:
        """Stop the job once every rank has logged ``steps`` more steps than the furthest rank
        now has. A rank logs a step after its ``--step-sleep-ms``, so a trace that has just been
        written can end in a step the log does not hold yet: stopping at once loses that line, and
        the step log (the ground truth the demo and the tests read) no longer covers the trace.
        A job that has already exited, or does not get there in ``timeout``, is stopped anyway."""
        furthest = max((d["step"] for d in self.progress().values()), default=0)
        with contextlib.suppress(ProcessFailed):
            self.wait_for_steps(furthest + steps, timeout=timeout)
        return self.stop(grace)

    def __enter__(self) -> TrainingJob:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


@contextlib.contextmanager
def terminate_on_sigterm() -> Iterator[None]:
    """Turn SIGTERM/SIGHUP into KeyboardInterrupt so ``finally`` blocks clean up (main thread only)."""

    def handler(signum: int, _frame: object) -> None:
        raise KeyboardInterrupt(signal.Signals(signum).name)

    previous = {}
    for sig in (signal.SIGTERM, signal.SIGHUP):
        with contextlib.suppress(ValueError, OSError):
            previous[sig] = signal.signal(sig, handler)
    try:
        yield
    finally:
        for sig, h in previous.items():
            with contextlib.suppress(ValueError, OSError):
                signal.signal(sig, h)
