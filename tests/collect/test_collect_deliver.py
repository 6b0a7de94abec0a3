"""`kscope trace --store/--catalog` flow and the `kinetoscope.collect.deliver` library against a tiny
real RPC server standing in for the daemon (fast; the real daemon + PyTorch + S3 run is in
test_collect_store.py)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import orjson
import pytest

from kinetoscope.collect.client import parse_hosts
from kinetoscope.collect.deliver import parse_store_options, record_trace_result, store_trace_result
from kinetoscope.collect.trigger import Target, TraceOptions, TraceRequest, trigger_trace, wait_for_trace
from kinetoscope.errors import UsageError
from kinetoscope.store.catalog import Catalog

TRACE_ID = "kst-fake-1"
# one event: an empty trace is named as such and exits 3 (docs/collect.md), which is not what these tests are about
BODY = b'{"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "aten::add", "pid": 42, "tid": 42, "ts": 1, "dur": 2}], "trace_id": "kst-fake-1"}\n'


@pytest.fixture()
def fake_daemon(rpc_server, tmp_path):
    """A daemon that traces pid 42 (rank 0 of job 7) into <root>/<trace_id>/; the file is already
    written (by the test), so the first status call reports it complete."""
    root = tmp_path / "traces"

    def path(req) -> str:
        return str(root / req["trace_id"] / "rank-0_42.pt.trace.json")

    def trace(req):
        p = Path(path(req))
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(BODY)
        return {
            "hostname": "n1",
            "trace_id": req["trace_id"],
            "output_dir": str(root),
            "config": "ACTIVITIES_DURATION_MSECS=100",
            "matched": [
                {
                    "pid": 42,
                    "rank": 0,
                    "local_rank": 0,
                    "world_size": 1,
                    "job_id": "7",
                    "cmdline": "python train.py",
                    "path": path(req),
                    "triggered": True,
                }
            ],
        }

    def status(req):
        return {
            "hostname": "n1",
            "files": [
                {
                    "pid": 42,
                    "rank": 0,
                    "path": path(req),
                    "exists": True,
                    "bytes": len(BODY),
                    "complete": True,
                    "delivered": True,
                    "alive": True,
                }
            ],
        }

    srv = rpc_server({"kscopeTrace": trace, "kscopeTraceStatus": status})
    srv.root = root
    return srv


def test_store_option_parsing():
    assert parse_store_options(["endpoint_url=http://h:9000", "anon=true", "x=3", "k=a=b"]) == {
        "endpoint_url": "http://h:9000",
        "anon": True,
        "x": 3,
        "k": "a=b",
    }
    with pytest.raises(UsageError, match="KEY=VALUE"):
        parse_store_options(["nothing"])


@pytest.mark.parametrize(
    "args, message",
    [
        (["--store-option", "a=b"], "--store-option only applies with --store"),
        (["--store", "/tmp/x", "--store-option", "oops"], "expected KEY=VALUE"),
        (["--catalog", "/tmp/c.db", "--no-catalog"], "--catalog and --no-catalog contradict"),
        (["--output-dir", "s3://b/one", "--store", "s3://b/two"], "names another one (s3://b/two)"),
        (["--store", "s3://"], "--store s3://: S3 URL has no bucket"),
    ],
)
def test_usage_errors(kscope_main, args, message):
    code, _out, err = kscope_main("trace", "--all", "--duration-ms", "5", *args)
    assert code == 2 and message in " ".join(err.split()) and "Traceback" not in err


def test_local_store_and_catalog(kscope_main, fake_daemon, tmp_path, private_catalog):
    store = tmp_path / "nfs" / "store"
    code, out, err = kscope_main(
        "trace",
        "-H",
        fake_daemon.address,
        "--pids",
        "42",
        "--duration-ms",
        "100",
        "--trace-id",
        TRACE_ID,
        "--store",
        str(store),
        "--json",
    )
    assert code == 0, err
    doc = orjson.loads(out)
    assert doc["errors"] == [] and doc["waited"] is True and doc["store_url"] == str(store)
    assert "--store waits for the trace files" in " ".join(err.split())
    sha = hashlib.sha256(BODY).hexdigest()
    assert [(o["key"], o["bytes"]) for o in doc["stored"]][0] == (
        f"{TRACE_ID}/rank-0_42.pt.trace.json",
        len(BODY),
    )
    assert doc["stored"][0]["sha256"] == sha and doc["stored"][0]["url"] == str(
        store / TRACE_ID / "rank-0_42.pt.trace.json"
    )
    assert doc["stored"][-1]["key"] == f"{TRACE_ID}/manifest.json"
    assert (store / TRACE_ID / "rank-0_42.pt.trace.json").read_bytes() == BODY
    # recorded ($KSCOPE_CATALOG): the second recording filled in sha256, storage URL, completeness
    assert doc["catalog"] == f"sqlite:///{private_catalog}"
    with Catalog.open(str(private_catalog)) as cat:
        rec = cat.get_trace_request(TRACE_ID)
    assert rec is not None and rec.status == "complete" and rec.store_url == str(store)
    assert rec.requested_by and "@" in rec.requested_by and rec.job_ids == ["7"]
    assert rec.hosts == ["n1"]  # the daemon's host name, not its address
    (f,) = rec.files
    assert (f.sha256, f.storage_url, f.bytes, f.complete, f.rank) == (
        sha,
        doc["stored"][0]["url"],
        len(BODY),
        True,
        0,
    )


def test_human_output_lists_stored_objects(kscope_main, fake_daemon, tmp_path):
    store = tmp_path / "store"
    code, out, err = kscope_main(
        "trace",
        "-H",
        fake_daemon.address,
        "--pids",
        "42",
        "--duration-ms",
        "100",
        "--trace-id",
        TRACE_ID,
        "--wait",
        "--store",
        str(store),
    )
    assert code == 0, err
    flat = " ".join(out.split())
    assert f"stored in {store}" in flat and hashlib.sha256(BODY).hexdigest() in flat
    assert f"{store}/{TRACE_ID}/manifest.json" in flat and "recorded in catalog sqlite:///" in flat


def test_catalog_failure_is_a_warning(kscope_main, fake_daemon, tmp_path):
    bad = tmp_path / "no" / "such" / "dir" / "c.db"
    code, out, err = kscope_main(
        "trace",
        "-H",
        fake_daemon.address,
        "--pids",
        "42",
        "--duration-ms",
        "100",
        "--wait",
        "--catalog",
        str(bad),
        "--json",
    )
    assert code == 0, err
    doc = orjson.loads(out)
    assert doc["errors"] == [] and doc["catalog"] is None
    (note,) = [n for n in doc["notes"] if n.startswith("catalog:")]
    assert "could not record trace" in note and "does not exist" in note
    assert "warning: catalog: could not record" in " ".join(err.split())


def test_no_catalog_records_nothing(kscope_main, fake_daemon, private_catalog):
    code, out, err = kscope_main(
        "trace",
        "-H",
        fake_daemon.address,
        "--pids",
        "42",
        "--duration-ms",
        "100",
        "--wait",
        "--no-catalog",
        "--json",
    )
    assert code == 0, err
    assert orjson.loads(out)["catalog"] is None and not private_catalog.exists()


def test_store_failure_keeps_files(kscope_main, fake_daemon, tmp_path, private_catalog):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where the store folder should be")
    code, out, err = kscope_main(
        "trace",
        "-H",
        fake_daemon.address,
        "--pids",
        "42",
        "--duration-ms",
        "100",
        "--trace-id",
        TRACE_ID,
        "--store",
        str(blocker),
        "--json",
    )
    assert code == 1
    doc = orjson.loads(out)
    (e,) = doc["errors"]
    local = fake_daemon.root / TRACE_ID / "rank-0_42.pt.trace.json"
    assert e["kind"] == "store" and str(blocker) in e["message"] and "kept in" in e["message"]
    assert f"kscope catalog import {local.parent} --store {blocker}" in e["message"]
    assert doc["stored"] == [] and local.read_bytes() == BODY
    assert "error: storing trace" in " ".join(err.split()) and "Traceback" not in err
    with Catalog.open(str(private_catalog)) as cat:  # recorded all the same, as not (all) stored
        rec = cat.get_trace_request(TRACE_ID)
    assert rec is not None and rec.status == "partial" and rec.store_url is None
    assert rec.manifest["store_error"].startswith("0 of 1 files stored: ")


def test_library_records_request_then_fills_it_in(fake_daemon, tmp_path):
    db = str(tmp_path / "lib.db")
    res = trigger_trace(
        TraceRequest(parse_hosts([fake_daemon.address]), Target(pids=(42,)), TraceOptions(duration_ms=100))
    )
    assert res.ok and res.files
    rec = record_trace_result(res, db)
    assert rec is not None and rec.status == "requested" and rec.files[0].sha256 is None
    res = wait_for_trace(res, timeout=10)
    objs = store_trace_result(res, str(tmp_path / "store"))
    assert res.ok and objs and res.stored == objs
    rec = record_trace_result(res, db)
    assert rec is not None and rec.status == "complete" and rec.trace_id == res.trace_id
    assert rec.files[0].sha256 == hashlib.sha256(BODY).hexdigest() and rec.store_url == str(
        tmp_path / "store"
    )
    assert res.catalog == f"sqlite:///{db}"


def test_library_store_names_files_not_on_this_machine(fake_daemon, tmp_path):
    res = trigger_trace(
        TraceRequest(parse_hosts([fake_daemon.address]), Target(pids=(42,)), TraceOptions(duration_ms=100))
    )
    res = wait_for_trace(res, timeout=10)
    Path(res.files[0].path).unlink()  # as if the file were on another host's local disk
    assert store_trace_result(res, str(tmp_path / "store"))[-1].key.endswith("manifest.json")
    (e,) = res.errors
    assert (
        e.kind == "store"
        and "rank-0_42.pt.trace.json (host n1)" in e.message
        and "not on this machine" in e.message
    )


def test_a_store_that_fills_up_records_the_request_as_partial(
    kscope_main, fake_daemon, tmp_path, private_catalog, monkeypatch
):
    """Regression (issue 32 follow-up): ``kscope trace --store`` stopping part-way (disk full)
    gave a plain error and the catalog said ``complete``. Now the request is recorded as
    ``partial`` with the reason (as ``catalog import --store``), and the command exits 1 with one
    error line naming the cause and the command that finishes it."""
    import errno

    from kinetoscope.store import storage

    def disk_full(self, src, key, expected, skip_identical):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(storage._LocalBackend, "put", disk_full)
    store = tmp_path / "store"
    code, out, err = kscope_main(
        "trace", "-H", fake_daemon.address, "--pids", "42", "--duration-ms", "100",
        "--trace-id", TRACE_ID, "--store", str(store),
    )  # fmt: skip
    assert code == 1 and "Traceback" not in err
    lines = [ln for ln in err.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1 and "stopped part-way" in " ".join(err.split()), err
    text = " ".join(err.split())
    assert "0 of 1 files stored" in text and "No space left on device" in text
    assert f"kscope catalog import {fake_daemon.root / TRACE_ID} --store {store}" in text
    with Catalog.open(str(private_catalog)) as cat:
        rec = cat.get_trace_request(TRACE_ID)
    assert rec is not None and rec.status == "partial", rec
    assert "0 of 1 files stored" in rec.manifest["store_error"]
    assert not (store / TRACE_ID / "manifest.json").exists()


def test_the_workflow_runs_every_step_and_tells_each(fake_daemon, tmp_path):
    """collect/workflow.py: trigger -> record -> wait -> store -> record, one event per step, and
    the same catalog record as the steps called one by one (the test above)."""
    from kinetoscope.collect import workflow as wf

    db = str(tmp_path / "wf.db")
    events: list[object] = []
    delivery = wf.Delivery(
        wait=True, timeout_s=10, store=str(tmp_path / "store"), record=True, record_requested=True, catalog=db
    )
    request = TraceRequest(
        parse_hosts([fake_daemon.address]), Target(pids=(42,)), TraceOptions(duration_ms=100)
    )
    res = wf.run_trace(request, delivery, events.append)
    kinds = [type(e).__name__ for e in events]
    assert kinds[:3] == ["Triggering", "HostAnswered", "Triggered"]
    assert kinds[3:] == ["Recorded", *["Waiting"] * (len(kinds) - 7), "Waited", "Storing", "Recorded"]
    first, last = (e for e in events if isinstance(e, wf.Recorded))
    assert not first.final and first.record.status == "requested"
    assert (
        last.final and last.record.status == "complete" and last.record.store_url == str(tmp_path / "store")
    )
    assert res.ok and res.stored and res.catalog == f"sqlite:///{db}"
    assert last.record.files[0].sha256 == hashlib.sha256(BODY).hexdigest()
