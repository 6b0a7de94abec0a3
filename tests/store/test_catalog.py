"""Catalog CRUD and listing, the same tests on SQLite and PostgreSQL."""

from __future__ import annotations

import math
from datetime import datetime, timezone
from pathlib import Path

import polars as pl
import pytest

from kinetoscope.protocol.manifest import ManifestError
from kinetoscope.store.catalog import (
    ANALYSES_SCHEMA,
    JOBS_SCHEMA,
    TRACE_FILES_SCHEMA,
    TRACES_SCHEMA,
    Catalog,
    CatalogError,
    resolve_catalog_url,
)
from kinetoscope.store.storage import TraceStore
from kinetoscope.store.upload import upload_trace_request

from .conftest import make_manifest, write_trace_dir


def test_empty_catalog_lists(catalog_url: str) -> None:
    with Catalog.open(catalog_url) as cat:
        assert cat.list_jobs().schema == pl.Schema(JOBS_SCHEMA) and cat.list_jobs().height == 0
        assert cat.list_traces().schema == pl.Schema(TRACES_SCHEMA)
        assert cat.list_trace_files().schema == pl.Schema(TRACE_FILES_SCHEMA)
        assert cat.list_analyses().schema == pl.Schema(ANALYSES_SCHEMA)
        assert cat.get_trace_request("nope") is None and cat.get_analysis(1) is None


def test_record_and_list(catalog_url: str) -> None:
    with Catalog.open(catalog_url) as cat:
        m1 = make_manifest("kst-a", job_id="123", hosts=("node07", "node08"), created="2026-11-21T05:30:12Z")
        m1["requested_by"] = "alice"
        rec = cat.record_trace_request(m1, store_urls="s3://bucket/traces")
        assert rec.status == "complete" and rec.file_count == 4 and rec.complete_files == 4
        assert rec.hosts == ["node07", "node08"] and rec.job_ids == ["123"] and rec.requested_by == "alice"
        assert rec.created == datetime(2026, 11, 21, 5, 30, 12, tzinfo=timezone.utc)
        assert rec.total_bytes == sum(1000 + r for r in range(4))
        assert rec.store_url == "s3://bucket/traces"
        f0 = rec.files[0]
        assert (f0.rank, f0.host, f0.pid, f0.job_id, f0.iterations) == (0, "node07", 4000, "123", 10)
        assert f0.storage_url == "s3://bucket/traces/kst-a/rank-0_4000.pt.trace.json"
        assert rec.manifest["trace_id"] == "kst-a"

        m2 = make_manifest(
            "kst-b",
            job_id="123",
            hosts=("node09",),
            ranks_per_host=1,
            created="2026-11-22T01:00:00Z",
            complete=False,
        )
        m3 = make_manifest(
            "kst-c",
            job_id="999",
            hosts=("gpu1",),
            ranks_per_host=1,
            created="2026-11-20T01:00:00Z",
            complete=None,
        )
        assert cat.record_trace_request(m2).status == "incomplete"
        assert cat.record_trace_request(m3).status == "complete"

        jobs = cat.list_jobs()
        assert jobs["job_id"].to_list() == ["123", "999"]  # most recently seen first
        j = jobs.row(0, named=True)
        assert j["hosts"] == ["node07", "node08", "node09"] and j["traces"] == 2 and j["world_size"] == 4
        assert j["first_seen"] == datetime(2026, 11, 21, 5, 30, 12, tzinfo=timezone.utc)
        assert j["last_seen"] == datetime(2026, 11, 22, 1, 0, tzinfo=timezone.utc)
        assert j["cmdline"] == "python train.py --epochs 3"

        traces = cat.list_traces()
        assert traces["trace_id"].to_list() == ["kst-b", "kst-a", "kst-c"]  # newest first
        assert cat.list_traces(job_id="123")["trace_id"].to_list() == ["kst-b", "kst-a"]
        assert cat.list_traces(job_id="999")["trace_id"].to_list() == ["kst-c"]
        assert cat.list_traces(limit=1)["trace_id"].to_list() == ["kst-b"]
        assert cat.list_traces(status="incomplete")["trace_id"].to_list() == ["kst-b"]
        files = cat.list_trace_files(job_id="123")
        assert files.height == 5 and files.filter(pl.col("trace_id") == "kst-a")["rank"].to_list() == [
            0,
            1,
            2,
            3,
        ]


def test_upsert_is_idempotent_and_fills_in(catalog_url: str) -> None:
    with Catalog.open(catalog_url) as cat:
        m = make_manifest("kst-u", complete=False)
        first = cat.record_trace_request(m)
        assert first.status == "incomplete" and first.complete_files == 0
        again = cat.record_trace_request(m)
        assert again.file_count == 4 and again.recorded_at == first.recorded_at
        # later: files complete, uploaded (sha256 + url); a null never erases what is known
        for e in m["files"]:
            e.update(complete=True, sha256="ab" * 32, url=f"s3://b/{m['trace_id']}/{e['file']}")
            e["cmdline"] = None
        done = cat.record_trace_request(m)
        assert done.status == "complete" and done.complete_files == 4
        assert all(f.sha256 == "ab" * 32 and f.storage_url and f.cmdline for f in done.files)
        # a host manifest adds a file later
        extra = {
            "kinetoscope_manifest": 1,
            "trace_id": "kst-u",
            "files": [
                {
                    "file": "node09.pt.trace.json",
                    "host": "node09",
                    "pid": 7,
                    "job_id": "123",
                    "complete": True,
                }
            ],
        }
        more = cat.record_trace_request(extra)
        assert more.file_count == 5 and "node09" in more.hosts
        assert more.created == first.created and more.config == first.config  # kept from before
        assert cat.list_traces().height == 1 and cat.list_jobs()["hosts"][0].to_list()[-1] == "node09"
        assert cat.delete_trace_request("kst-u") and cat.get_trace_request("kst-u") is None


