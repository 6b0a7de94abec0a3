"""A real S3 API server (moto) on loopback, shared by the storage and the collection tests.

Loaded as a pytest plugin by tests/conftest.py, so every test folder can ask for ``moto_endpoint``,
``s3_bucket``, ``s3_options`` and ``s3_env``."""

from __future__ import annotations

import contextlib
import logging
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

S3_CREDS = {"key": "testing", "secret": "testing", "region": "us-east-1"}


@pytest.fixture(scope="session")
def moto_endpoint() -> Iterator[str]:
    """``http://127.0.0.1:<port>`` of moto's S3 server, stopped at the end of the session."""
    pytest.importorskip("s3fs", reason="s3fs not installed (pip install 'kinetoscope[s3]')")
    server_mod = pytest.importorskip("moto.server", reason="moto[server] not installed (test extra)")
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = server_mod.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        yield f"http://{host}:{port}"
    finally:
        server.stop()


def s3_client(endpoint: str) -> Any:
    import boto3

    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id=S3_CREDS["key"],
        aws_secret_access_key=S3_CREDS["secret"],
        region_name=S3_CREDS["region"],
    )


@pytest.fixture()
def s3_bucket(moto_endpoint: str) -> Iterator[str]:
    """A fresh bucket on the moto server; deleted (with its objects) afterwards."""
    name = f"kscope-{uuid.uuid4().hex[:12]}"
    client = s3_client(moto_endpoint)
    client.create_bucket(Bucket=name)
    try:
        yield name
    finally:
        with contextlib.suppress(Exception):
            for up in client.list_multipart_uploads(Bucket=name).get("Uploads", []):
                client.abort_multipart_upload(Bucket=name, Key=up["Key"], UploadId=up["UploadId"])
            for obj in client.list_objects_v2(Bucket=name).get("Contents", []):
                client.delete_object(Bucket=name, Key=obj["Key"])
            client.delete_bucket(Bucket=name)


@pytest.fixture()
def s3_options(moto_endpoint: str) -> dict[str, Any]:
    """``storage_options`` for ``TraceStore`` on the moto server."""
    return {"endpoint_url": moto_endpoint, **S3_CREDS}


@pytest.fixture()
def s3_env(moto_endpoint: str) -> dict[str, str]:
    """The environment a ``kscope`` subprocess needs to reach the moto server (the usual AWS_*)."""
    return {
        "AWS_ENDPOINT_URL": moto_endpoint,
        "AWS_ACCESS_KEY_ID": S3_CREDS["key"],
        "AWS_SECRET_ACCESS_KEY": S3_CREDS["secret"],
        "AWS_REGION": S3_CREDS["region"],
    }
