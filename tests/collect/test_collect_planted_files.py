"""Issue 32 (client part): what a traced process leaves at its trace path cannot make
``kscope trace --wait`` hang or ``kscope trace --store`` upload someone else's file.

A real in-process daemon; the "traced process" is registered over real IPC (this test's own
/proc) and its file is replaced by a FIFO or a symlink. Before the fix: ``--wait`` hung in
``open()`` on the FIFO (the daemon's status call too), and ``--store`` uploaded the operator's
0600 file a symlink pointed to, recorded ``complete``.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from kinetoscope.collect.client import parse_hosts
from kinetoscope.collect.deliver import record_trace_result, store_trace_result
from kinetoscope.collect.trigger import Target, TraceOptions, TraceRequest, trigger_trace, wait_for_trace
from kinetoscope.daemon.daemon import Daemon, DaemonOptions
from kinetoscope.store.catalog import Catalog

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "daemon"))
from daemon_helpers import IpcClient  # noqa: E402

SECRET = b'{"traceEvents": [], "password": "hunter2"}'


@pytest.fixture()
def live(tmp_path: Path) -> Iterator[tuple[Daemon, IpcClient]]:
    sockdir = tempfile.mkdtemp(prefix="ksp", dir="/tmp")
    d = Daemon(
        DaemonOptions(
            port=0, ipc_socket_dir=sockdir, trace_root=str(tmp_path / "traces"), metrics_port=None,
            hostname="planthost", gpu_metrics=False, rpc_timeout_s=2.0,
        )
    )  # fmt: skip
    d.start()
    c = IpcClient(d.ipc.endpoint.address, sockdir)
    try:
        assert c.poll([4242, 1], job_id=7) == ""
        yield d, c
    finally:
        c.close()
        d.stop()
        shutil.rmtree(sockdir, ignore_errors=True)


def _trigger(d: Daemon, c: IpcClient, trace_id: str):
    request = TraceRequest(
        tuple(parse_hosts([f"127.0.0.1:{d.rpc_port}"])), Target(all=True), TraceOptions(duration_ms=100),
        trace_id=trace_id,
    )  # fmt: skip
    result = trigger_trace(request)
    assert result.ok and len(result.files) == 1, result.errors
    assert "REQUEST_TRACE_ID" in (c.poll([4242, 1], job_id=7) or "")  # the process picks it up
    return result


@pytest.mark.timeout(120)
def test_wait_returns_at_once_when_a_fifo_is_planted(live):
    d, c = live
    result = _trigger(d, c, "fifo-wait")
    os.mkfifo(result.files[0].path)
    wait_for_trace(result, timeout=30, poll_interval=0.2)
    assert [p.kind for p in result.errors] == ["refused"]
    assert "not a regular file: fifo" in result.errors[0].message
    assert result.files[0].refused and not result.files[0].complete
    manifest = orjson.loads(Path(result.manifest_paths[0]).read_bytes())
    assert "fifo" in manifest["files"][0]["refused"]


@pytest.mark.timeout(120)
def test_cli_wait_with_a_fifo_planted_returns_within_its_timeout(live, run_kscope, tmp_path):
    """`kscope trace --wait --timeout 20` used to hang forever (the local check opened the FIFO)."""
    d, _c = live
    trace_dir = tmp_path / "traces" / "fifo-cli"
    trace_dir.mkdir(parents=True)
    os.mkfifo(trace_dir / "planthost_4242.pt.trace.json")
    proc = run_kscope(
        "trace", "--host", f"127.0.0.1:{d.rpc_port}", "--all", "--duration-ms", "100",
        "--trace-id", "fifo-cli", "--wait", "--timeout", "20", "--json", timeout=90,
    )  # fmt: skip
    assert proc.returncode != 0, proc.stdout + proc.stderr
    out = orjson.loads(proc.stdout)
    assert [e["kind"] for e in out["errors"]] == ["refused"], out["errors"]
    assert "Traceback" not in proc.stderr


@pytest.mark.timeout(120)
def test_store_never_uploads_what_a_planted_symlink_points_to(live, tmp_path, private_catalog):
    d, c = live
    secret = tmp_path / "operator-secret.json"
    secret.write_bytes(SECRET)
    secret.chmod(0o600)
    result = _trigger(d, c, "symlink-store")
    os.symlink(secret, result.files[0].path)
    wait_for_trace(result, timeout=30, poll_interval=0.2)
    assert [p.kind for p in result.errors] == ["refused"]
    store = tmp_path / "store"
    store_trace_result(result, str(store))
    stored = [p for p in store.rglob("*") if p.is_file()]
    assert all(b"hunter2" not in p.read_bytes() for p in stored if "manifest" not in p.name)
    assert not any(p.name.endswith(".pt.trace.json") for p in stored)
    assert any("symlink refused" in n for n in result.notes)
    rec = record_trace_result(result, str(private_catalog))
    assert rec is not None
    with Catalog.open(str(private_catalog)) as cat:
        got = cat.get_trace_request(result.trace_id)
        assert got is not None
        doc = got.manifest
    entry = doc["files"][0]
    assert entry["complete"] is False and "symlink refused" in entry["refused"]


@pytest.mark.timeout(120)
def test_store_refuses_a_file_swapped_for_a_symlink_after_its_check(live, tmp_path):
    """The file was complete when the daemon and the trigger checked it; the traced process then
    replaced it with a symlink to the operator's file: nothing is uploaded."""
    d, c = live
    secret = tmp_path / "operator-secret.json"
    secret.write_bytes(SECRET)
    secret.chmod(0o600)
    result = _trigger(d, c, "swap-store")
    path = Path(result.files[0].path)
    path.write_bytes(b'{"traceEvents": []}\n')
    wait_for_trace(result, timeout=30, poll_interval=0.2)
    assert result.ok and result.files[0].complete
    path.unlink()
    os.symlink(secret, path)
    store = tmp_path / "store"
    assert store_trace_result(result, str(store)) == []
    assert [p.kind for p in result.errors] == ["store"]
    assert "symlink refused" in result.errors[0].message
    assert not [p for p in store.rglob("*") if p.is_file() and b"hunter2" in p.read_bytes()]


@pytest.mark.timeout(120)
def test_store_refuses_a_planted_manifest_naming_a_file_elsewhere(live, tmp_path):
    """A traced process can write into its trace folder: a ``manifest.<x>.json`` it plants there
    naming an operator's file by ``path`` must not get that file uploaded."""
    d, c = live
    secret = tmp_path / "operator-secret.json"
    secret.write_bytes(SECRET)
    secret.chmod(0o600)
    result = _trigger(d, c, "manifest-store")
    Path(result.files[0].path).write_bytes(b'{"traceEvents": []}\n')
    wait_for_trace(result, timeout=30, poll_interval=0.2)
    assert result.ok
    planted = {
        "kinetoscope_manifest": 1,
        "trace_id": "manifest-store",
        "files": [{"file": "loot.pt.trace.json", "path": str(secret), "complete": True}],
    }
    (Path(result.files[0].path).parent / "manifest.evil.json").write_bytes(orjson.dumps(planted))
    store = tmp_path / "store"
    assert store_trace_result(result, str(store)) == []
    assert [p.kind for p in result.errors] == ["store"] and "outside" in result.errors[0].message
    assert not [p for p in store.rglob("*") if p.is_file() and b"hunter2" in p.read_bytes()]
