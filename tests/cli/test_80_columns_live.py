"""The run-time output of the commands that need live parts reads at 80 columns (docs/cli.md).

test_80_columns.py checks the commands that read files (analyze, diff, jobs, traces, report) on
the real test traces, and every command's ``--help``. This module runs the others for real, at
``COLUMNS=80``, once on a pseudo-terminal 80 columns wide and once piped:

* ``kscope daemon`` (its ready line), ``kscope serve`` (its start-up lines): started on port 0,
  stopped with SIGTERM once they are ready;
* ``kscope stacks``, ``kscope trace --wait`` and ``kscope autopilot --once`` against a real
  ``kscope daemon`` and a real PyTorch training process registered with it;
* ``kscope catalog import`` / ``catalog show`` / ``traces --files`` of a real trace of that job
  (slow), their one-line errors on the real test traces (fast); ``kscope --version``, ``--help``;
* ``kscope demo``'s tables and narrative (a real trace of a real job, printed by the demo's own
  steps; the whole demo is the slow test).

The checks (from test_80_columns.py): no line wider than 80 cells unless it holds a single token
(a long path on a line of its own, whole), and the values the test knows independently (the job's
pid, the daemon's port, the trace id, the paths of the files on disk) appear whole among the
output's tokens: a value folded across lines, or cut with "…", loses its token and fails. An
error on stderr is one line whatever the width; no Python repr (``{'0': 10}``, ``['a']``)
anywhere.
"""

from __future__ import annotations

import errno
import fcntl
import os
import pty
import re
import select
import signal
import struct
import subprocess
import sys
import termios
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cli.test_80_columns import (
    CPU_JOB,
    KSCOPE,
    REPO,
    WIDE,
    WIDTH,
    cells,
    problems,
    pty_run,
    screen,
    tokens,
)

# A folder name long enough that a path under it does not fit in 80 columns with anything else.
LONG = "a-rather-long-folder-name-so-that-paths-under-it-need-a-line-of-their-own"
REPR = re.compile(r"[\[{(]'|'[\]})]|\{\d+: |<[a-zA-Z_.]+ object at 0x")


def env80(tmp: Path, columns: int = WIDTH, **extra: str) -> dict[str, str]:
    """The environment of a command under test: ``COLUMNS``, a private cache and catalog, no
    credentials or daemon settings inherited."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "KINETO_", "KSCOPE_"))}
    env.update(
        COLUMNS=str(columns),
        LINES="50",
        TERM="xterm-256color",
        PYTHONPATH=str(REPO),
        KSCOPE_CACHE_DIR=str(tmp / "cache"),
        KSCOPE_CATALOG=str(tmp / "catalog.db"),
    )
    env.pop("NO_COLOR", None)
    env.update(extra)
    return env


def check(out: str, whole: list[str], err: str = "") -> None:
    """The 80-column rule on ``out`` (stdout) and ``err`` (stderr): lines, values, reprs, errors."""
    wide = [
        f"{cells(ln)} columns: {ln!r}" for ln in out.splitlines() if cells(ln) > WIDTH and len(ln.split()) > 1
    ]
    assert wide == [], "\n".join(wide) + "\n" + out
    have = set(tokens(out))
    missing = [t for t in whole if t not in have]
    assert missing == [], f"split or cut: {missing}\n{out}"
    assert not REPR.search(out), out
    assert "Traceback" not in err, err
    errors = [ln for ln in err.splitlines() if ln.lower().startswith("error")]
    assert all(ln.startswith("error: ") for ln in errors), err


def piped(
    args: list[str], tmp: Path, timeout: float = 300, columns: int = WIDTH, prog: list[str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``kscope ARGS`` (or ``prog ARGS``) piped, at ``columns`` (``env80``), from the repository."""
    cmd = [*(KSCOPE if prog is None else prog), *args]
    return subprocess.run(
        cmd, capture_output=True, text=True, env=env80(tmp, columns), timeout=timeout, cwd=REPO
    )


def run_both(
    args: list[str], tmp: Path, timeout: float = 300, ok: tuple[int, ...] = (0,)
) -> list[tuple[str, str]]:
    """``kscope ARGS`` piped, then on an 80-column terminal: [(how, stdout)], exit status in ``ok``."""
    proc = piped(args, tmp, timeout)
    assert proc.returncode in ok, proc.stdout + proc.stderr
    check(proc.stdout, [], proc.stderr)
    term, err, code = run_pty(args, tmp, timeout)
    assert code in ok, term + err
    return [("piped", proc.stdout), ("on a terminal", term)]


