"""`kscope report` as a real subprocess, and the demo's analyse/report steps on synthetic traces."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console

from tests.report.kscope_testkit import env_with_repo

REPO_ROOT = Path(__file__).resolve().parents[2]


def kscope(*args: str, cache: Path, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kinetoscope.cli.main", *args],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        env=env_with_repo({"KSCOPE_CACHE_DIR": str(cache)}),
    )


def test_report_of_a_vendored_gpu_trace(tmp_path, hta_traces):
    out = tmp_path / "r.html"
    r = kscope(
        "report", str(hta_traces / "trace_diff/control/control.json.gz"), "-o", str(out), cache=tmp_path / "c"
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"report: {out}" in " ".join(r.stdout.split())
    html = out.read_text()
    assert html.startswith("<!doctype html>") and "plotly.js v" in html
    assert (
        'id="chart-top-kernels"' in html and "SINGLE PROCESS" in html
    )  # one trace: the single-process headline (issue 10)
    assert not (tmp_path / "r.html.tmp").exists() and len(list(tmp_path.glob(".r.html*"))) == 0


def test_report_by_trace_id_records_the_analysis(tmp_path, hostile_job, hostile_doc):
    from kinetoscope.store import Catalog

    cat = str(tmp_path / "cat.db")
    with Catalog.open(cat) as c:
        c.import_trace_dir(hostile_job)
    out = tmp_path / "by-id.html"
    r = kscope("report", "kst-20261121-000000-test", "--catalog", cat, "-o", str(out), cache=tmp_path / "c")
    assert r.returncode == 0, r.stdout + r.stderr
    text = " ".join(r.stdout.split())
    assert (
        "INTERMITTENT STRAGGLERS" in text
        and "recorded analysis 1" in text
        and "kst-20261121-000000-test" in text
    )
    with Catalog.open(cat) as c:
        a = c.latest_analysis("kst-20261121-000000-test")
        assert (
            a is not None
            and a.straggler_kind == "intermittent"
            and a.straggler_rank == 1
            and a.world_size == 2
        )
        assert a.inputs == ["kst-20261121-000000-test"] and a.summary["report"] == str(out.resolve())
    # a document from `kscope analyze --json` renders as is, without touching the catalog
    import orjson

    doc = tmp_path / "doc.json"
    doc.write_bytes(orjson.dumps(hostile_doc))
    r = kscope("report", "--document", str(doc), "-o", str(tmp_path / "doc.html"), cache=tmp_path / "c")
    assert r.returncode == 0, r.stderr
    assert "&lt;img src=x onerror=alert(1)&gt;" in (tmp_path / "doc.html").read_text()


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        ([], 2, "give trace files"),
        (["kst-unknown"], 1, "no trace with this id"),
        (["/nonexistent/x.json"], 1, "no such file or folder"),
        (["--document", "/nonexistent.json"], 2, "cannot read a JSON document"),
    ],
)
def test_report_errors_are_one_line(tmp_path, args, code, message):
    r = kscope(
        "report",
        *args,
        "--catalog",
        str(tmp_path / "c.db"),
        "-o",
        str(tmp_path / "x.html"),
        cache=tmp_path / "c",
        timeout=60,
    )
    assert r.returncode == code, r.stdout + r.stderr
    assert message in " ".join(r.stderr.split()) and "Traceback" not in r.stderr
    assert not (tmp_path / "x.html").exists()


def test_demo_analyze_and_report_steps(tmp_path, hostile_job):
    """The demo's two new steps, on the synthetic job instead of a torchrun job (the full demo
    runs in tests/collect/test_collect_demo.py)."""
    import time
    from types import SimpleNamespace

    from kinetoscope.demo.driver import DemoContext, DemoOptions, step_analyze, step_report, step_summary

    files = sorted(hostile_job.glob("rank-*.json"))
    trace = SimpleNamespace(
        files=[SimpleNamespace(path=str(f), rank=i, complete=True) for i, f in enumerate(files)],
        output_dir=str(hostile_job),
    )
    console = Console(record=True, width=200, color_system=None)
    ctx = DemoContext(
        options=DemoOptions(workdir=str(tmp_path)),
        console=console,
        workdir=tmp_path,
        deadline=time.monotonic() + 100,
        trace=trace,
    )  # type: ignore[arg-type]
    ctx.extras["ground_truth"] = {"rank": 1, "steps": (2, 6), "sleeps": [(2, 25.0)]}
    step_analyze(ctx)
    step_report(ctx)
    step_summary(ctx)
    out = " ".join(console.export_text().split())
    assert "INTERMITTENT STRAGGLERS" in out and "the diagnosis names rank 1" in out
    assert "kscope serve --catalog" in out and "catalog.db" in out
    assert (tmp_path / "report.html").is_file() and (tmp_path / "catalog.db").is_file()
    from kinetoscope.store import Catalog

    with Catalog.open(str(tmp_path / "catalog.db")) as c:
        assert c.get_trace_request("kst-20261121-000000-test").complete_files == 2
        assert c.latest_analysis("kst-20261121-000000-test").id == ctx.extras["analysis_id"]
