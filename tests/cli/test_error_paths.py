"""Every error path a new user meets gives one line on stderr and a non-zero exit, never a
traceback (issue 10), and ids and paths stay whole in narrow or piped output. Each case runs
the real CLI in a subprocess (``python -m kinetoscope.cli.main``)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.cli._helpers import REPO
from tests.cli._helpers import kscope as _kscope
from tests.report.kscope_testkit import write_job

CPU_TRACE = "tests/data/traces/hta/cpu_only"


def kscope(*args: str, cwd: Path = REPO, columns: int | None = None) -> subprocess.CompletedProcess[str]:
    """The shared runner with ``COLUMNS`` unset unless given (errors must not depend on it)."""
    return _kscope(*args, cwd=cwd, columns=columns)


TRACE_ID = "kst-20261121-000000-narrow-output-check"


def assert_one_line_error(proc: subprocess.CompletedProcess[str], *needles: str) -> None:
    assert proc.returncode != 0, proc.stdout
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("error: "), lines[0]
    for needle in needles:
        assert needle in lines[0], lines[0]


@pytest.fixture(scope="module")
def paths(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("errors")
    (d / "truncated.json").write_text('{"traceEvents": [{"ph": "X"')
    (d / "not-json.json").write_text("hello")
    (d / "list.json").write_text("[1, 2]")
    (d / "a-file").write_text("x")
    (d / "existing-dir").mkdir()
    return {p.name: p for p in d.iterdir()} | {"root": d}


def test_report_output_is_an_existing_directory(paths: dict[str, Path]) -> None:
    target = paths["existing-dir"]
    assert_one_line_error(kscope("report", CPU_TRACE, "-o", str(target)), str(target), "directory")


@pytest.mark.parametrize(
    "target", ["/proc/kscope-report.html", "/proc/sys/kscope-report.html", "/sys/kscope-report.html"]
)
def test_report_output_on_a_file_system_that_refuses_files(target: str) -> None:
    """procfs and sysfs refuse new files even to root (mode bits do not stop root; these do)."""
    proc = kscope("report", CPU_TRACE, "-o", target)
    assert_one_line_error(proc, target)
    assert not Path(target).exists()


def test_report_output_under_a_file(paths: dict[str, Path]) -> None:
    target = paths["a-file"] / "report.html"
    assert_one_line_error(
        kscope("report", CPU_TRACE, "-o", str(target)), str(paths["a-file"]), "not a folder"
    )


def test_write_report_refuses_an_unwritable_place_in_one_line() -> None:
    """The library call too (the write itself fails on /proc, after the up-front check passes)."""
    from kinetoscope.report import ReportWriteError, write_report

    with pytest.raises(ReportWriteError) as info:
        write_report({"traces": []}, "/proc/kscope-report.html")
    assert "\n" not in str(info.value) and "/proc/kscope-report.html" in str(info.value)


@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (["analyze", "/nonexistent/trace.json"], ["/nonexistent/trace.json"]),
        (["analyze", "{truncated.json}"], ["truncated.json"]),
        (["analyze", "{not-json.json}"], ["not-json.json"]),
        (["analyze", "{list.json}"], ["list.json"]),
        (["analyze"], ["trace file"]),
        (["analyze", CPU_TRACE, "--ranks", "x-y"], ["--ranks"]),
        (["analyze", CPU_TRACE, "--option", "novalue"], ["--option"]),
        (["analyze", CPU_TRACE, "--only", "nosuch"], ["nosuch"]),
        (["analyze", CPU_TRACE, "-o", "num_kernels=3"], ["-o", "kscope analyze --help"]),
        (["analyze", CPU_TRACE, "--bogus"], ["--bogus"]),
        (["report"], ["--document"]),
        (["report", "--document", "{missing.json}"], ["missing.json"]),
        (["report", "--document", "{truncated.json}"], ["truncated.json"]),
        (["diff", "/nope/a.json", "/nope/b.json"], ["/nope/a.json"]),
        (["trace", "--pids", "abc"], ["abc"]),
        (["trace", "--job-id", "1", "--iterations", "5", "--timeout", "5"], ["--timeout"]),
        (["jobs", "--catalog", "/nonexistent/dir/c.db"], ["/nonexistent/dir"]),
        (["catalog", "show"], ["trace_id"]),
        (["catalog", "show", "kst-nope", "--catalog", "{c.db}"], ["kst-nope"]),
        (["serve", "--port", "99999"], ["--port"]),
        (["nosuch"], ["nosuch"]),
    ],
)
def test_error_paths_are_one_line(paths: dict[str, Path], args: list[str], needles: list[str]) -> None:
    root = paths["root"]
    filled = [str(root / a[1:-1]) if a.startswith("{") else a for a in args]  # {name}: a file in tmp
    assert_one_line_error(kscope(*filled), *needles)


@pytest.fixture(scope="module")
def catalog_with_job(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    """A catalog holding one request whose folder path is longer than 80 columns."""
    root = tmp_path_factory.mktemp("narrow") / ("deep-folder-name-" * 4).rstrip("-")
    job = root / TRACE_ID
    write_job(job, trace_id=TRACE_ID)
    url = str(root.parent / "catalog.db")
    proc = kscope("catalog", "import", str(job), "--catalog", url)
    assert proc.returncode == 0, proc.stderr
    return url, job


@pytest.mark.parametrize("columns", [80, None])  # an 80-column terminal's width; a plain pipe
@pytest.mark.parametrize("command", [["traces", "--files"], ["catalog", "show", TRACE_ID]])
def test_ids_and_paths_stay_whole(
    catalog_with_job: tuple[str, Path], command: list[str], columns: int | None
) -> None:
    url, job = catalog_with_job
    proc = kscope(*command, "--catalog", url, columns=columns)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    assert TRACE_ID in proc.stdout
    assert str(job) in proc.stdout  # the folder, whole, on one line
    for f in sorted(job.glob("rank-*.json")):
        assert f.name in proc.stdout
    if columns is not None:
        assert max(len(ln) for ln in proc.stdout.splitlines()) <= 80 or str(job) in max(
            proc.stdout.splitlines(), key=len
        ), "only a whole path may run past 80 columns"


def test_analyze_keeps_paths_whole_and_fits_a_screen(catalog_with_job: tuple[str, Path]) -> None:
    """The verdict and the tables with rows; the empty ones in one line each (--full prints them).
    The trace files print under their folder, each name and the folder whole."""
    _url, job = catalog_with_job
    proc = kscope("analyze", str(job), "--no-record", columns=80)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    assert f"{job}/\n" in proc.stdout  # the folder whole, on a line of its own when long
    for f in sorted(job.glob("rank-*.json")):
        assert f" {f.name}\n" in proc.stdout
    full = kscope("analyze", str(job), "--no-record", "--full", columns=80)
    assert full.returncode == 0, full.stderr
    assert len(proc.stdout.splitlines()) < len(full.stdout.splitlines())
    assert proc.stdout.splitlines()[0] == "Diagnosis"
