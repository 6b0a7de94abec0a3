"""Fixtures for the collection tests: a tiny real RPC server, and running `kscope` as a subprocess."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from kinetoscope.protocol.wire import FrameError, frame_rpc, read_rpc_frame

REPO_ROOT = Path(__file__).resolve().parents[2]

Handler = Callable[[dict[str, Any]], "dict[str, Any] | None"]


class TinyRpcServer:
    """A real TCP server speaking dyno's framing; ``handlers[fn](request)`` gives the reply
    (``None``: close without answering, as dynolog does for unknown functions)."""

    def __init__(self, handlers: dict[str, Handler]) -> None:
        self.handlers = handlers
        self.requests: list[dict[str, Any]] = []
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _serve(self) -> None:
        self.sock.settimeout(0.1)
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            with conn:
                conn.settimeout(5)
                try:
                    req = orjson.loads(read_rpc_frame(conn))
                except (FrameError, OSError, orjson.JSONDecodeError):
                    continue
                self.requests.append(req)
                handler = self.handlers.get(req.get("fn"))
                reply = handler(req) if handler else None
                if reply is not None:
                    try:
                        conn.sendall(frame_rpc(orjson.dumps(reply, option=orjson.OPT_SORT_KEYS)))
                    except OSError:
                        pass

    def close(self) -> None:
        self._stop.set()
        self.sock.close()
        self._thread.join(timeout=2)


@pytest.fixture()
def rpc_server() -> Iterator[Callable[[dict[str, Handler]], TinyRpcServer]]:
    servers: list[TinyRpcServer] = []

    def make(handlers: dict[str, Handler]) -> TinyRpcServer:
        srv = TinyRpcServer(handlers)
        servers.append(srv)
        return srv

    try:
        yield make
    finally:
        for srv in servers:
            srv.close()


@pytest.fixture(autouse=True)
def private_catalog(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """``kscope trace`` records into a catalog (default ~/.kinetoscope/catalog.db): every test here
    gets its own, through ``$KSCOPE_CATALOG`` (inherited by ``run_kscope`` subprocesses)."""
    path = tmp_path / "catalog.db"
    monkeypatch.setenv("KSCOPE_CATALOG", str(path))
    return path


@pytest.fixture()
def free_port() -> int:
    """A port nothing listens on (bound, then closed)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def kscope_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}  # no real credentials
    env["PYTHONPATH"] = str(REPO_ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.pop("KSCOPE_TOKEN", None)
    env["COLUMNS"] = "200"
    if extra:
        env.update(extra)
    return env


@pytest.fixture()
def kscope_main(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> Callable[..., tuple[int, str, str]]:
    """Run the CLI in this process (fast): ``kscope_main("trace", ...)`` -> (exit code, stdout, stderr)."""
    from kinetoscope.cli.main import main

    def run(*args: str) -> tuple[int, str, str]:
        monkeypatch.setattr(sys, "argv", ["kscope", *args])
        monkeypatch.setenv("COLUMNS", "250")
        monkeypatch.delenv("KSCOPE_TOKEN", raising=False)
        with pytest.raises(SystemExit) as info:
            main()
        out, err = capsys.readouterr()
        code = info.value.code
        return (0 if code is None else int(code)), out, err

    return run


@pytest.fixture()
def run_kscope() -> Callable[..., subprocess.CompletedProcess[str]]:
    """Run ``python -m kinetoscope.cli.main ARGS`` as a subprocess (the real CLI)."""

    def run(
        *args: str, timeout: float = 120, env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "kinetoscope.cli.main", *args],
            cwd=REPO_ROOT,
            env=kscope_env(env),
            capture_output=True,
            check=False,
            text=True,
            timeout=timeout,
        )

    return run


# ---------------------------------------------------------------------------------------
# Real daemon + real PyTorch processes
# ---------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def single_torch_job(tmp_path_factory):
    """A private daemon and one real CPU training process (torch.optim.SGD, no torchrun) that
    keeps stepping until the module's tests are done. Yields (daemon, job, pid)."""
    pytest.importorskip("torch")
    from kinetoscope.demo.local import LocalDaemon, TrainingJob

    workdir = tmp_path_factory.mktemp("single")
    daemon = LocalDaemon(workdir)
    job = None
    try:
        daemon.start()
        job = TrainingJob(
            workdir,
            ranks=1,
            torchrun=False,
            steps=0,
            model="tiny",
            max_seconds=280,
            env=daemon.kineto_env(),
            extra_args=["--step-sleep-ms", "20", "--quiet"],
        ).start()
        procs = daemon.wait_for_processes(1, timeout=90, alive=job.alive)
        job.wait_for_steps(3, timeout=90)
        assert procs[0].pid == job.pid
        yield daemon, job, job.pid
    finally:
        if job is not None:
            job.stop()
        daemon.stop()
