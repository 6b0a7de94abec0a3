"""`kscope analyze` resolves catalog trace ids and records its analysis in the catalog."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from tests.conftest import HTA_TRACES, REPO_ROOT

RANK_FILES = ("timeline_analysis/sampled_rank-0.json.gz", "trace_filter/sampled_rank-1.json.gz")


def kscope(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kinetoscope.cli.main", *args],
        env=env,
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.fixture()
def env(tmp_path: Path) -> dict[str, str]:
    e = {k: v for k, v in os.environ.items() if k != "KSCOPE_CATALOG"}
    e["PYTHONPATH"] = str(REPO_ROOT)
    e["HOME"] = str(tmp_path / "home")  # never the user's ~/.kinetoscope
    return e


@pytest.fixture()
def request_dir(tmp_path: Path) -> Path:
    """A trace request folder as `kscope trace` leaves it: two rank files + manifest.json."""
    d = tmp_path / "traces" / "kst-analyze-1"
    d.mkdir(parents=True)
    files = []
    for rank, rel in enumerate(RANK_FILES):
        name = f"rank-{rank}_{1000 + rank}.pt.trace.json.gz"
        shutil.copyfile(HTA_TRACES / rel, d / name)
        files.append(
            {
                "file": name,
                "path": str(d / name),
                "host": "node0",
                "pid": 1000 + rank,
                "rank": rank,
                "world_size": 128,
                "job_id": "77",
                "cmdline": "python train.py",
                "complete": True,
            }
        )
    manifest = {
        "kinetoscope_manifest": 1,
        "trace_id": "kst-analyze-1",
        "created": "2026-11-21T05:30:12Z",
        "config": "ACTIVITIES_ITERATIONS=2",
        "files": files,
    }
    (d / "manifest.json").write_bytes(orjson.dumps(manifest))
    return d


def test_trace_id_is_resolved_and_the_analysis_recorded(
    request_dir: Path, tmp_path: Path, env: dict[str, str]
) -> None:
    from kinetoscope.store import Catalog

    url = f"sqlite:///{tmp_path}/catalog.db"
    with Catalog.open(url) as cat:
        cat.import_trace_dir(request_dir)
    r = kscope("analyze", "kst-analyze-1", "--catalog", url, "--json", env=env)
    assert r.returncode == 0, r.stderr
    doc = orjson.loads(r.stdout)
    assert sorted(t["rank"] for t in doc["traces"]) == [0, 1]
    assert doc["job"]["world_size"] == 128
    with Catalog.open(url) as cat:
        analyses = cat.list_analyses()
        assert analyses.height == 1
        rec = cat.get_analysis(analyses["id"][0])
    assert rec.trace_id == "kst-analyze-1"
    assert rec.document["stragglers"]["kind"] == doc["stragglers"]["kind"]


def test_local_files_are_recorded_only_when_a_catalog_is_named(
    request_dir: Path, tmp_path: Path, env: dict[str, str]
) -> None:
    from kinetoscope.store import Catalog

    url = f"sqlite:///{tmp_path}/catalog.db"
    r = kscope("analyze", str(request_dir), "--only", "temporal_breakdown", env=env)
    assert r.returncode == 0, r.stderr
    assert not (Path(env["HOME"]) / ".kinetoscope").exists()  # no catalog named: nothing written

    r = kscope(
        "analyze",
        str(request_dir),
        "--only",
        "temporal_breakdown",
        "--no-record",
        env={**env, "KSCOPE_CATALOG": url},
    )
    assert r.returncode == 0, r.stderr
    with Catalog.open(url) as cat:
        assert cat.list_analyses().height == 0

    r = kscope(
        "analyze", str(request_dir), "--only", "temporal_breakdown", env={**env, "KSCOPE_CATALOG": url}
    )
    assert r.returncode == 0, r.stderr
    assert "recorded analysis" in r.stderr
    with Catalog.open(url) as cat:
        assert cat.list_analyses().height == 1


def test_unknown_trace_id_is_one_clear_error(tmp_path: Path, env: dict[str, str]) -> None:
    r = kscope("analyze", "kst-nope", "--catalog", f"sqlite:///{tmp_path}/c.db", env=env)
    assert r.returncode != 0
    assert "Traceback" not in r.stderr
    assert "kst-nope" in r.stderr and "no trace with this id" in r.stderr


def test_unreachable_catalog_is_a_warning_not_a_failed_analysis(
    request_dir: Path, env: dict[str, str]
) -> None:
    bad = "postgresql://nobody:secret@127.0.0.1:1/none?connect_timeout=2"
    r = kscope("analyze", str(request_dir), "--only", "temporal_breakdown", "--catalog", bad, env=env)
    assert r.returncode == 0, r.stderr
    assert "warning: analysis not recorded in the catalog" in r.stderr
    assert "secret" not in r.stderr


def test_a_recorded_path_outside_the_request_folder_is_refused(
    request_dir: Path, tmp_path: Path, env: dict[str, str]
) -> None:
    """Regression (issue 32 follow-up): a catalog row whose ``path`` names a file outside the
    request's folder (recorded from a manifest as given) made ``kscope analyze <trace_id>`` read
    that file. Now: one error line naming the trace id and the file; nothing is analysed."""
    from kinetoscope.store import Catalog

    outside = tmp_path / "home" / "elsewhere.json.gz"
    outside.parent.mkdir(parents=True)
    shutil.copyfile(request_dir / "rank-1_1001.pt.trace.json.gz", outside)
    (request_dir / "rank-1_1001.pt.trace.json.gz").unlink()
    doc = orjson.loads((request_dir / "manifest.json").read_bytes())
    doc["files"][1]["path"] = str(outside)
    url = f"sqlite:///{tmp_path}/catalog.db"
    with Catalog.open(url) as cat:
        cat.record_trace_request(doc)  # a manifest recorded as it came (no folder to check against)
    r = kscope("analyze", "kst-analyze-1", "--catalog", url, "--json", env=env)
    assert r.returncode != 0 and "Traceback" not in r.stderr and r.stdout == "", r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, r.stderr
    assert (
        "kst-analyze-1" in lines[0]
        and "rank-1_1001.pt.trace.json.gz" in lines[0]
        and str(outside) in lines[0]
    )
    with Catalog.open(url) as cat:
        assert cat.list_analyses().height == 0
