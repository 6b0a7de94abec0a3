"""TraceStore against a real S3 API server (moto's, on loopback), with faults injected by a real
TCP proxy between s3fs and the server."""

from __future__ import annotations

import base64
import hashlib
import os
from pathlib import Path
from typing import Any

import pytest

from kinetoscope.store.retry import RetryPolicy
from kinetoscope.store.storage import StoreError, TraceStore

from .conftest import s3_client
from .faultproxy import FaultProxy

FAST = RetryPolicy(attempts=4, base_delay=0.01, max_delay=0.05)
MiB = 2**20


def _src(tmp_path: Path, data: bytes, name: str = "rank-0_1.pt.trace.json") -> Path:
    p = tmp_path / name
    p.write_bytes(data)
    return p


@pytest.fixture()
def proxy(moto_endpoint: str) -> Any:
    host, port = moto_endpoint.removeprefix("http://").split(":")
    p = FaultProxy((host, int(port)))
    yield p
    p.close()


def test_put_list_get_checksum(tmp_path: Path, s3_bucket: str, s3_options: dict, moto_endpoint: str) -> None:
    data = os.urandom(200_000)
    store = TraceStore(f"s3://{s3_bucket}/traces/", storage_options=s3_options, retry=FAST)
    assert store.url == f"s3://{s3_bucket}/traces"
    obj = store.put_file(_src(tmp_path, data), "kst-1/rank-0_1.pt.trace.json")
    sha = hashlib.sha256(data).hexdigest()
    assert obj.url == f"s3://{s3_bucket}/traces/kst-1/rank-0_1.pt.trace.json"
    assert (obj.sha256, obj.bytes, obj.verified, obj.uploaded) == (sha, len(data), "sha256", True)
    # what the server really holds: the bytes, the sha256 metadata and S3's own checksum
    head = s3_client(moto_endpoint).head_object(
        Bucket=s3_bucket, Key="traces/kst-1/rank-0_1.pt.trace.json", ChecksumMode="ENABLED"
    )
    assert head["Metadata"]["kscope-sha256"] == sha
    assert base64.b64decode(head["ChecksumSHA256"]).hex() == sha
    store.put_bytes(b"{}", "kst-1/manifest.json")
    assert store.list() == ["kst-1/manifest.json", "kst-1/rank-0_1.pt.trace.json"]
    assert store.list("kst-1") == store.list()
    assert store.list("kst-2") == []
    assert store.exists("kst-1/rank-0_1.pt.trace.json") and not store.exists("kst-1/nope")
    info = store.info("kst-1/rank-0_1.pt.trace.json")
    assert info is not None and info.sha256 == sha and info.bytes == len(data)
    with store.open("kst-1/rank-0_1.pt.trace.json") as f:
        assert f.read() == data
    got = store.get_file("kst-1/rank-0_1.pt.trace.json", tmp_path / "dl" / "f.json")
    assert got.read_bytes() == data
    again = store.put_file(_src(tmp_path, data), "kst-1/rank-0_1.pt.trace.json")
    assert not again.uploaded and again.sha256 == sha


def test_env_credentials_and_endpoint(
    tmp_path: Path, s3_bucket: str, moto_endpoint: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_endpoint)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    store = TraceStore(f"s3://{s3_bucket}", retry=FAST)
    store.put_bytes(b"hello", "a/b")
    assert store.read_bytes("a/b") == b"hello" and store.list() == ["a/b"]


def test_multipart_upload_verified_by_size(tmp_path: Path, s3_bucket: str, s3_options: dict) -> None:
    data = os.urandom(11 * MiB)
    store = TraceStore(
        f"s3://{s3_bucket}", storage_options=s3_options, retry=FAST, multipart_chunksize=5 * MiB
    )
    obj = store.put_file(_src(tmp_path, data), "kst/big.json")
    assert obj.verified == "size" and obj.sha256 == hashlib.sha256(data).hexdigest()
    assert store.info("kst/big.json").sha256 == obj.sha256  # type: ignore[union-attr]
    assert store.read_bytes("kst/big.json") == data


