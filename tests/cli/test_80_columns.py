"""Every command's human output reads at 80 columns (docs/cli.md, "80 columns").

Each command runs twice on the real test traces (tests/data/...) at ``COLUMNS=80``: once on a
terminal (a pseudo-terminal 80 columns wide: Rich draws as for a person) and once piped. Two
checks on each output, independent of how kinetoscope lays text out:

* **width**: no line is wider than 80 display cells (East Asian wide characters count 2), except
  a line that holds a single token wider than the whole width (a long path has a line of its own
  and stays whole, ready to be copied);
* **no token split**: the same command run 400 columns wide (nothing needs to wrap) gives the
  reference tokens; every one of them must appear whole among the 80-column output's tokens. A
  number folded as ``14/2`` + ``0``, a header as ``impo`` + ``sed`` or a name cut with ``…``
  loses its token and fails.

Commands that need live processes or daemons (trace, stacks, autopilot, daemon, serve, demo,
catalog) are run for real in test_80_columns_live.py (a real daemon, a real PyTorch process),
with the helpers of this module; here, their ``--help``. ``kscope trace``'s tables (processes, files, uploads) are also
rendered by its own functions from a result that names the real files of a test job (no daemon
needed), on a terminal and piped. The 80-column rule of stderr is different: an error is one line
whatever the width (test_error_paths.py; here: ``kscope trace`` to a closed port).
"""

from __future__ import annotations

import errno
import fcntl
import os
import pty
import re
import socket
import struct
import subprocess
import sys
import termios
import unicodedata
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DATA = REPO / "tests" / "data"
WIDTH = 80
WIDE = 400
ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b\][^\x07]*\x07|\x1b[()][A-Z0-9]")

GPU_JOB = DATA / "gpu_jobs" / "gloo_cuda_intermittent_loaded_w5"
CPU_JOB = DATA / "cpu_jobs" / "steady_14_of_16_w6"
HTA = DATA / "traces" / "hta"

COMMANDS = [
    "daemon",
    "trace",
    "stacks",
    "analyze",
    "diff",
    "jobs",
    "traces",
    "report",
    "autopilot",
    "serve",
    "demo",
]
CATALOG_SUB = ["import", "show"]


def cells(line: str) -> int:
    """Display width of ``line``: wide and full-width characters take two cells, combining none."""
    n = 0
    for ch in line:
        if unicodedata.combining(ch):
            continue
        n += 2 if unicodedata.east_asian_width(ch) in ("W", "F") else 1
    return n


def tokens(text: str) -> list[str]:
    """Whitespace-separated tokens, table rules and borders dropped, a record's ``header:`` colon
    dropped (the same header shows with and without it)."""
    out = []
    for tok in text.split():
        if all("\u2500" <= ch <= "\u257f" for ch in tok):  # a table's rules and borders
            continue
        out.append(tok.rstrip(":"))
    return [t for t in out if t]


def _env(columns: int, tmp: Path) -> dict[str, str]:
    env = {**os.environ, "COLUMNS": str(columns), "LINES": "50", "KSCOPE_CACHE_DIR": str(tmp / "cache")}
    env.pop("NO_COLOR", None)
    env["TERM"] = "xterm-256color"
    return env


KSCOPE = [sys.executable, "-m", "kinetoscope.cli.main"]


def run_piped(args: list[str], columns: int, tmp: Path, prog: list[str] = KSCOPE) -> str:
    proc = subprocess.run(
        [*prog, *args],
        capture_output=True,
        text=True,
        env=_env(columns, tmp),
        timeout=300,
        cwd=REPO,
    )
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc.stdout


def run_terminal(args: list[str], columns: int, tmp: Path, prog: list[str] = KSCOPE) -> str:
    """stdout on a pseudo-terminal ``columns`` wide (escape sequences removed)."""
    out, err, _ = pty_run([*prog, *args], _env(columns, tmp), columns)
    assert "Traceback" not in err, err
    return out