def run_pty(args: list[str], tmp: Path, timeout: float) -> tuple[str, str, int]:
    """``kscope ARGS`` with stdout on a pseudo-terminal 80 columns wide: (stdout, stderr, status)."""
    out, err, code = pty_run([*KSCOPE, *args], env80(tmp), WIDTH, timeout)
    check("", [], err)
    return out, err, code


class Server:
    """A long-running ``kscope`` command (daemon, serve) with stdout on a terminal or a pipe:
    read until a ready pattern, then SIGTERM."""

    def __init__(self, args: list[str], tmp: Path, terminal: bool) -> None:
        self.chunks: list[bytes] = []
        if terminal:
            self.master, slave = pty.openpty()
            fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, WIDTH, 0, 0))
        else:
            self.master, slave = os.pipe()
        self.proc = subprocess.Popen(
            [*KSCOPE, *args],
            stdout=slave,
            stderr=subprocess.DEVNULL,
            stdin=subprocess.DEVNULL,
            env=env80(tmp),
            cwd=REPO,
            start_new_session=True,
        )
        os.close(slave)

    def read_until(self, pattern: str, timeout: float = 120) -> str:
        """stdout so far once ``pattern`` (a regex) matched it and a following line came or the
        output paused; fails after ``timeout`` s (a dead server, not a slow one)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            ready, _, _ = select.select([self.master], [], [], 0.5)
            text = screen(b"".join(self.chunks))
            if not ready:
                if re.search(pattern, text):
                    return text
                assert self.proc.poll() is None, f"exited with {self.proc.returncode}:\n{text}"
                continue
            try:
                data = os.read(self.master, 65536)
            except OSError as exc:
                if exc.errno != errno.EIO:
                    raise
                data = b""
            if not data:
                return text
            self.chunks.append(data)
        raise AssertionError(f"no {pattern!r} within {timeout} s:\n{screen(b''.join(self.chunks))}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        os.close(self.master)


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, int, Path]]:
    """A real ``kscope daemon`` on port 0 and one real CPU PyTorch training process registered
    with it, stepping until the module's tests are done: (daemon address, pid, work folder)."""
    pytest.importorskip("torch")
    from kinetoscope.demo.local import LocalDaemon, TrainingJob

    workdir = tmp_path_factory.mktemp("live80")
    daemon = LocalDaemon(workdir / "host", trace_root=workdir / LONG / "traces")
    job = None
    try:
        daemon.start(timeout=60)
        job = TrainingJob(
            workdir / "job",
            ranks=1,
            torchrun=False,
            steps=0,
            model="tiny",
            max_seconds=600,
            env={**daemon.kineto_env(), "SLURM_JOB_ID": "36199"},
            extra_args=["--step-sleep-ms", "20", "--quiet"],
        ).start()
        daemon.wait_for_processes(1, timeout=180, alive=job.alive)
        job.wait_for_steps(3, timeout=180)
        yield str(daemon.address), job.pid, workdir
    finally:
        if job is not None:
            job.stop()
        daemon.stop()


# ---------------------------------------------------------------------------------------------
# daemon, serve: start-up lines
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("terminal", [False, True], ids=["piped", "terminal"])
def test_daemon_ready_line_reads_at_80_columns(tmp_path: Path, terminal: bool) -> None:
    """``kscope daemon --port 0`` with a long trace root: the ready line wraps between its
    ``key=value`` pairs, the first line still says ``kscope daemon ready: rpc_port=N`` (scripts
    read it), the trace root stays whole."""
    root = tmp_path / LONG / "traces"
    sock = tmp_path / "ipc"
    args = ["daemon", "--port", "0", "--metrics-port", "-1", "--trace-root", str(root)]
    server = Server([*args, "--ipc-socket-dir", str(sock)], tmp_path, terminal)
    try:
        out = server.read_until(r"trace_root=\S+")
    finally:
        server.stop()
    first = out.splitlines()[0]
    m = re.match(r"kscope daemon ready: rpc_port=(\d+)", first)
    assert m and int(m.group(1)) > 0, out
    check(out, [f"rpc_port={m.group(1)}", f"trace_root={root}", f"ipc={sock}/dynolog"])