def test_store_objects_and_import_dir(catalog_url: str, tmp_path: Path) -> None:
    m = make_manifest("kst-s")
    d = write_trace_dir(tmp_path / "out", m)
    store = TraceStore(tmp_path / "store")
    objs = upload_trace_request(d, store)
    with Catalog.open(catalog_url) as cat:
        rec = cat.import_trace_dir(d)
        assert rec.store_url == store.url
        assert all(f.storage_url == store.url_for(f"kst-s/{f.file}") for f in rec.files)
        assert all(f.sha256 and f.path == str(d / f.file) for f in rec.files)
        # StoredObjects passed explicitly give the same result
        rec2 = cat.record_trace_request(m, store_urls=objs, base_dir=d)
        assert [f.storage_url for f in rec2.files] == [f.storage_url for f in rec.files]
        assert rec2.store_url == store.url


def test_analyses(catalog_url: str, tmp_path: Path) -> None:
    d = write_trace_dir(tmp_path, make_manifest("kst-an"))
    with Catalog.open(catalog_url) as cat:
        cat.import_trace_dir(d)
        doc = {
            "summary": {
                "step_time_ms": 123.5,
                "straggler_kind": "compute",
                "straggler_ranks": [3],
                "world_size": 4,
                "mfu": 0.41,
            },
            "temporal_breakdown": [{"rank": 0, "idle_time_pctg": 12.0, "x": math.nan}],
        }
        a = cat.record_analysis([d], doc, name="analyze", version="0.1.0")
        assert a.trace_id == "kst-an" and a.inputs == [str(d)]
        assert (a.step_time_ms, a.straggler_kind, a.straggler_rank, a.world_size) == (123.5, "compute", 3, 4)
        assert a.summary["mfu"] == 0.41
        assert a.document["temporal_breakdown"][0]["x"] is None  # NaN stored as JSON null
        assert cat.record_analysis([d], doc, name="analyze", version="0.1.0").id == a.id  # idempotent
        b = cat.record_analysis("kst-an", {"other": 1}, name="kernel_breakdown", summary={"step_time_ms": 99})
        c = cat.record_analysis([str(d / m["file"]) for m in make_manifest("kst-an")["files"][:2]], {"x": 1})
        assert b.trace_id == "kst-an" and c.trace_id == "kst-an"
        lst = cat.list_analyses(trace_id="kst-an")
        assert lst.height == 3 and set(lst["id"].to_list()) == {a.id, b.id, c.id}
        assert cat.list_analyses(name="kernel_breakdown")["step_time_ms"].to_list() == [99.0]
        got = cat.get_analysis(a.id)
        assert got is not None and got.document == a.document
        assert cat.latest_analysis("kst-an", name="analyze").id == c.id  # type: ignore[union-attr]
        free = cat.record_analysis(["/nowhere/trace.json"], {"y": 2})
        assert free.trace_id is None
        with pytest.raises(CatalogError, match="unknown trace id"):
            cat.record_analysis(["x"], {"y": 3}, trace_id="nope")


def test_bad_manifests_are_refused(catalog_url: str) -> None:
    with Catalog.open(catalog_url) as cat:
        for bad, msg in [
            ({"trace_id": "x"}, "not a Kinetoscope manifest"),
            ({"kinetoscope_manifest": 9, "trace_id": "x"}, "newer"),
            ({"kinetoscope_manifest": 1, "trace_id": "a/b"}, "trace_id"),
            ({"kinetoscope_manifest": 1, "trace_id": "x", "files": [{"file": "../y"}]}, "plain file name"),
            ({"kinetoscope_manifest": 1, "trace_id": "x", "files": [{"file": "y", "rank": "3"}]}, "integer"),
            ({"kinetoscope_manifest": 1, "trace_id": "x", "created": "yesterday"}, "ISO 8601"),
            ([1, 2], "JSON object"),
        ]:
            with pytest.raises(ManifestError, match=msg):
                cat.record_trace_request(bad)  # type: ignore[arg-type]
        assert cat.list_traces().height == 0


def test_catalog_url_resolution(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("KSCOPE_CATALOG", raising=False)
    assert resolve_catalog_url() == f"sqlite:///{tmp_path}/.kinetoscope/catalog.db"
    monkeypatch.setenv("KSCOPE_CATALOG", str(tmp_path / "env.db"))
    assert resolve_catalog_url() == f"sqlite:///{tmp_path}/env.db"
    assert resolve_catalog_url("postgresql://u:p@h/db") == "postgresql+psycopg://u:p@h/db"
    assert resolve_catalog_url("postgres://h/db") == "postgresql+psycopg://h/db"
    assert resolve_catalog_url("sqlite:////x/y.db") == "sqlite:////x/y.db"
    with Catalog.open() as cat:  # $KSCOPE_CATALOG
        assert cat.display_url == f"sqlite:///{tmp_path}/env.db"
        with cat.engine.connect() as c:
            assert c.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
    with pytest.raises(CatalogError, match="does not exist"):
        Catalog.open(str(tmp_path / "no" / "dir" / "c.db"))
    with pytest.raises(CatalogError, match=r"cannot open catalog .*:\*\*\*@"):
        Catalog.open("postgresql://u:secret@127.0.0.1:1/x")