def pty_run(
    argv: list[str], env: dict[str, str], columns: int = WIDTH, timeout: float = 300
) -> tuple[str, str, int]:
    """``argv`` with stdout on a pseudo-terminal ``columns`` wide: (stdout, escape sequences
    removed and a line redrawn after a carriage return kept as last drawn; stderr; exit status)."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, columns, 0, 0))
    proc = subprocess.Popen(
        argv, stdout=slave, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, env=env, cwd=REPO
    )
    os.close(slave)
    chunks = []
    while True:
        try:
            data = os.read(master, 65536)
        except OSError as exc:  # EIO: the child closed the terminal
            if exc.errno != errno.EIO:
                raise
            break
        if not data:
            break
        chunks.append(data)
    os.close(master)
    _, err = proc.communicate(timeout=timeout)
    return screen(b"".join(chunks)), err.decode("utf-8", "replace"), proc.returncode


def screen(data: bytes) -> str:
    """What a terminal shows of ``data``: escape sequences removed; of a line redrawn after a
    carriage return (a spinner), what was drawn last."""
    text = ANSI.sub("", data.decode("utf-8", "replace").replace("\r\n", "\n"))
    return "\n".join(line.rsplit("\r", 1)[-1] for line in text.split("\n"))


def problems(narrow: str, wide: str, width: int = WIDTH) -> list[str]:
    """What breaks the 80-column rule in ``narrow`` (given ``wide``, the same output unwrapped)."""
    found = []
    for line in narrow.splitlines():
        if cells(line) > width and len(line.split()) > 1:
            found.append(f"{cells(line)} columns: {line!r}")
    have = set(tokens(narrow))
    missing = [t for t in dict.fromkeys(tokens(wide)) if t not in have]
    found += [f"token split or cut: {t!r}" for t in missing]
    return found


def _cases(tmp: Path) -> dict[str, list[str]]:
    """Command lines with human output on the real test traces (a catalog in ``tmp``)."""
    cat = str(tmp / "catalog.db")
    return {
        "analyze gpu job": ["analyze", str(GPU_JOB), "--no-record"],
        "analyze gpu job --full": ["analyze", str(GPU_JOB), "--no-record", "--full"],
        "analyze cpu job --full": ["analyze", str(CPU_JOB), "--no-record", "--full"],
        "analyze hta trace": ["analyze", str(HTA / "trace_diff" / "control"), "--no-record"],
        "analyze --list": ["analyze", "--list"],
        "analyze flight recorder": ["analyze", "--flight-recorder", str(DATA / "flight_recorder")],
        "diff": [
            "diff",
            str(HTA / "trace_diff" / "control"),
            str(HTA / "trace_diff" / "test"),
            "--top",
            "12",
        ],
        "diff by step": [
            "diff",
            str(HTA / "trace_compare" / "base"),
            str(HTA / "trace_compare" / "test"),
            "--step",
            "first",
            "--top",
            "8",
        ],
        "jobs": ["jobs", "--catalog", cat],
        "traces": ["traces", "--catalog", cat],
        "report": ["report", str(CPU_JOB), "-o", str(tmp / "r.html"), "--catalog", cat],
    }


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A catalog with one recorded analysis, so that ``jobs`` and ``traces`` have rows."""
    tmp = tmp_path_factory.mktemp("cols80")
    run_piped(
        ["analyze", str(CPU_JOB), "--catalog", str(tmp / "catalog.db"), "--record", "--json"], WIDE, tmp
    )
    return tmp


CASE_NAMES = list(_cases(Path("/")))


@pytest.mark.parametrize("name", CASE_NAMES)
def test_output_reads_at_80_columns(name: str, workdir: Path) -> None:
    args = _cases(workdir)[name]
    wide = run_piped(args, WIDE, workdir)
    assert wide.strip(), f"{name}: no output"
    piped = run_piped(args, WIDTH, workdir)
    terminal = run_terminal(args, WIDTH, workdir)
    assert problems(piped, wide) == [], f"{name}, piped:\n{piped}"
    assert problems(terminal, wide) == [], f"{name}, on a terminal:\n{terminal}"


@pytest.mark.parametrize("command", [*COMMANDS, *(f"catalog {c}" for c in CATALOG_SUB)])
def test_help_reads_at_80_columns(command: str, tmp_path: Path) -> None:
    """``--help`` of every command on a terminal: no line over 80 columns, no Python type names
    as metavars (``<list[str]>``), every flag whole."""
    args = [*command.split(), "--help"]
    terminal = run_terminal(args, WIDTH, tmp_path)
    wide = run_piped(args, WIDE, tmp_path)
    too_wide = [ln for ln in terminal.splitlines() if cells(ln) > WIDTH]
    assert too_wide == [], terminal
    assert not re.search(r"<(list|dict|set|tuple|str|int|float|bool)\b", terminal), terminal
    flags = {t for t in tokens(wide) if re.fullmatch(r"--[a-z][a-z0-9-]*", t)}
    narrow_flags = set(re.findall(r"--[a-z][a-z0-9-]*", terminal))
    assert flags <= narrow_flags, flags - narrow_flags


def test_the_checks_catch_a_folded_table() -> None:
    """The checks can fail: a table whose cells are folded mid-token (what Rich's
    ``overflow="fold"`` did to the straggler table) and a soft-wrapped long line both fail."""
    wide = "rank  role          last at  imposed ms\n1     intermittent  14/20    61.47\n"
    folded = "rank  role  last  impo\n            at    sed\n1     inte  14/2  61.4\n      rmit  0     7\n"
    found = problems(folded, wide)
    assert any("'14/20'" in p for p in found) and any("'imposed'" in p for p in found), found
    long_line = "word " * 30
    assert problems(long_line, long_line) != []
    assert problems("x" * 120, "x" * 120) == []  # one token wider than the width: its own line


