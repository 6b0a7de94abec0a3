"""`kscope jobs`, `kscope traces`, `kscope catalog import/show` as real CLI invocations."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from .conftest import REPO_ROOT, make_manifest, write_trace_dir


def kscope(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kinetoscope.cli.main", *args],
        env=env,
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=180,
    )


def assert_one_line_error(r: subprocess.CompletedProcess[str], *needles: str) -> None:
    assert r.returncode != 0
    assert "Traceback" not in r.stderr and "Traceback" not in r.stdout
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr
    for n in needles:
        assert n in lines[0], lines[0]


def test_import_then_list(tmp_path: Path, cli_env: dict[str, str]) -> None:
    catalog_url = f"sqlite:///{tmp_path}/catalog.db"
    m1 = make_manifest("kst-cli-1", job_id="4242", created="2026-11-21T05:30:12Z")
    m1["files"][-1]["complete"] = False
    d1 = write_trace_dir(tmp_path / "out", m1)
    write_trace_dir(
        tmp_path / "out",
        make_manifest("kst-cli-2", job_id="77", hosts=("gpu9",), created="2026-11-22T00:00:00Z"),
    )
    r = kscope("catalog", "import", str(d1), "--catalog", catalog_url, "--json", env=cli_env)
    assert r.returncode == 0, r.stderr
    imported = orjson.loads(r.stdout)["imported"]
    assert [t["trace_id"] for t in imported] == ["kst-cli-1"] and imported[0]["status"] == "incomplete"
    assert len(imported[0]["file_list"]) == 4 and imported[0]["file_list"][0]["sha256"]
    # a folder of request folders; importing kst-cli-1 again is idempotent
    r = kscope("catalog", "import", str(tmp_path / "out"), "--catalog", catalog_url, env=cli_env)
    assert r.returncode == 0, r.stderr
    assert "kst-cli-1" in r.stdout and "kst-cli-2" in r.stdout

    r = kscope("jobs", "--catalog", catalog_url, "--json", env=cli_env)
    assert r.returncode == 0, r.stderr
    doc = orjson.loads(r.stdout)
    assert doc["kinetoscope_catalog"] == 1 and "catalog" in doc
    assert [j["job_id"] for j in doc["jobs"]] == ["77", "4242"]
    j = doc["jobs"][1]
    keys = {"job_id", "hosts", "world_size", "first_seen", "last_seen", "cmdline", "traces", "job_source"}
    assert set(j) == keys
    assert j["hosts"] == ["node07", "node08"] and j["world_size"] == 4 and j["traces"] == 1
    assert j["first_seen"] == "2026-11-21T05:30:12Z"

    r = kscope("traces", "--job-id", "4242", "--catalog", catalog_url, "--json", env=cli_env)
    assert r.returncode == 0, r.stderr
    traces = orjson.loads(r.stdout)["traces"]
    assert [t["trace_id"] for t in traces] == ["kst-cli-1"]
    assert set(traces[0]) == {
        "trace_id",
        "created",
        "status",
        "requested_by",
        "job_ids",
        "hosts",
        "files",
        "complete_files",
        "bytes",
        "store_url",
        "recorded_at",
        "updated_at",
    }
    assert (traces[0]["files"], traces[0]["complete_files"]) == (4, 3)

    r = kscope("traces", "--catalog", catalog_url, env=cli_env)  # Rich table
    assert r.returncode == 0 and "kst-cli-2" in r.stdout and "kst-cli-1" in r.stdout
    r = kscope("jobs", "--catalog", catalog_url, env=cli_env)
    assert r.returncode == 0 and "4242" in r.stdout and "python train.py" in r.stdout
    r = kscope("catalog", "show", "kst-cli-1", "--catalog", catalog_url, "--json", env=cli_env)
    assert r.returncode == 0, r.stderr
    shown = orjson.loads(r.stdout)["trace"]
    assert shown["trace_id"] == "kst-cli-1" and len(shown["file_list"]) == 4 and shown["analyses"] == []
    r = kscope("catalog", "show", "nope", "--catalog", catalog_url, env=cli_env)
    assert_one_line_error(r, "no trace request 'nope'")


@pytest.mark.postgres
def test_postgres_catalog(tmp_path: Path, cli_env: dict[str, str], pg_url: str) -> None:
    d = write_trace_dir(tmp_path / "out", make_manifest("kst-pg", job_id="55"))
    r = kscope("catalog", "import", str(d), "--catalog", pg_url, env=cli_env)
    assert r.returncode == 0, r.stderr
    r = kscope("traces", "--job-id", "55", "--catalog", pg_url, "--json", env=cli_env)
    assert r.returncode == 0, r.stderr
    doc = orjson.loads(r.stdout)
    assert doc["catalog"].startswith("postgresql") and [t["trace_id"] for t in doc["traces"]] == ["kst-pg"]


def test_default_catalog_env_and_store(tmp_path: Path, cli_env: dict[str, str]) -> None:
    d = write_trace_dir(tmp_path / "out", make_manifest("kst-def"))
    r = kscope("catalog", "import", str(d), "--store", str(tmp_path / "store"), env=cli_env)
    assert r.returncode == 0, r.stderr
    assert (Path(cli_env["HOME"]) / ".kinetoscope" / "catalog.db").is_file()
    assert (tmp_path / "store" / "kst-def" / "manifest.json").is_file()
    r = kscope("traces", "--json", env=cli_env)
    t = orjson.loads(r.stdout)["traces"][0]
    assert t["trace_id"] == "kst-def" and t["store_url"] == str(tmp_path / "store")
    env = {**cli_env, "KSCOPE_CATALOG": str(tmp_path / "other.db")}
    r = kscope("jobs", "--json", env=env)
    assert r.returncode == 0 and orjson.loads(r.stdout)["jobs"] == []
    assert (tmp_path / "other.db").is_file()


def test_bad_input_gives_one_clear_error(tmp_path: Path, cli_env: dict[str, str]) -> None:
    db = str(tmp_path / "c.db")
    # unreachable PostgreSQL (nothing listens on port 1); the password is never printed
    r = kscope("jobs", "--catalog", "postgresql://kscope:s3cret@127.0.0.1:1/catalog", env=cli_env)
    assert_one_line_error(r, "cannot open catalog", "127.0.0.1")
    assert "s3cret" not in r.stderr
    r = kscope("traces", "--catalog", str(tmp_path / "missing-dir" / "c.db"), env=cli_env)
    assert_one_line_error(r, "does not exist")
    # malformed manifests
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "manifest.json").write_text('{"kinetoscope_manifest": 1, "trace_id": "x", "files": [')
    r = kscope("catalog", "import", str(bad), "--catalog", db, env=cli_env)
    assert_one_line_error(r, "manifest.json", "not valid JSON")
    # (square brackets in the message must not be eaten as Rich markup)
    (bad / "manifest.json").write_text('{"kinetoscope_manifest": 1, "trace_id": "t", "files": [{"file": 3}]}')
    r = kscope("catalog", "import", str(bad), "--catalog", db, env=cli_env)
    assert_one_line_error(r, "files[0]", "plain file name")
    r = kscope("catalog", "import", str(tmp_path / "nowhere"), "--catalog", db, env=cli_env)
    assert_one_line_error(r, "not a directory")


def test_help(cli_env: dict[str, str]) -> None:
    r = kscope("--help", env=cli_env)
    assert r.returncode == 0
    for cmd in ("jobs", "traces", "catalog"):
        assert cmd in r.stdout


def test_import_with_store_option_to_s3(
    tmp_path: Path, cli_env: dict[str, str], s3_bucket: str, moto_endpoint: str
) -> None:
    """The command `kscope trace --store` gives to retry a failed upload works as printed."""
    d = write_trace_dir(tmp_path / "out", make_manifest("kst-s3opt", hosts=("h",), ranks_per_host=1))
    env = {
        **cli_env,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_REGION": "us-east-1",
    }
    db = str(tmp_path / "c.db")
    r = kscope(
        "catalog",
        "import",
        str(d),
        "--catalog",
        db,
        "--store",
        f"s3://{s3_bucket}/p",
        "--store-option",
        f"endpoint_url={moto_endpoint}",
        "--json",
        env=env,
    )
    assert r.returncode == 0, r.stderr
    (t,) = orjson.loads(r.stdout)["imported"]
    assert t["store_url"] == f"s3://{s3_bucket}/p"
    assert t["file_list"][0]["storage_url"] == f"s3://{s3_bucket}/p/kst-s3opt/{t['file_list'][0]['file']}"
    r = kscope("traces", "--catalog", db, "--files", env=env)
    assert r.returncode == 0 and "kst-s3opt" in r.stdout and t["file_list"][0]["sha256"][:12] in r.stdout
    r = kscope("catalog", "import", str(d), "--catalog", db, "--store-option", "a=b", env=env)
    assert r.returncode == 2 and "--store-option only applies with --store" in r.stderr