@pytest.mark.parametrize("terminal", [False, True], ids=["piped", "terminal"])
def test_serve_startup_reads_at_80_columns(tmp_path: Path, terminal: bool) -> None:
    """``kscope serve --port 0`` on a catalog under a long path: the ready line first (``kscope
    serve ready: URL``, what scripts read), then the catalog and pid, the path whole."""
    catalog = tmp_path / LONG / "catalog.db"
    catalog.parent.mkdir()
    server = Server(["serve", "--port", "0", "--catalog", str(catalog)], tmp_path, terminal)
    try:
        out = server.read_until(r"pid \d+")
    finally:
        server.stop()
    m = re.match(r"kscope serve ready: (http://127\.0\.0\.1:\d+/)$", out.splitlines()[0])
    assert m, out
    check(out, [m.group(1), f"sqlite:///{catalog}", f"{server.proc.pid})"])


# ---------------------------------------------------------------------------------------------
# stacks, trace, autopilot: against a real daemon and a real PyTorch process
# ---------------------------------------------------------------------------------------------
@pytest.mark.torch
@pytest.mark.parametrize("extra", [[], ["--stacks"], ["--samples", "2", "--interval", "0.2"]])
def test_stacks_reads_at_80_columns(live: tuple[str, int, Path], extra: list[str]) -> None:
    """``kscope stacks`` of the real job: the pid whole, every frame's ``(file:line)`` whole."""
    address, pid, workdir = live
    for how, out in run_both(["stacks", "-H", address, "-j", "36199", *extra], workdir, timeout=120):
        check(out, [])
        assert any(t.startswith(f"{pid}@") for t in tokens(out)), f"{how}:\n{out}"  # pid@host whole
        assert "verdict:" in out, f"{how}:\n{out}"
        # a frame's "(file:line)" on one line: a path folded across lines leaves a "(" unclosed
        assert all(ln.count("(") == ln.count(")") for ln in out.splitlines()), f"{how}:\n{out}"
        if extra == ["--stacks"]:
            assert re.search(r"\(\S+train_ddp\.py:\d+\)", out), f"{how}:\n{out}"


@pytest.mark.torch
def test_stacks_error_is_one_line_at_80_columns(live: tuple[str, int, Path]) -> None:
    """``kscope stacks`` of a pid the daemon does not know: one error line, exit status 1."""
    address, _, workdir = live
    proc = piped(["stacks", "-H", address, "--pids", "999999999"], workdir, 120)
    assert proc.returncode != 0, proc.stdout
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert lines and all(ln.startswith(("error: ", "note: ", "warning: ")) for ln in lines), proc.stderr


@pytest.mark.torch
def test_trace_wait_reads_at_80_columns(live: tuple[str, int, Path]) -> None:
    """``kscope trace --wait`` of the real job into a long output folder, with its catalog:
    the trace id, the pid and the file's whole path in the output."""
    address, pid, workdir = live
    outs = []
    for n, terminal in enumerate((False, True)):
        out_dir = workdir / LONG / "traces" / f"out{n}"  # under the daemon's trace root
        args = ["trace", "-H", address, "-j", "36199", "--duration-ms", "300", "--wait", "-o", str(out_dir)]
        if terminal:
            text, err, code = run_pty(args, workdir, 300)
        else:
            proc = piped(args, workdir)
            text, err, code = proc.stdout, proc.stderr, proc.returncode
        assert code in (0, 3), text + err
        files = sorted(str(p) for p in out_dir.rglob("*.pt.trace.json*"))
        assert files, text + err
        ids = re.findall(r"\bkst-[0-9a-z-]+", text)
        assert ids, text
        check(text, [str(pid), ids[0]], err)
        assert any(f in text or Path(f).name in text for f in files), text
        outs.append(text)


@pytest.mark.torch
def test_autopilot_once_reads_at_80_columns(live: tuple[str, int, Path], tmp_path: Path) -> None:
    """``kscope autopilot --once`` with the default policy: the job's "first due" line and the
    cycle's line, each wrapped between words, the job key whole."""
    address, _, _ = live
    catalog = str(tmp_path / LONG / "catalog.db")
    (tmp_path / LONG).mkdir()
    for how, out in run_both(["autopilot", "-H", address, "--catalog", catalog, "--once"], tmp_path):
        lines = out.splitlines()
        assert lines and lines[0].split()[0].endswith(":"), f"{how}:\n{out}"
        key = lines[0].split()[0].rstrip(":")
        check(out, [key])
        assert "autopilot cycle:" in out, f"{how}:\n{out}"