# ``kscope trace``'s human output of a finished request, rendered by its own functions (what it
# prints after a real trace: processes, then files and uploads) from a result naming the files of a real test job: processes with
# a torchrun command line, the files by their whole paths (not in the output folder, so not
# shortened to names), and their uploads to S3 under a long prefix. argv[1]: the job folder.
TRACE_SCREEN = """
import sys
from pathlib import Path
from rich.console import Console
from kinetoscope.cli.trace_cmd import _report, render_matched
from kinetoscope.collect.trigger import MatchedProcess, Target, TraceFile, TraceOptions, TraceResult
from kinetoscope.store.storage import StoredObject

job = Path(sys.argv[1])
files = sorted(job.glob("rank-*.pt.trace.json*"))
store = "s3://kinetoscope-traces-production/fleet-a/jobs/gloo_cuda_intermittent_loaded_w5/kst-20261128"
cmd = ("/opt/conda/envs/train/bin/python -u -m torch.distributed.run --nproc-per-node 5 "
       "--rdzv-endpoint node01.cluster.example.com:29500 train.py --config configs/llama_7b.yaml")
matched, traced, stored = [], [], []
for rank, f in enumerate(files):
    pid = int(f.name.split("_")[1].split(".")[0])
    matched.append(MatchedProcess(host="node01:1778", hostname="node01", pid=pid, rank=rank,
        local_rank=rank, world_size=len(files), job_id="36199_0", cmdline=cmd, path=str(f),
        triggered=True, busy=False))
    traced.append(TraceFile(host="node01:1778", pid=pid, rank=rank, path=str(f),
        bytes=f.stat().st_size, complete=True, exists=True))
    stored.append(StoredObject(url=f"{store}/{f.name}", key=f.name, bytes=f.stat().st_size,
        sha256=f"{rank:064x}"))
result = TraceResult(trace_id="kst-20261128-a1b2c3", hosts=[], target=Target(all=True),
    options=TraceOptions(duration_ms=500), matched=matched, files=traced, waited=True,
    output_dirs=["/tmp/kinetoscope/traces/kst-20261128-a1b2c3"], stored=stored, store_url=store)
out = Console(highlight=False)
render_matched(out, result)
_report(out, Console(stderr=True), result, False, True)
"""


def test_trace_tables_read_at_80_columns(tmp_path: Path) -> None:
    """The processes, files and uploads tables of ``kscope trace``: every path and URL whole (on a
    line of its own when it does not fit), the command whole, no line over 80 columns."""
    prog = [sys.executable, "-c", TRACE_SCREEN]
    args = [str(GPU_JOB)]
    wide = run_piped(args, WIDE, tmp_path, prog)
    paths = [str(f) for f in sorted(GPU_JOB.glob("rank-*.pt.trace.json*"))]
    assert len(paths) == 5 and all(p in wide for p in paths), wide
    piped = run_piped(args, WIDTH, tmp_path, prog)
    terminal = run_terminal(args, WIDTH, tmp_path, prog)
    for how, narrow in (("piped", piped), ("on a terminal", terminal)):
        assert problems(narrow, wide) == [], f"{how}:\n{narrow}"
        have = set(tokens(narrow))
        urls = [t for t in tokens(wide) if t.startswith("s3://")]
        assert len(urls) == 6 and set(paths) | set(urls) <= have, f"{how}:\n{narrow}"
    assert "--config configs/llama_7b.yaml" in wide, wide  # the command whole, not cut with "..."


def test_trace_error_is_one_line_at_80_columns(tmp_path: Path) -> None:
    """``kscope trace`` to a daemon that does not listen (a closed loopback port): a one-line
    error naming the address, however narrow the terminal, and exit status 1."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.run(
        [*KSCOPE, "trace", "-H", f"127.0.0.1:{port}", "--all", "--duration-ms", "5", "--no-catalog"],
        capture_output=True,
        text=True,
        env=_env(WIDTH, tmp_path),
        timeout=120,
        cwd=REPO,
    )
    assert proc.returncode == 1, proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.startswith("error:")]
    assert len(errors) == 1 and f"127.0.0.1:{port}" in errors[0], proc.stderr
    assert cells(errors[0]) > WIDTH, errors[0]  # long enough that a wrapping console would break it
    assert all(ln.startswith(("error:", "note:", "warning:")) for ln in lines), proc.stderr
