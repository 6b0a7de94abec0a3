"""Fixtures for storage and catalog tests: a throwaway PostgreSQL cluster, catalog URLs parametrised
over SQLite and PostgreSQL, manifests. The real S3 API server (moto) on loopback is in
tests/fixtures_s3.py, shared with the collection tests."""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]


# S3 (moto) fixtures are shared with the collection tests: tests/fixtures_s3.py (a plugin loaded by
# tests/conftest.py). ``s3_client`` and ``S3_CREDS`` stay importable from here.
from tests.fixtures_s3 import S3_CREDS, s3_client  # noqa: E402,F401


# --------------------------------------------------------------------------------- PostgreSQL
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _pg_bindir() -> Path | None:
    cands = sorted(
        glob.glob("/usr/lib/postgresql/*/bin"),
        key=lambda p: int(p.split("/")[-2]) if p.split("/")[-2].isdigit() else 0,
    )
    for d in reversed(cands):
        if Path(d, "initdb").exists() and Path(d, "pg_ctl").exists():
            return Path(d)
    initdb = shutil.which("initdb")
    return Path(initdb).parent if initdb and shutil.which("pg_ctl") else None


@pytest.fixture(scope="session")
def pg_server() -> Iterator[str]:
    """URL of a PostgreSQL server: ``$KSCOPE_TEST_POSTGRES_URL`` or a throwaway cluster started
    here (as the ``postgres`` user when we are root) and always stopped afterwards."""
    pytest.importorskip("psycopg", reason="psycopg not installed (pip install 'kinetoscope[postgres]')")
    external = os.environ.get("KSCOPE_TEST_POSTGRES_URL")
    if external:
        yield external
        return
    bindir = _pg_bindir()
    if bindir is None:
        pytest.skip(
            "PostgreSQL server binaries not found: apt-get install postgresql "
            "(scripts/setup-test-system.sh) or set KSCOPE_TEST_POSTGRES_URL"
        )
    run_as: list[str] = []
    owner = None
    if os.geteuid() == 0:
        try:
            owner = pwd.getpwnam("postgres")
        except KeyError:
            pytest.skip("running as root and there is no 'postgres' user to run the PostgreSQL server as")
        run_as = (
            ["runuser", "-u", "postgres", "--"]
            if shutil.which("runuser")
            else ["su", "postgres", "-s", "/bin/sh", "-c"]
        )
    tmp = Path(tempfile.mkdtemp(prefix="kscope-pg-"))
    if owner is not None:
        os.chown(tmp, owner.pw_uid, owner.pw_gid)

    def run(*cmd: str) -> subprocess.CompletedProcess[str]:
        full = (
            [*run_as, *cmd]
            if run_as and run_as[0] == "runuser"
            else ([*run_as, " ".join(cmd)] if run_as else list(cmd))
        )
        return subprocess.run(full, capture_output=True, text=True, timeout=120)

    data, log = tmp / "data", tmp / "server.log"
    port = _free_port()
    started = False
    try:
        r = run(
            str(bindir / "initdb"),
            "-D",
            str(data),
            "-U",
            "postgres",
            "--auth=trust",
            "-E",
            "UTF8",
            "--no-sync",
            "--no-instructions",
        )
        if r.returncode != 0:
            raise RuntimeError(f"initdb failed: {r.stderr.strip()[-2000:]}")
        opts = (
            f"-p {port} -k {tmp} -c listen_addresses=127.0.0.1 -c fsync=off -c full_page_writes=off "
            f"-c synchronous_commit=off -c max_connections=40 -c shared_buffers=16MB"
        )
        r = run(
            str(bindir / "pg_ctl"), "-D", str(data), "-l", str(log), "-w", "-t", "60", "-o", opts, "start"
        )
        started = True
        if r.returncode != 0:
            tail = log.read_text(errors="replace")[-2000:] if log.exists() else r.stderr
            raise RuntimeError(f"pg_ctl start failed: {tail}")
        yield f"postgresql://postgres@127.0.0.1:{port}/postgres"
    finally:
        if started:
            run(str(bindir / "pg_ctl"), "-D", str(data), "-m", "immediate", "-w", "stop")
        shutil.rmtree(tmp, ignore_errors=True)


@pytest.fixture()
def pg_url(pg_server: str) -> Iterator[str]:
    """A fresh, empty database on the test server (dropped afterwards)."""
    import psycopg

    name = f"kscope_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(pg_server.replace("postgresql+psycopg://", "postgresql://"), autocommit=True) as c:
        c.execute(f'CREATE DATABASE "{name}"')
    base, _, _ = pg_server.rpartition("/")
    try:
        yield f"{base}/{name}"
    finally:
        with psycopg.connect(pg_server, autocommit=True) as c:
            c.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def catalog_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """The same tests on SQLite (a file in tmp) and PostgreSQL (a fresh database)."""
    if request.param == "sqlite":
        return str(tmp_path / "catalog.db")
    return request.getfixturevalue("pg_url")


# ---------------------------------------------------------------------------------- manifests
def make_manifest(
    trace_id: str = "kst-20261121-053012-3f9a",
    *,
    job_id: str | None = "123",
    hosts: tuple[str, ...] = ("node07", "node08"),
    ranks_per_host: int = 2,
    created: str = "2026-11-21T05:30:12Z",
    complete: bool | None = True,
    out_dir: str = "/tmp/kinetoscope/traces",
) -> dict[str, Any]:
    files = []
    world = len(hosts) * ranks_per_host
    for h, host in enumerate(hosts):
        for lr in range(ranks_per_host):
            rank = h * ranks_per_host + lr
            pid = 4000 + rank
            name = f"rank-{rank}_{pid}.pt.trace.json"
            entry: dict[str, Any] = {
                "file": name,
                "path": f"{out_dir}/{trace_id}/{name}",
                "host": host,
                "pid": pid,
                "rank": rank,
                "local_rank": lr,
                "world_size": world,
                "job_id": job_id,
                "cmdline": "python train.py --epochs 3",
                "bytes": 1000 + rank,
            }
            if complete is not None:
                entry["complete"] = complete
            files.append(entry)
    return {
        "kinetoscope_manifest": 1,
        "trace_id": trace_id,
        "created": created,
        "config": "ACTIVITIES_ITERATIONS=10\nPROFILE_START_ITERATION_ROUNDUP=1\n",
        "files": files,
    }


def write_trace_dir(root: Path, manifest: dict[str, Any], *, payload: bytes | None = None) -> Path:
    """A request folder like the daemon writes: trace files + manifest.json."""
    import orjson

    d = root / manifest["trace_id"]
    d.mkdir(parents=True, exist_ok=True)
    for e in manifest["files"]:
        body = (
            payload
            if payload is not None
            else (b'{"traceEvents": [], "distributedInfo": {"rank": %d}}' % (e.get("rank") or 0))
        )
        (d / e["file"]).write_bytes(body)
        e["path"] = str(d / e["file"])
        e["bytes"] = len(body)
    (d / "manifest.json").write_bytes(orjson.dumps(manifest, option=orjson.OPT_INDENT_2))
    return d


@pytest.fixture()
def cli_env(tmp_path: Path) -> dict[str, str]:
    """Environment for `python -m kinetoscope.cli.main` subprocesses: the checkout on
    PYTHONPATH, a private HOME, no inherited catalog."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KSCOPE_", "AWS_"))}
    home = tmp_path / "home"
    home.mkdir()
    env.update(PYTHONPATH=str(REPO_ROOT), HOME=str(home), COLUMNS="200", NO_COLOR="1")
    return env
