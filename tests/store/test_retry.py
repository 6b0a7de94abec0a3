"""Transient/permanent classification and the bounded backoff."""

from __future__ import annotations

import errno

import pytest
from botocore.exceptions import ClientError, EndpointConnectionError, NoCredentialsError, ReadTimeoutError

from kinetoscope.store.retry import ChecksumMismatch, RetryPolicy, call_with_retries, is_transient


def _client_error(status: int, code: str) -> ClientError:
    return ClientError(
        {"Error": {"Code": code, "Message": code}, "ResponseMetadata": {"HTTPStatusCode": status}},
        "PutObject",
    )


def _wrapped(inner: BaseException, outer: BaseException) -> BaseException:
    try:
        try:
            raise inner
        except BaseException as e:
            raise outer from e
    except BaseException as out:
        return out


@pytest.mark.parametrize(
    "exc,transient",
    [
        (_client_error(503, "SlowDown"), True),
        (_client_error(500, "InternalError"), True),
        (_client_error(429, "TooManyRequests"), True),
        (_client_error(400, "RequestTimeout"), True),
        (_client_error(403, "AccessDenied"), False),
        (_client_error(403, "InvalidAccessKeyId"), False),
        (_client_error(404, "NoSuchKey"), False),
        (_client_error(404, "NoSuchBucket"), False),
        (_wrapped(_client_error(503, "SlowDown"), OSError(errno.EIO, "x")), True),  # as s3fs wraps it
        (_wrapped(_client_error(403, "AccessDenied"), PermissionError("denied")), False),
        (EndpointConnectionError(endpoint_url="http://x"), True),
        (ReadTimeoutError(endpoint_url="http://x"), True),
        (NoCredentialsError(), False),
        (ConnectionResetError(), True),
        (TimeoutError(), True),
        (OSError(errno.ESTALE, "stale NFS handle"), True),
        (OSError(errno.ENOSPC, "disk full"), False),
        (FileNotFoundError(), False),
        (ChecksumMismatch("bad"), True),
        (ValueError("x"), False),
    ],
)
def test_classification(exc: BaseException, transient: bool) -> None:
    assert is_transient(exc) is transient


def test_bounded_backoff() -> None:
    sleeps: list[float] = []
    calls = []

    def flaky() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise ConnectionResetError("reset")
        return "ok"

    policy = RetryPolicy(attempts=5, base_delay=0.5, max_delay=1.0, jitter=0.0)
    assert call_with_retries(flaky, policy, "t", sleep=sleeps.append) == "ok"
    assert sleeps == [0.5, 1.0]
    sleeps.clear()
    with pytest.raises(ConnectionResetError):
        call_with_retries(
            lambda: (_ for _ in ()).throw(ConnectionResetError()), policy, "t", sleep=sleeps.append
        )
    assert sleeps == [0.5, 1.0, 1.0, 1.0]  # 5 attempts, capped delay
    with pytest.raises(PermissionError):
        call_with_retries(lambda: (_ for _ in ()).throw(PermissionError()), policy, "t", sleep=sleeps.append)
    assert len(sleeps) == 4  # not retried