@pytest.mark.parametrize("fault,times", [("reset", 2), ("503", 1)])
def test_retry_on_transient_failure(
    tmp_path: Path, s3_bucket: str, s3_options: dict, proxy: FaultProxy, fault: str, times: int
) -> None:
    """The first PUT(s) are dropped / throttled; our retry recovers. botocore's own retries are
    off here (request_attempts=1); aiohttp silently re-sends an idempotent request once when a
    *reused* keep-alive connection is reset, hence two resets to reach our layer."""
    proxy.policy = lambda i, method, target: (
        fault if method == "PUT" and len(proxy.faults()) < times else "forward"
    )
    opts = {**s3_options, "endpoint_url": proxy.url}
    store = TraceStore(f"s3://{s3_bucket}", storage_options=opts, retry=FAST, request_attempts=1)
    data = os.urandom(100_000)
    obj = store.put_file(_src(tmp_path, data), "kst/r.json")
    assert len(proxy.faults()) == times
    assert len(store.attempts_log) >= 1 and "upload of" in store.attempts_log[0][0]
    if fault == "503":
        assert "SlowDown (HTTP 503)" in store.attempts_log[0][2]
    assert store.read_bytes("kst/r.json") == data and obj.sha256 == hashlib.sha256(data).hexdigest()


def test_default_settings_survive_throttling(
    tmp_path: Path, s3_bucket: str, s3_options: dict, proxy: FaultProxy
) -> None:
    """With default settings, two throttled PUTs in a row are absorbed."""
    proxy.policy = lambda i, method, target: (
        "503" if method == "PUT" and len(proxy.faults()) < 2 else "forward"
    )
    store = TraceStore(
        f"s3://{s3_bucket}", storage_options={**s3_options, "endpoint_url": proxy.url}, retry=FAST
    )
    store.put_bytes(b"payload", "kst/t.json")
    assert len(proxy.faults()) == 2 and store.read_bytes("kst/t.json") == b"payload"


def test_auth_error_is_not_retried(
    tmp_path: Path, s3_bucket: str, s3_options: dict, proxy: FaultProxy
) -> None:
    store = TraceStore(
        f"s3://no-such-bucket-{s3_bucket}",
        storage_options={**s3_options, "endpoint_url": proxy.url},
        retry=FAST,
        request_attempts=1,
    )
    with pytest.raises(StoreError, match="bucket"):
        store.put_bytes(b"x", "a/b")
    assert store.attempts_log == []
    puts = [r for r in proxy.log if r.method == "PUT"]
    assert len(puts) <= 1


def test_interrupted_single_put_leaves_nothing(
    tmp_path: Path, s3_bucket: str, s3_options: dict, proxy: FaultProxy
) -> None:
    """Every PUT is cut after 64 KiB of body: the upload fails and no object exists at the key."""
    proxy.policy = lambda i, method, target: ("cut", 64 * 1024) if method == "PUT" else "forward"
    store = TraceStore(
        f"s3://{s3_bucket}",
        storage_options={**s3_options, "endpoint_url": proxy.url},
        retry=FAST,
        request_attempts=1,
    )
    with pytest.raises(StoreError, match=r"upload of .* failed after 4 attempts"):
        store.put_file(_src(tmp_path, os.urandom(1 * MiB)), "kst/cut.json")
    assert len(store.attempts_log) == 3  # 4 attempts (aiohttp may re-send each once more)
    assert len(proxy.faults()) >= 4
    direct = TraceStore(f"s3://{s3_bucket}", storage_options=s3_options)
    assert not direct.exists("kst/cut.json") and direct.list() == []


def test_interrupted_multipart_leaves_nothing(
    tmp_path: Path, s3_bucket: str, s3_options: dict, moto_endpoint: str, proxy: FaultProxy
) -> None:
    """Part 2 of every multipart upload is cut: no object at the key, no upload left open."""
    proxy.policy = lambda i, method, target: (
        ("cut", MiB) if method == "PUT" and "partNumber=2" in target else "forward"
    )
    store = TraceStore(
        f"s3://{s3_bucket}",
        storage_options={**s3_options, "endpoint_url": proxy.url},
        retry=RetryPolicy(attempts=2, base_delay=0.01),
        request_attempts=1,
        multipart_chunksize=5 * MiB,
    )
    with pytest.raises(StoreError, match="failed after 2 attempts"):
        store.put_file(_src(tmp_path, os.urandom(11 * MiB)), "kst/mpu.json")
    assert any("uploadId" in r.target and r.method == "DELETE" for r in proxy.log)  # aborted
    client = s3_client(moto_endpoint)
    assert "Contents" not in client.list_objects_v2(Bucket=s3_bucket)
    assert client.list_multipart_uploads(Bucket=s3_bucket).get("Uploads", []) == []
