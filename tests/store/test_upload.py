"""upload_trace_request / download_trace_request: the API `kscope trace --store` and
`kscope analyze <store url>` use."""

from __future__ import annotations

import hashlib
from pathlib import Path

import orjson
import pytest

from kinetoscope.protocol.manifest import ManifestError, load_trace_dir
from kinetoscope.store.retry import RetryPolicy
from kinetoscope.store.storage import StoreError, TraceStore
from kinetoscope.store.upload import download_trace_request, split_request_url, upload_trace_request

from .conftest import make_manifest, write_trace_dir

FAST = RetryPolicy(attempts=3, base_delay=0.01, max_delay=0.02)


def _request(tmp_path: Path, **kw) -> Path:
    m = make_manifest(**kw)
    m["files"][-1]["complete"] = False  # the last rank's trace did not finish
    return write_trace_dir(tmp_path / "out", m)


def _check_uploaded(store: TraceStore, d: Path) -> None:
    trace_id = d.name
    local = orjson.loads((d / "manifest.json").read_bytes())
    complete = [e["file"] for e in local["files"] if e.get("complete") is not False]
    # every complete file + the manifest; the incomplete one stays local
    assert store.list(trace_id) == sorted(f"{trace_id}/{f}" for f in [*complete, "manifest.json"])
    remote = orjson.loads(store.read_bytes(f"{trace_id}/manifest.json"))
    assert remote == local and remote["store_url"] == store.url
    for e in remote["files"]:
        if e.get("complete") is False:
            assert "url" not in e and not store.exists(f"{trace_id}/{e['file']}")
            continue
        data = (d / e["file"]).read_bytes()
        assert e["sha256"] == hashlib.sha256(data).hexdigest() and e["bytes"] == len(data)
        assert e["url"] == store.url_for(f"{trace_id}/{e['file']}")
        assert store.read_bytes(f"{trace_id}/{e['file']}") == data


@pytest.mark.parametrize("backend", ["local", "s3"])
def test_upload_request_idempotent_and_download(
    tmp_path: Path, backend: str, request: pytest.FixtureRequest
) -> None:
    d = _request(tmp_path)
    if backend == "local":
        store = TraceStore(tmp_path / "store", retry=FAST)
    else:
        bucket = request.getfixturevalue("s3_bucket")
        store = TraceStore(
            f"s3://{bucket}/fleet", storage_options=request.getfixturevalue("s3_options"), retry=FAST
        )
    objs = upload_trace_request(d, store)
    assert [o.key.rsplit("/", 1)[-1] for o in objs][-1] == "manifest.json"
    assert len(objs) == 4  # 3 complete files + manifest
    assert all(o.uploaded for o in objs)
    _check_uploaded(store, d)
    again = upload_trace_request(d, store)  # a retry of the whole request
    assert [o.sha256 for o in again] == [o.sha256 for o in objs]
    assert not any(o.uploaded for o in again)

    trace_id = d.name
    base, tid = split_request_url(store.url_for(f"{trace_id}/manifest.json"))
    assert (base, tid) == (store.url, trace_id)
    got = download_trace_request(store, trace_id, tmp_path / "cache")
    assert got == tmp_path / "cache" / trace_id
    doc = load_trace_dir(got)
    for e in doc["files"]:
        if e.get("url"):
            assert (got / e["file"]).read_bytes() == (d / e["file"]).read_bytes()
            assert e["path"] == str(got / e["file"])
    assert not (got / doc["files"][-1]["file"]).exists()
    # downloading again keeps verified files
    download_trace_request(store, trace_id, tmp_path / "cache")


def test_upload_with_host_manifests_and_store_url_string(tmp_path: Path) -> None:
    m = make_manifest(hosts=("a", "b"), ranks_per_host=1)
    d = write_trace_dir(tmp_path / "out", m)
    host_b = {
        "kinetoscope_manifest": 1,
        "trace_id": m["trace_id"],
        "files": [{"file": m["files"][1]["file"], "host": "b", "complete": True}],
    }
    (d / "manifest.b.json").write_bytes(orjson.dumps(host_b))
    objs = upload_trace_request(d, str(tmp_path / "store"), retry=FAST)
    names = [o.key.split("/", 1)[1] for o in objs]
    assert names == [m["files"][0]["file"], m["files"][1]["file"], "manifest.b.json", "manifest.json"]


def test_upload_refuses_bad_input(tmp_path: Path) -> None:
    with pytest.raises(ManifestError, match="not a directory"):
        upload_trace_request(tmp_path / "missing", tmp_path / "store")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ManifestError, match="no manifest.json"):
        upload_trace_request(tmp_path / "empty", tmp_path / "store")
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "manifest.json").write_text('{"kinetoscope_manifest": 1, "trace_id": "../x", "files": []}')
    with pytest.raises(ManifestError, match="trace_id"):
        upload_trace_request(bad, tmp_path / "store")
    with pytest.raises(StoreError, match="no manifest"):
        download_trace_request(tmp_path / "store", "nope", tmp_path / "dl")


def test_fetch_for_analyze(
    tmp_path: Path, s3_bucket: str, s3_options: dict, moto_endpoint: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from kinetoscope.store.upload import fetch

    d = _request(tmp_path)
    assert fetch(str(d)) == d  # local: as is
    assert fetch(f"file://{d}") == d
    store = TraceStore(f"s3://{s3_bucket}/t", storage_options=s3_options, retry=FAST)
    upload_trace_request(d, store)
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_endpoint)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("KSCOPE_CACHE_DIR", str(tmp_path / "cache"))
    got = fetch(f"s3://{s3_bucket}/t/{d.name}/")
    assert got == tmp_path / "cache" / d.name and (got / "manifest.json").is_file()
    first = load_trace_dir(d)["files"][0]["file"]
    one = fetch(f"s3://{s3_bucket}/t/{d.name}/{first}", tmp_path / "c2")
    assert one == tmp_path / "c2" / d.name / first and one.read_bytes() == (d / first).read_bytes()
    assert (one.parent / "manifest.json").is_file()