@pytest.mark.slow
@pytest.mark.torch
def test_autopilot_sample_reads_at_80_columns(live: tuple[str, int, Path], tmp_path: Path) -> None:
    """``kscope autopilot --once`` with ``warmup_s = 0``: a sample traced, analysed and recorded."""
    address, _, _ = live
    policy = tmp_path / "policy.toml"
    policy.write_text("warmup_s = 0\n", encoding="utf-8")
    catalog = str(tmp_path / "catalog.db")
    args = ["autopilot", "-H", address, "--catalog", catalog, "--policy", str(policy), "--once"]
    for how, out in run_both([*args, "--output-dir", str(tmp_path / LONG)], tmp_path, timeout=600):
        assert "samples started" in out, f"{how}:\n{out}"


def test_autopilot_error_is_one_line_at_80_columns(tmp_path: Path) -> None:
    """``kscope autopilot --once`` with no daemon listening: one ``error:`` line, exit status 1."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = piped(
        ["autopilot", "-H", f"127.0.0.1:{port}", "--catalog", str(tmp_path / "c.db"), "--once"], tmp_path, 300
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("error: ")]
    assert len(errors) == 1 and f"127.0.0.1:{port}" in errors[0], proc.stderr
    check(proc.stdout, [], proc.stderr)


# ---------------------------------------------------------------------------------------------
# catalog, --version: on the real test traces
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["import", "show"])
def test_catalog_errors_are_one_line_at_80_columns(tmp_path: Path, kind: str) -> None:
    """The fast variant of the catalog commands: ``catalog import`` of a real test-trace folder
    (no manifest: not a kscope trace folder) under a long path, ``catalog show`` of an unknown
    request: one ``error:`` line naming the folder or id, however narrow, exit status 1."""
    import shutil

    job = tmp_path / LONG / CPU_JOB.name
    shutil.copytree(CPU_JOB, job)
    name = str(job) if kind == "import" else "kst-20261128-000000-none"
    proc = piped(["catalog", kind, name], tmp_path, 120)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and name in lines[0], proc.stderr
    assert cells(lines[0]) > WIDTH or kind == "show", (
        lines
    )  # long enough that a wrapping console would break it
    check(proc.stdout, [], proc.stderr)


@pytest.mark.slow
@pytest.mark.torch
def test_catalog_commands_read_at_80_columns(live: tuple[str, int, Path], tmp_path: Path) -> None:
    """A real trace of the job (``kscope trace --wait --no-catalog`` into a long folder), then
    ``kscope catalog import`` of that folder, ``catalog show`` of its request and ``traces
    --files``: the trace id, the pid and every file's path whole."""
    address, pid, workdir = live
    out_dir = workdir / LONG / "traces" / "imported"  # under the daemon's trace root
    args = ["trace", "-H", address, "-j", "36199", "--duration-ms", "300", "--wait", "--no-catalog"]
    traced = piped([*args, "-o", str(out_dir)], tmp_path, 300, columns=WIDE)
    assert traced.returncode in (0, 3), traced.stdout + traced.stderr
    folder = next(p.parent for p in out_dir.rglob("manifest.json"))
    files = [str(p) for p in folder.rglob("*.pt.trace.json*")]
    trace_id = re.findall(r"\bkst-[0-9a-z-]+", traced.stdout)[0]
    for how, out in run_both(["catalog", "import", str(folder)], tmp_path):
        check(out, [trace_id])
        assert str(folder) in tokens(out) or trace_id in out, f"{how}:\n{out}"
    for command in (["catalog", "show", trace_id], ["traces", "--files"]):
        for how, out in run_both(command, tmp_path):
            check(out, [trace_id, str(pid)])
            assert all(f in tokens(out) or Path(f).name in tokens(out) for f in files), f"{how}:\n{out}"


def test_version_reads_at_80_columns(tmp_path: Path) -> None:
    for _, out in run_both(["--version"], tmp_path):
        assert re.fullmatch(r"\S+\n", out), out


