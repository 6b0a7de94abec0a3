"""A `kscope trace --store` killed while it waits leaves its catalog row "requested"; the next
`kscope trace` of this host marks it "abandoned" (its waiter's pid and start time are gone).

The CLI runs as real subprocesses against a small real RPC server answering like a daemon whose
process never writes its file (so the first run waits until it is killed)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

from kinetoscope.store.catalog import Catalog
from tests.collect.test_collect_trigger import fake_daemon

REPO_ROOT = Path(__file__).resolve().parents[2]


def status_of(db: Path, trace_id: str) -> str | None:
    with Catalog.open(str(db)) as cat:
        rec = cat.get_trace_request(trace_id)
        return rec.status if rec else None


def trace_argv(address: str, db: Path, trace_id: str, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "kinetoscope.cli.main",
        "trace",
        "--host",
        address,
        "--pids",
        "11",
        "--duration-ms",
        "100",
        "--trace-id",
        trace_id,
        "--catalog",
        str(db),
        *extra,
    ]


def test_killed_store_run_is_marked_abandoned_by_the_next_run(rpc_server, tmp_path, run_kscope):
    # the file never appears and the process stays alive: `--store` waits (up to its timeout)
    srv = fake_daemon(
        rpc_server, "node-a", tmp_path, [{"pid": 11, "rank": 0, "job_id": "0"}], {11: {"delivered": False}}
    )
    db = tmp_path / "catalog.db"
    waiter = subprocess.Popen(
        trace_argv(srv.address, db, "kst-killed", "--store", str(tmp_path / "store"), "--timeout", "300"),
        cwd=REPO_ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 120
        while (db.exists() and status_of(db, "kst-killed")) != "requested":
            assert waiter.poll() is None, waiter.communicate()
            assert time.monotonic() < deadline, "the request was never recorded"
            time.sleep(0.2)
        waiter.send_signal(signal.SIGKILL)
        waiter.wait(timeout=30)
    finally:
        if waiter.poll() is None:
            waiter.kill()
        waiter.communicate()
    assert status_of(db, "kst-killed") == "requested"  # what the killed run left behind

    # the next run (no --wait: its own row stays "requested", legitimately) marks the killed one
    r = run_kscope(*trace_argv(srv.address, db, "kst-next")[3:])
    assert r.returncode == 0, r.stderr
    flat = " ".join(r.stderr.split())
    assert (
        "catalog: marked 1 earlier request(s) abandoned (kst-killed): the `kscope trace` that waited for "
        "them was killed before it recorded their outcome" in flat
    )
    assert status_of(db, "kst-killed") == "abandoned"
    assert status_of(db, "kst-next") == "requested"

    # a request nobody waits for is not abandoned: a third run leaves it alone
    r = run_kscope(*trace_argv(srv.address, db, "kst-third")[3:])
    assert r.returncode == 0, r.stderr
    assert "abandoned" not in r.stderr
    assert status_of(db, "kst-next") == "requested"
    with Catalog.open(str(db)) as cat:
        rec = cat.get_trace_request("kst-killed")
        assert rec is not None and rec.manifest["abandoned_waiter"]["host"]
