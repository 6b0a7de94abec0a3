"""Bounded exponential backoff and the transient/permanent classification of storage errors.

Retried: connection resets/refusals/timeouts, HTTP 5xx, 429 and S3 throttling codes, checksum
mismatches in transit, and a few errno values that NFS returns for passing trouble. Never
retried: authentication/authorisation failures, missing buckets/keys (404), bad arguments.
"""

from __future__ import annotations

import errno
import logging
import random
import socket
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TypeVar

log = logging.getLogger("kinetoscope.store")

T = TypeVar("T")

#: S3 error codes that mean "try again later" whatever the HTTP status says.
TRANSIENT_S3_CODES = frozenset(
    {
        "SlowDown",
        "Throttling",
        "ThrottlingException",
        "ThrottledException",
        "RequestThrottled",
        "RequestThrottledException",
        "TooManyRequestsException",
        "ProvisionedThroughputExceededException",
        "RequestLimitExceeded",
        "BandwidthLimitExceeded",
        "RequestTimeout",
        "RequestTimeoutException",
        "InternalError",
        "ServiceUnavailable",
        "PriorRequestNotComplete",
        "BadDigest",
        "XAmzContentSHA256Mismatch",
        "IncompleteBody",
    }
)

#: errno values worth another try (NFS hiccups, interrupted calls).
TRANSIENT_ERRNOS = frozenset(
    {
        errno.EAGAIN,
        errno.EINTR,
        errno.ETIMEDOUT,
        errno.ESTALE,
        errno.EBUSY,
        errno.ECONNRESET,
        errno.ECONNREFUSED,
        errno.ECONNABORTED,
        errno.EPIPE,
        errno.EHOSTUNREACH,
        errno.ENETUNREACH,
    }
)


class ChecksumMismatch(OSError):
    """The stored bytes do not hash to what was sent (treated as transient: resend)."""


@dataclass(frozen=True)
class RetryPolicy:
    """``attempts`` tries in all; the wait before try n+1 is ``base_delay * 2**n`` capped at
    ``max_delay``, with up to ``jitter`` (a fraction) added at random."""

    attempts: int = 5
    base_delay: float = 0.25
    max_delay: float = 8.0
    jitter: float = 0.25

    def delays(self) -> Iterator[float]:
        for n in range(max(self.attempts, 1) - 1):
            d = min(self.base_delay * (2**n), self.max_delay)
            yield d + d * self.jitter * random.random()


NO_RETRY = RetryPolicy(attempts=1)


def _chain(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        yield cur
        cur = cur.__cause__ or cur.__context__


def _client_error_verdict(exc: BaseException) -> bool | None:
    response = getattr(exc, "response", None)
    if not isinstance(response, dict) or "Error" not in response:
        return None
    code = str(response.get("Error", {}).get("Code") or "")
    status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    if code in TRANSIENT_S3_CODES:
        return True
    if isinstance(status, int):
        return status >= 500 or status == 429
    return False


def is_transient(exc: BaseException) -> bool:
    """True when ``exc`` (or what caused it) is worth retrying."""
    for e in _chain(exc):
        if isinstance(e, ChecksumMismatch):
            return True
        verdict = _client_error_verdict(e)
        if verdict is not None:
            return verdict
        # Definitive permanent local errors (s3fs also maps 403/404 onto these).
        if isinstance(
            e, (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError, FileExistsError)
        ):
            return False
        if isinstance(e, (ConnectionError, TimeoutError, socket.timeout)):
            return True
        mod = type(e).__module__ or ""
        name = type(e).__name__
        if mod.startswith("botocore"):
            # botocore's HTTPClientError (ConnectionClosedError, ReadTimeoutError, ...) and
            # ConnectionError (EndpointConnectionError, ConnectTimeoutError, ...) are transient;
            # NoCredentialsError / ParamValidationError / ... are permanent.
            import botocore.exceptions as bex

            transient = tuple(
                getattr(bex, n)
                for n in (
                    "HTTPClientError",
                    "ConnectionError",
                    "ResponseStreamingError",
                    "ReadTimeoutError",
                    "ConnectTimeoutError",
                )
                if hasattr(bex, n)
            )
            return isinstance(e, transient)
        if mod.startswith("aiohttp") and name in {
            "ClientConnectionError",
            "ClientOSError",
            "ServerDisconnectedError",
            "ClientPayloadError",
            "ServerTimeoutError",
            "ClientConnectorError",
            "ConnectionTimeoutError",
            "SocketTimeoutError",
        }:
            return True
        if name == "FSTimeoutError":
            return True
        if isinstance(e, OSError) and e.errno in TRANSIENT_ERRNOS:
            return True
    return False


def call_with_retries(
    fn: Callable[[], T],
    policy: RetryPolicy,
    what: str,
    *,
    sleep: Callable[[float], None] = time.sleep,
    on_retry: Callable[[int, BaseException], None] | None = None,
    transient: Callable[[BaseException], bool] = is_transient,
    log_level: int = logging.WARNING,
) -> T:
    """Call ``fn`` until it succeeds, a permanent error occurs, or ``policy`` is used up.

    ``transient`` says which errors are worth another try (storage errors by default);
    ``log_level`` is the level of the line logged per retry (an expected wait, such as a lock,
    need not warn). The last error propagates unchanged (callers wrap it into a user-facing
    message).
    """
    delays = policy.delays()
    attempt = 0
    while True:
        attempt += 1
        try:
            return fn()
        except Exception as exc:  # noqa: BLE001 - classified below
            if not transient(exc):
                raise
            delay = next(delays, None)
            if delay is None:
                raise
            log.log(
                log_level,
                "%s: transient error on attempt %d (%s); retrying in %.2fs",
                what,
                attempt,
                describe_error(exc),
                delay,
            )
            if on_retry is not None:
                on_retry(attempt, exc)
            sleep(delay)


def describe_error(exc: BaseException) -> str:
    """One line naming the most useful error in the chain (an S3 code, an errno, ...)."""
    for e in _chain(exc):
        response = getattr(e, "response", None)
        if isinstance(response, dict) and "Error" in response:
            err = response.get("Error", {})
            status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            code = err.get("Code") or "error"
            msg = err.get("Message") or ""
            return f"{code} (HTTP {status}){': ' + msg if msg else ''}"
    text = str(exc).strip() or type(exc).__name__
    if isinstance(exc, OSError) and exc.strerror and exc.filename:
        text = f"{exc.strerror}: {exc.filename}"
    first = text.splitlines()[0] if text else type(exc).__name__
    return f"{type(exc).__name__}: {first}" if type(exc).__name__ not in first else first