@pytest.mark.parametrize("group", [[], ["catalog"]], ids=["kscope", "catalog"])
def test_command_lists_read_at_80_columns(tmp_path: Path, group: list[str]) -> None:
    """``kscope --help`` and ``kscope catalog --help``: every command named whole, within 80."""
    for how, out in run_both([*group, "--help"], tmp_path):
        check(out, ["daemon", "stacks", "autopilot", "demo"] if not group else ["import", "show"])
        assert "Commands" in out, f"{how}:\n{out}"


# ---------------------------------------------------------------------------------------------
# demo: its steps' printing on a real trace (fast), and the whole demo (slow)
# ---------------------------------------------------------------------------------------------
DEMO_SCREEN = """
import sys
from pathlib import Path
from rich.console import Console
from kinetoscope.collect.trigger import MatchedProcess, Target, TraceFile, TraceOptions, TraceResult
from kinetoscope.demo.driver import DemoContext, DemoOptions, _print_matched, step_inspect, step_analyze
from kinetoscope.demo.driver import print_files

job = Path(sys.argv[1])
files = sorted(job.glob("rank-*.pt.trace.json*"))
cmd = "/opt/conda/envs/train/bin/python -u -m torch.distributed.run --nproc-per-node 6 train.py"
matched, traced = [], []
for rank, f in enumerate(files):
    pid = int(f.name.split("_")[1].split(".")[0])
    matched.append(MatchedProcess(host="127.0.0.1:1778", hostname="node01", pid=pid, rank=rank,
        local_rank=rank, world_size=len(files), job_id="36199", cmdline=cmd, path=str(f),
        triggered=True, busy=False))
    traced.append(TraceFile(host="127.0.0.1:1778", pid=pid, rank=rank, path=str(f),
        bytes=f.stat().st_size, complete=True, exists=True))
result = TraceResult(trace_id="kst-20261128-a1b2c3", hosts=[], target=Target(job_id=36199),
    options=TraceOptions(iterations=10), matched=matched, files=traced, waited=True,
    output_dirs=[str(job)])
ctx = DemoContext(options=DemoOptions(ranks=len(files), straggler="none"), console=Console(highlight=False),
    workdir=job, deadline=1e18)
ctx.trace = result
ctx.job = object()  # step_inspect reads the job's step log only for the ground truth (none here)
_print_matched(ctx, result)
print_files(ctx)
ctx.inspection = []
step_inspect(ctx)
step_analyze(ctx)
"""


def test_demo_steps_read_at_80_columns(tmp_path: Path) -> None:
    """The demo's processes, files and inspection tables and its diagnosis lines, printed by the
    demo's own steps from a real 6-rank CPU job's trace files: every file name, pid and rank
    whole, no line over 80 columns."""
    import shutil

    job = tmp_path / LONG / CPU_JOB.name
    shutil.copytree(CPU_JOB, job)
    for f in job.glob("*.gz"):  # the demo reads the files a daemon wrote: plain JSON
        import gzip

        f.with_suffix("").write_bytes(gzip.decompress(f.read_bytes()))
        f.unlink()
    prog = [sys.executable, "-c", DEMO_SCREEN]
    args = [str(job)]
    outs = []
    for columns in (WIDE, WIDTH):
        proc = piped(args, tmp_path, 300, columns=columns, prog=prog)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        outs.append(proc.stdout)
    wide, narrow = outs
    names = [f.name for f in sorted(job.glob("rank-*.pt.trace.json"))]
    pids = [n.split("_")[1].split(".")[0] for n in names]
    assert names and all(n in wide for n in names), wide
    assert problems(narrow, wide) == [], narrow
    check(narrow, [*names, *pids])
    terminal, err, code = pty_run([*prog, *args], env80(tmp_path), WIDTH)
    assert code == 0, terminal + err
    assert problems(terminal, wide) == [], terminal
    check(terminal, [*names, *pids])


@pytest.mark.slow
@pytest.mark.torch
def test_demo_reads_at_80_columns(tmp_path: Path) -> None:
    """The whole ``kscope demo`` (daemon, 2-rank DDP job, trace, analysis, report), piped at 80
    columns: the trace id and every file name whole, no line over 80 columns."""
    workdir = tmp_path / LONG
    proc = piped(["demo", "--workdir", str(workdir), "--iterations", "5", "--timeout", "240"], tmp_path, 400)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    names = [p.name for p in (workdir / "traces").rglob("*.pt.trace.json")]
    assert names, proc.stdout
    check(proc.stdout, names, proc.stderr)
