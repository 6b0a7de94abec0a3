"""Two kscope processes writing the same catalog at once (fresh database: they also race to
create the schema)."""

from __future__ import annotations

import contextlib
import os
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from kinetoscope.store.catalog import Catalog

from .conftest import REPO_ROOT

WRITER = r"""
import os, sys, time
import pytest

from kinetoscope.store.catalog import Catalog

url, who, n, go = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
open(go + "." + who + ".ready", "w").close()
while not os.path.exists(go):
    time.sleep(0.005)
cat = Catalog.open(url)
for i in range(n):
    cat.record_trace_request({
        "kinetoscope_manifest": 1, "trace_id": f"kst-{who}-{i}", "created": f"2026-11-21T05:{i:02d}:00Z",
        "files": [{"file": f"rank-{r}_{i}.pt.trace.json", "host": f"host-{who}", "pid": 100 + r,
                   "rank": r, "world_size": 4, "job_id": "shared", "complete": True} for r in range(2)]})
    cat.record_trace_request({
        "kinetoscope_manifest": 1, "trace_id": "kst-shared",
        "files": [{"file": f"{who}-{i}.pt.trace.json", "host": f"host-{who}", "job_id": "shared",
                   "complete": True}]})
    cat.record_analysis(f"kst-{who}-{i}", {"summary": {"step_time_ms": float(i)}, "who": who})
cat.close()
print("done", who)
"""


def test_two_processes_record_at_once(catalog_url: str, tmp_path: Path) -> None:
    n = 12
    go = tmp_path / "go"
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", WRITER, catalog_url, who, str(n), str(go)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for who in ("a", "b")
    ]
    try:
        deadline = time.monotonic() + 120
        while not all(Path(f"{go}.{w}.ready").exists() for w in ("a", "b")):
            assert time.monotonic() < deadline, "writers did not start"
            assert all(p.poll() is None for p in procs), [p.communicate() for p in procs]
            time.sleep(0.02)
        go.touch()
        outs = [p.communicate(timeout=240) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err
        assert out.startswith("done")
    with Catalog.open(catalog_url) as cat:
        traces = cat.list_traces(limit=None)
        assert traces.height == 2 * n + 1
        shared = cat.get_trace_request("kst-shared")
        assert shared is not None and shared.file_count == 2 * n and shared.hosts == ["host-a", "host-b"]
        jobs = cat.list_jobs()
        assert jobs["job_id"].to_list() == ["shared"]
        assert jobs["hosts"][0].to_list() == ["host-a", "host-b"] and jobs["traces"][0] == 2 * n + 1
        assert cat.list_trace_files(job_id="shared").height == 2 * (2 * n) + 2 * n
        assert cat.list_analyses(limit=None).height == 2 * n


def test_open_waits_for_a_writer_holding_a_fresh_rollback_mode_catalog(tmp_path: Path) -> None:
    """A catalog file still in rollback mode, write-locked by another connection: switching it to
    WAL fails at once with SQLITE_BUSY (SQLite skips the busy handler for that lock upgrade), so
    ``Catalog.open`` must wait for the lock instead of failing (this failed CI under load)."""
    db = tmp_path / "catalog.db"
    holder = sqlite3.connect(db, isolation_level=None, check_same_thread=False)
    holder.execute("CREATE TABLE other_tool(i INTEGER)")
    holder.execute("BEGIN IMMEDIATE")
    holder.execute("INSERT INTO other_tool VALUES (1)")
    with contextlib.closing(sqlite3.connect(db, isolation_level=None)) as probe:
        with pytest.raises(sqlite3.OperationalError, match="locked"):
            probe.execute("PRAGMA busy_timeout = 5000")
            probe.execute("PRAGMA journal_mode = WAL")  # the SQLite behaviour this test relies on
    release = threading.Timer(0.4, lambda: holder.execute("COMMIT"))
    release.start()
    try:
        with Catalog.open(str(db)) as cat:
            with cat.engine.connect() as conn:
                assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
            assert cat.list_traces(limit=None).height == 0
    finally:
        release.join()
        holder.close()
    assert sqlite3.connect(db).execute("SELECT count(*) FROM other_tool").fetchone() == (1,)
