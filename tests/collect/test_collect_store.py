"""`kscope trace --store` / catalog recording end to end, with real parts: a real `kscope daemon`
subprocess, a real CPU PyTorch process (KINETO_USE_DAEMON=1) that Kineto traces, moto's real S3
API server on loopback, and the real CLI as subprocesses."""

from __future__ import annotations

import hashlib
from pathlib import Path

import orjson
import pytest

from kinetoscope.protocol.manifest import load_trace_dir
from tests.fixtures_s3 import s3_client

pytestmark = pytest.mark.torch


def _json(r) -> dict:
    assert r.stdout.strip(), r.stderr
    return orjson.loads(r.stdout)


def test_trace_store_s3_then_catalog_lists_it(
    single_torch_job, run_kscope, s3_bucket, s3_env, moto_endpoint, tmp_path
):
    daemon, _job, pid = single_torch_job
    db = tmp_path / "kscope.db"
    store = f"s3://{s3_bucket}/fleet/traces"
    r = run_kscope(
        "trace",
        "--host",
        str(daemon.address),
        "--pids",
        str(pid),
        "--duration-ms",
        "100",
        "--wait",
        "--timeout",
        "60",
        "--store",
        store,
        "--catalog",
        str(db),
        "--json",
        env=s3_env,
        timeout=180,
    )
    assert r.returncode == 0, r.stderr
    doc = _json(r)
    assert doc["errors"] == [] and doc["store_url"] == store and doc["catalog"] == f"sqlite:///{db}"
    trace_id = doc["trace_id"]
    (f,) = doc["files"]
    local = Path(f["path"])
    data = local.read_bytes()
    sha = hashlib.sha256(data).hexdigest()
    names = [o["key"].rsplit("/", 1)[-1] for o in doc["stored"]]
    assert names[0] == local.name and names[-1] == "manifest.json"  # the manifest (commit marker) last
    assert any(n.startswith("manifest.") and n != "manifest.json" for n in names)  # the daemon's own
    first = doc["stored"][0]
    assert set(first) >= {"url", "bytes", "sha256", "key"}
    assert first == {
        **first,
        "url": f"{store}/{trace_id}/{local.name}",
        "key": f"{trace_id}/{local.name}",
        "bytes": len(data),
        "sha256": sha,
    }
    # the bytes in S3 are the local file's
    obj = s3_client(moto_endpoint).get_object(Bucket=s3_bucket, Key=f"fleet/traces/{trace_id}/{local.name}")
    assert obj["Body"].read() == data
    # the local manifest now says where each file is stored
    (entry,) = load_trace_dir(local.parent)["files"]
    assert (entry["sha256"], entry["url"], entry["complete"]) == (sha, first["url"], True)

    r = run_kscope("traces", "--catalog", str(db), "--json", "--files")
    assert r.returncode == 0, r.stderr
    (t,) = _json(r)["traces"]
    assert (t["trace_id"], t["status"], t["store_url"], t["files"], t["complete_files"]) == (
        trace_id,
        "complete",
        store,
        1,
        1,
    )
    assert t["requested_by"] and t["bytes"] == len(data)
    (cf,) = t["file_list"]
    assert (cf["file"], cf["sha256"], cf["storage_url"], cf["bytes"], cf["pid"]) == (
        local.name,
        sha,
        first["url"],
        len(data),
        pid,
    )
    r = run_kscope("catalog", "show", trace_id, "--catalog", str(db))
    assert r.returncode == 0 and first["url"] in " ".join(r.stdout.split()), r.stdout


def test_unreachable_store_keeps_local_files_and_fails(
    single_torch_job, run_kscope, s3_env, free_port, tmp_path
):
    """--output-dir s3://... is used as the store; its endpoint refuses connections."""
    daemon, _job, pid = single_torch_job
    db = tmp_path / "kscope.db"
    bad = f"http://127.0.0.1:{free_port}"
    r = run_kscope(
        "trace",
        "--host",
        str(daemon.address),
        "--pids",
        str(pid),
        "--duration-ms",
        "100",
        "--timeout",
        "60",
        "--output-dir",
        "s3://nowhere-bucket/x",
        "--store-option",
        f"endpoint_url={bad}",
        "--catalog",
        str(db),
        "--json",
        env=s3_env,
        timeout=240,
    )
    assert r.returncode == 1, r.stderr
    doc = _json(r)
    assert doc["waited"] is True and doc["stored"] == []
    assert any("--output-dir s3://nowhere-bucket/x" in n and "as --store" in n for n in doc["notes"])
    (err,) = doc["errors"]
    (f,) = doc["files"]
    name = Path(f["path"]).name
    assert err["kind"] == "store" and f["complete"] is True
    assert "s3://nowhere-bucket/x" in err["message"] and name in err["message"], err["message"]
    assert "kept in" in err["message"] and "kscope catalog import" in err["message"]
    assert f"--store-option endpoint_url={bad}" in err["message"]  # the retry command works as given
    flat = " ".join(r.stderr.split())
    assert "error: storing trace" in flat and "Traceback" not in r.stderr
    # nothing collected is lost: the file is there, whole, in the daemon's trace root
    assert Path(f["path"]).is_file() and Path(f["path"]).stat().st_size == f["bytes"]
    assert Path(f["path"]).parent.parent == Path(daemon.trace_root)
    # the catalog knows the request: its upload stopped (partial, 0 of 1 stored), nothing in the store
    r = run_kscope("traces", "--catalog", str(db), "--json")
    (t,) = _json(r)["traces"]
    assert (t["trace_id"], t["status"], t["store_url"]) == (doc["trace_id"], "partial", None)


def test_local_store_implies_wait_and_no_catalog(single_torch_job, run_kscope, tmp_path, private_catalog):
    daemon, _job, pid = single_torch_job
    store = tmp_path / "nfs" / "traces"
    r = run_kscope(
        "trace",
        "--host",
        str(daemon.address),
        "--pids",
        str(pid),
        "--duration-ms",
        "100",
        "--timeout",
        "60",
        "--store",
        str(store),
        "--no-catalog",
        timeout=180,
    )
    assert r.returncode == 0, r.stderr
    out = " ".join(r.stdout.split())
    assert "--store waits for the trace files" in " ".join(r.stderr.split())
    assert f"stored in {store}" in out and "recorded in catalog" not in out
    (req,) = [p for p in store.iterdir() if p.is_dir()]
    files = sorted(p.name for p in req.iterdir())
    assert "manifest.json" in files and any(n.endswith(".pt.trace.json") for n in files)
    trace = next(req.glob("*.pt.trace.json"))
    stored_sha = hashlib.sha256(trace.read_bytes()).hexdigest()
    assert stored_sha in out  # each stored object is printed with its sha256
    local = Path(load_trace_dir(req)["files"][0]["path"])
    assert local.read_bytes() == trace.read_bytes()
    assert not private_catalog.exists()  # --no-catalog: nothing recorded anywhere
