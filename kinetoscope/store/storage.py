"""Trace storage on local paths, NFS and S3 (fsspec + s3fs), with atomic, checksummed uploads.

``TraceStore(url)`` is rooted at a URL:

* a path (``/data/traces``, ``~/traces``, ``file:///data/traces``): local disk or an NFS mount.
  Uploads are copied to a hidden temporary name in the destination folder, fsynced, verified
  (re-read and re-hashed) and committed with ``os.replace`` (atomic on the same filesystem,
  which the destination folder always is; NFS renames are atomic too), then the folder is
  fsynced.
* ``s3://bucket/prefix``: S3 or any S3 API (``endpoint_url`` / ``AWS_ENDPOINT_URL``). Uploads
  rely on S3's atomic object semantics: a single PUT (files below ``2 * multipart_chunksize``)
  or a multipart upload becomes visible only when it completes; a failed multipart upload is
  aborted. No temporary key is used (a copy would double the transfer and is not more atomic).
  Single PUTs carry an ``x-amz-checksum-sha256`` that S3 verifies, and the object's checksum is
  compared with the local sha256 afterwards; multipart uploads are checked by size. The sha256
  is also kept as object metadata ``x-amz-meta-kscope-sha256``.
* any other fsspec URL (``gs://``, ``az://``, ``memory://`` ...): best effort, upload to a
  temporary key then ``mv``.

Every operation is retried on transient errors (see :mod:`kinetoscope.store.retry`); failures
surface as :class:`StoreError` with one clear line.
"""

from __future__ import annotations

import base64
import hashlib
import logging
import os
import secrets
import shutil
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path, PurePosixPath
from typing import IO, Any, TypeVar

from kinetoscope.errors import KinetoscopeError, UsageError
from kinetoscope.store.retry import (
    ChecksumMismatch,
    RetryPolicy,
    call_with_retries,
    describe_error,
)

log = logging.getLogger("kinetoscope.store")
T = TypeVar("T")

CHUNK = 4 * 2**20
TMP_MARK = ".kscope-tmp-"
SHA_META = "kscope-sha256"
DEFAULT_MULTIPART_CHUNKSIZE = 50 * 2**20


class StoreError(KinetoscopeError):
    """A storage operation failed (after retries where the error was transient)."""


@dataclass(frozen=True)
class StoredObject:
    """One object in a store.

    ``verified`` says how the stored copy was checked: ``"sha256"`` (the stored bytes hash to
    ``sha256``), ``"size"`` (only the size could be compared: S3 multipart) or ``"none"``.
    ``uploaded`` is False when an identical object was already there (idempotent retry).
    """

    url: str
    key: str
    bytes: int
    sha256: str
    verified: str = "sha256"
    uploaded: bool = True

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def sha256_file(path: str | os.PathLike[str]) -> tuple[str, int]:
    """(hex sha256, size in bytes) of a local file."""
    h = hashlib.sha256()
    n = 0
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
            n += len(chunk)
    return h.hexdigest(), n


def check_key(key: str) -> str:
    """Keys are relative, ``/``-separated, without ``.``/``..``/empty segments."""
    if not isinstance(key, str) or not key or key.startswith("/") or "\\" in key or "\x00" in key:
        raise StoreError(f"invalid storage key {key!r}: must be a relative a/b/c path")
    parts = key.split("/")
    if any(p in ("", ".", "..") for p in parts) or any(TMP_MARK in p for p in parts):
        raise StoreError(f"invalid storage key {key!r}: empty, '.', '..' or temporary segment")
    return key


def is_local_url(url: str) -> bool:
    return "://" not in str(url) or str(url).startswith("file://")


def _local_root(url: str) -> Path:
    s = str(url)
    if s.startswith("file://"):
        s = s[len("file://") :]
        if not s.startswith("/"):
            raise StoreError(f"file URL must be absolute: {url}")
    return Path(os.path.expanduser(s)).absolute()


def join_url(base: str, key: str) -> str:
    return base.rstrip("/") + "/" + key if base else key


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:  # some filesystems (and NFS setups) refuse directory fsync
        pass
    finally:
        os.close(fd)


def _copy_hash(src: IO[bytes], dst: IO[bytes]) -> tuple[str, int]:
    h = hashlib.sha256()
    n = 0
    while chunk := src.read(CHUNK):
        h.update(chunk)
        dst.write(chunk)
        n += len(chunk)
    return h.hexdigest(), n


def _fd_path(fd: int, label: str | os.PathLike[str]) -> Path:
    """A name that opens the very file ``fd`` holds (not whatever is at its path now): Linux's
    ``/proc/self/fd/<fd>`` (reopening it gives the same inode, even once the path was swapped)."""
    p = Path(f"/proc/self/fd/{int(fd)}")
    if not p.parent.is_dir():
        raise StoreError(f"cannot upload {label} from its open descriptor: /proc/self/fd is not available")
    return p


def _tmp_name(name: str) -> str:
    return f".{name}{TMP_MARK}{os.getpid()}-{secrets.token_hex(4)}"


class TraceStore:
    """A place to keep trace files, addressed by ``key`` (``<trace_id>/<file>``) under ``url``.

    ``storage_options`` go to fsspec/s3fs (``endpoint_url``, ``key``, ``secret``, ``token``,
    ``anon``, ``region``, ``profile``, ``client_kwargs``, ...). ``retry`` bounds the retries of
    each operation; ``request_attempts`` is botocore's own per-request attempt count (S3).
    """

    def __init__(
        self,
        url: str | os.PathLike[str],
        *,
        storage_options: Mapping[str, Any] | None = None,
        retry: RetryPolicy | None = None,
        request_attempts: int = 3,
        multipart_chunksize: int = DEFAULT_MULTIPART_CHUNKSIZE,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        url = os.fspath(url)
        if not url:
            raise StoreError("empty storage URL")
        self.retry = retry or RetryPolicy()
        self._sleep = sleep
        self.attempts_log: list[tuple[str, int, str]] = []  # (what, attempt, error) per retry
        options = dict(storage_options or {})
        if is_local_url(url):
            self._backend: _Backend = _LocalBackend(_local_root(url))
        elif url.startswith(("s3://", "s3a://")):
            self._backend = _S3Backend(url, options, request_attempts, multipart_chunksize)
        else:
            self._backend = _FsspecBackend(url, options)
        self.url = self._backend.base_url
        self.is_local = isinstance(self._backend, _LocalBackend)

    def __repr__(self) -> str:
        return f"TraceStore({self.url!r})"

    # -- helpers ---------------------------------------------------------------------------
    def _run(self, what: str, fn: Callable[[], T]) -> T:
        retries = [0]

        def on_retry(attempt: int, exc: BaseException) -> None:
            retries[0] += 1
            self.attempts_log.append((what, attempt, describe_error(exc)))

        try:
            return call_with_retries(fn, self.retry, what, sleep=self._sleep, on_retry=on_retry)
        except StoreError:
            raise
        except Exception as exc:
            tries = retries[0] + 1
            after = f" after {tries} attempts" if tries > 1 else ""
            raise StoreError(f"{what} failed{after}: {describe_error(exc)}") from exc

    def url_for(self, key: str) -> str:
        """The URL of ``key`` (a plain absolute path for local stores)."""
        return join_url(self.url, check_key(key))

    # -- API -------------------------------------------------------------------------------
    def put_file(
        self,
        local_path: str | os.PathLike[str],
        key: str,
        *,
        expected_sha256: str | None = None,
        skip_identical: bool = True,
        fd: int | None = None,
    ) -> StoredObject:
        """Upload ``local_path`` to ``key`` atomically; returns what was stored.

        ``expected_sha256``: refuse (permanently) when the source does not hash to it.
        ``skip_identical``: when an object with the same size and sha256 is already at ``key``,
        do not upload again (retries of a whole request are cheap and idempotent).
        ``fd``: an open descriptor of the file, already checked by the caller: the bytes (size,
        hash, upload) come from that open file and ``local_path`` only names it in messages, so
        a file swapped at ``local_path`` after the check is never read (Linux: ``/proc/self/fd``).
        """
        check_key(key)
        src = Path(local_path) if fd is None else _fd_path(fd, local_path)
        if not src.exists():
            raise StoreError(f"cannot upload {local_path}: no such file")
        what = f"upload of {local_path} to {self.url_for(key)}"
        return self._run(what, lambda: self._backend.put(src, key, expected_sha256, skip_identical))

    def put_bytes(self, data: bytes, key: str, *, skip_identical: bool = True) -> StoredObject:
        """Upload bytes (a manifest, say) with the same guarantees as :meth:`put_file`."""
        check_key(key)
        what = f"upload of {len(data)} bytes to {self.url_for(key)}"
        return self._run(what, lambda: self._backend.put_bytes(data, key, skip_identical))

    def get_file(
        self, key: str, local_path: str | os.PathLike[str], *, expected_sha256: str | None = None
    ) -> Path:
        """Download ``key`` to ``local_path`` (atomically; verified against ``expected_sha256``
        or the sha256 recorded with the object when known)."""
        check_key(key)
        dst = Path(local_path)
        what = f"download of {self.url_for(key)} to {dst}"

        def _get() -> Path:
            dst.parent.mkdir(parents=True, exist_ok=True)
            tmp = dst.parent / _tmp_name(dst.name)
            try:
                known = expected_sha256 or self._backend.recorded_sha256(key)
                self._backend.get(key, tmp)
                digest, _ = sha256_file(tmp)
                if known and digest != known:
                    raise ChecksumMismatch(f"{key}: downloaded sha256 {digest} != recorded {known}")
                os.replace(tmp, dst)
                return dst
            finally:
                tmp.unlink(missing_ok=True)

        return self._run(what, _get)

    def open(self, key: str, mode: str = "rb") -> IO[Any]:
        """Open ``key`` for reading (``rb`` or ``r``). Write through :meth:`put_file`."""
        check_key(key)
        if any(c in mode for c in "wax+"):
            raise StoreError("TraceStore.open is read-only; use put_file/put_bytes to write")
        return self._run(f"open of {self.url_for(key)}", lambda: self._backend.open(key, mode))

    def read_bytes(self, key: str) -> bytes:
        check_key(key)

        def _read() -> bytes:
            with self._backend.open(key, "rb") as f:
                data: bytes = f.read()
                return data

        return self._run(f"read of {self.url_for(key)}", _read)

    def exists(self, key: str) -> bool:
        check_key(key)
        return bool(self._run(f"lookup of {self.url_for(key)}", lambda: self._backend.info(key) is not None))

    def info(self, key: str) -> StoredObject | None:
        """Size and (when recorded) sha256 of ``key``; None when absent."""
        check_key(key)
        return self._run(f"lookup of {self.url_for(key)}", lambda: self._backend.info(key))

    def list(self, prefix: str = "") -> list[str]:
        """Keys under ``prefix`` (a folder: ``"<trace_id>"`` lists that request), sorted,
        recursively; temporary upload names are never listed."""
        prefix = prefix.strip("/")
        if prefix:
            check_key(prefix)
        keys = self._run(f"listing of {join_url(self.url, prefix)}", lambda: self._backend.list(prefix))
        return sorted(k for k in keys if TMP_MARK not in k)

    def delete(self, key: str) -> None:
        check_key(key)
        self._run(f"delete of {self.url_for(key)}", lambda: self._backend.delete(key))

    def cleanup_temporary(self, older_than_s: float = 3600.0) -> int:
        """Remove temporary files left by killed uploads (local stores); returns how many."""
        return self._backend.cleanup(older_than_s)


# ---------------------------------------------------------------------------------------------
class _Backend:
    base_url: str

    def put(self, src: Path, key: str, expected: str | None, skip_identical: bool) -> StoredObject:
        raise NotImplementedError

    def put_bytes(self, data: bytes, key: str, skip_identical: bool) -> StoredObject:
        raise NotImplementedError

    def get(self, key: str, dst: Path) -> None:
        raise NotImplementedError

    def open(self, key: str, mode: str) -> IO[Any]:
        raise NotImplementedError

    def info(self, key: str) -> StoredObject | None:
        raise NotImplementedError

    def recorded_sha256(self, key: str) -> str | None:
        return None

    def list(self, prefix: str) -> list[str]:
        raise NotImplementedError

    def delete(self, key: str) -> None:
        raise NotImplementedError

    def cleanup(self, older_than_s: float) -> int:
        return 0


def _source_mismatch(src: object, digest: str, expected: str) -> StoreError:
    return StoreError(f"{src} does not match its expected sha256 ({digest} != {expected})")


class _LocalBackend(_Backend):
    def __init__(self, root: Path) -> None:
        self.root = root
        self.base_url = str(root)

    def _path(self, key: str) -> Path:
        return self.root.joinpath(*key.split("/"))

    def _identical(self, dest: Path, size: int, digest: Callable[[], str]) -> bool:
        try:
            if not dest.is_file() or dest.stat().st_size != size:
                return False
        except OSError:
            return False
        return sha256_file(dest)[0] == digest()

    def _commit(
        self, dest: Path, write: Callable[[IO[bytes]], tuple[str, int]], expected: str | None, label: object
    ) -> StoredObject:
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = dest.parent / _tmp_name(dest.name)
        try:
            with open(tmp, "xb") as out:
                digest, n = write(out)
                out.flush()
                os.fsync(out.fileno())
            if expected and digest != expected:
                raise _source_mismatch(label, digest, expected)
            stored, stored_n = sha256_file(tmp)  # read back before the name becomes visible
            if (stored, stored_n) != (digest, n):
                raise ChecksumMismatch(f"copy of {label} reads back as {stored} ({stored_n} bytes)")
            os.replace(tmp, dest)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        _fsync_dir(dest.parent)
        return StoredObject(str(dest), "", n, digest, "sha256", True)

    def put(self, src: Path, key: str, expected: str | None, skip_identical: bool) -> StoredObject:
        dest = self._path(key)
        if skip_identical and src.is_file():
            size = src.stat().st_size
            src_digest: list[str] = []

            def digest() -> str:
                if not src_digest:
                    src_digest.append(sha256_file(src)[0])
                return src_digest[0]

            if self._identical(dest, size, digest):
                if expected and digest() != expected:
                    raise _source_mismatch(src, digest(), expected)
                return StoredObject(str(dest), key, size, digest(), "sha256", False)

        def write(out: IO[bytes]) -> tuple[str, int]:
            with open(src, "rb") as fin:
                return _copy_hash(fin, out)

        obj = self._commit(dest, write, expected, src)
        return StoredObject(obj.url, key, obj.bytes, obj.sha256, "sha256", True)

    def put_bytes(self, data: bytes, key: str, skip_identical: bool) -> StoredObject:
        dest = self._path(key)
        digest = hashlib.sha256(data).hexdigest()
        if skip_identical and self._identical(dest, len(data), lambda: digest):
            return StoredObject(str(dest), key, len(data), digest, "sha256", False)

        def write(out: IO[bytes]) -> tuple[str, int]:
            out.write(data)
            return digest, len(data)

        obj = self._commit(dest, write, None, key)
        return StoredObject(obj.url, key, obj.bytes, obj.sha256, "sha256", True)

    def get(self, key: str, dst: Path) -> None:
        shutil.copyfile(self._path(key), dst)

    def open(self, key: str, mode: str) -> IO[Any]:
        return open(self._path(key), mode)

    def info(self, key: str) -> StoredObject | None:
        p = self._path(key)
        try:
            st = p.stat()
        except FileNotFoundError:
            return None
        if not p.is_file():
            return None
        return StoredObject(str(p), key, st.st_size, "", "none", False)

    def list(self, prefix: str) -> list[str]:
        base = self._path(prefix) if prefix else self.root
        if not base.is_dir():
            return []
        out = []
        for dirpath, _dirs, files in os.walk(base):
            for name in files:
                rel = Path(dirpath, name).relative_to(self.root)
                out.append(PurePosixPath(*rel.parts).as_posix())
        return out

    def delete(self, key: str) -> None:
        self._path(key).unlink(missing_ok=True)

    def cleanup(self, older_than_s: float) -> int:
        if not self.root.is_dir():
            return 0
        cutoff = time.time() - older_than_s
        n = 0
        for dirpath, _dirs, files in os.walk(self.root):
            for name in files:
                if TMP_MARK in name:
                    p = Path(dirpath, name)
                    try:
                        if p.stat().st_mtime < cutoff:
                            p.unlink()
                            n += 1
                    except OSError:
                        pass
        return n


def parse_store_options(items: Iterable[str] | None) -> dict[str, Any]:
    """``--store-option key=value`` (``kscope trace``, ``kscope catalog import``) → fsspec/s3fs
    storage options: ``true``/``false`` become booleans, digits integers, the rest stays text."""
    out: dict[str, Any] = {}
    for item in items or ():
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise UsageError(
                f"--store-option {item!r}: expected KEY=VALUE, e.g. endpoint_url=http://minio:9000"
            )
        v: Any = value
        if value.lower() in ("true", "false"):
            v = value.lower() == "true"
        elif value.isdigit():
            v = int(value)
        out[key] = v
    return out


def s3_options_from_env(options: Mapping[str, Any]) -> dict[str, Any]:
    """Turn our storage options + the usual AWS_* environment into s3fs keyword arguments."""
    opts = dict(options)
    client_kwargs = dict(opts.pop("client_kwargs", None) or {})
    endpoint = (
        opts.pop("endpoint_url", None)
        or client_kwargs.get("endpoint_url")
        or os.environ.get("AWS_ENDPOINT_URL_S3")
        or os.environ.get("AWS_ENDPOINT_URL")
    )
    if endpoint:
        client_kwargs["endpoint_url"] = endpoint
    region = (
        opts.pop("region", None)
        or opts.pop("region_name", None)
        or client_kwargs.get("region_name")
        or os.environ.get("AWS_REGION")
        or os.environ.get("AWS_DEFAULT_REGION")
    )
    if region:
        client_kwargs["region_name"] = region
    if client_kwargs:
        opts["client_kwargs"] = client_kwargs
    return opts


class _S3Backend(_Backend):
    def __init__(self, url: str, options: Mapping[str, Any], request_attempts: int, chunksize: int) -> None:
        try:
            import s3fs  # noqa: F401
        except ImportError as exc:  # pragma: no cover - depends on the install
            raise StoreError("s3:// storage needs s3fs: pip install 'kinetoscope[s3]'") from exc
        rest = url.split("://", 1)[1].strip("/")
        if not rest:
            raise StoreError(f"S3 URL has no bucket: {url}")
        self.bucket, _, self.prefix = rest.partition("/")
        self.prefix = self.prefix.strip("/")
        self.base_url = f"s3://{rest}"
        self.chunksize = max(int(chunksize), 5 * 2**20)
        self._options = s3_options_from_env(options)
        config = dict(self._options.pop("config_kwargs", None) or {})
        config.setdefault(
            "retries", {"total_max_attempts": max(int(request_attempts), 1), "mode": "standard"}
        )
        config.setdefault("connect_timeout", 10)
        config.setdefault("read_timeout", 60)
        self._config = config
        self._fs: Any = None

    @property
    def fs(self) -> Any:
        if self._fs is None:
            import s3fs

            fs = s3fs.S3FileSystem(
                skip_instance_cache=True,
                use_listings_cache=False,
                config_kwargs=self._config,
                **self._options,
            )
            fs.retries = 1  # one retry policy (ours + botocore's per request), not three nested
            self._fs = fs
        return self._fs

    def _key(self, key: str) -> str:
        return f"{self.prefix}/{key}" if self.prefix else key

    def _head(self, key: str, checksum: bool = False) -> dict[str, Any] | None:
        kwargs: dict[str, Any] = {"Bucket": self.bucket, "Key": self._key(key)}
        if checksum:
            kwargs["ChecksumMode"] = "ENABLED"
        try:
            head: dict[str, Any] = self.fs.call_s3("head_object", **kwargs)  # s3fs is untyped
            return head
        except FileNotFoundError as exc:
            # s3fs maps both a missing key and a missing bucket onto FileNotFoundError.
            if "bucket" in str(exc).lower():
                raise StoreError(f"S3 bucket {self.bucket!r} does not exist ({self.base_url})") from exc
            return None

    def _verify(self, key: str, size: int, digest: str) -> str:
        head = self._head(key, checksum=True)
        if head is None:
            raise ChecksumMismatch(f"{key}: not found right after upload")
        if int(head.get("ContentLength", -1)) != size:
            self.delete(key)
            raise ChecksumMismatch(f"{key}: stored {head.get('ContentLength')} bytes, sent {size}")
        remote = head.get("ChecksumSHA256")
        if remote and "-" not in remote:  # full-object checksum (not a multipart composite)
            if base64.b64decode(remote).hex() != digest:
                self.delete(key)
                raise ChecksumMismatch(f"{key}: stored sha256 differs from the local file")
            return "sha256"
        return "size"

    def _identical(self, key: str, size: int, digest: str) -> bool:
        head = self._head(key)
        if not head:
            return False
        return (
            int(head.get("ContentLength", -1)) == size
            and (head.get("Metadata") or {}).get(SHA_META) == digest
        )

    def put(self, src: Path, key: str, expected: str | None, skip_identical: bool) -> StoredObject:
        size = src.stat().st_size
        single = size < 2 * self.chunksize
        if single:
            data = src.read_bytes()
            digest = hashlib.sha256(data).hexdigest()
        else:
            data = b""
            digest, size = sha256_file(src)
        if expected and digest != expected:
            raise _source_mismatch(src, digest, expected)
        url = join_url(self.base_url, key)
        if skip_identical and self._identical(key, size, digest):
            return StoredObject(url, key, size, digest, "sha256", False)
        if single:
            self._put_object(key, data, digest)
        else:
            try:
                self.fs.put_file(
                    str(src),
                    f"{self.bucket}/{self._key(key)}",
                    chunksize=self.chunksize,
                    Metadata={SHA_META: digest},
                )
            except BaseException:
                self._abort_open_uploads(key)
                raise
        return StoredObject(url, key, size, digest, self._verify(key, size, digest), True)

    def _abort_open_uploads(self, key: str, rounds: int = 3) -> None:
        """After a failed multipart upload, abort what is still open at ``key``. s3fs aborts its
        own upload, but an abort that races with a part still in flight can fail or leave parts
        behind (S3's docs say to repeat it), and an open upload keeps billing for its parts.
        Trace keys are unique per request, so every open upload at this exact key is ours."""
        k = self._key(key)
        for attempt in range(rounds):
            try:
                resp = self.fs.call_s3("list_multipart_uploads", Bucket=self.bucket, Prefix=k)
                open_ids = [u["UploadId"] for u in resp.get("Uploads", []) if u.get("Key") == k]
                if not open_ids:
                    return
                for upload_id in open_ids:
                    self.fs.call_s3("abort_multipart_upload", Bucket=self.bucket, Key=k, UploadId=upload_id)
            except Exception as exc:  # noqa: BLE001 - best effort: the upload's own error is what matters
                if attempt == rounds - 1:
                    log.warning(
                        "could not abort the failed multipart upload at %s: %s",
                        join_url(self.base_url, key),
                        exc,
                    )
            time.sleep(0.1 * (attempt + 1))

    def _put_object(self, key: str, data: bytes, digest: str) -> None:
        self.fs.call_s3(
            "put_object",
            Bucket=self.bucket,
            Key=self._key(key),
            Body=data,
            ChecksumAlgorithm="SHA256",
            Metadata={SHA_META: digest},
        )

    def put_bytes(self, data: bytes, key: str, skip_identical: bool) -> StoredObject:
        digest = hashlib.sha256(data).hexdigest()
        url = join_url(self.base_url, key)
        if skip_identical and self._identical(key, len(data), digest):
            return StoredObject(url, key, len(data), digest, "sha256", False)
        self._put_object(key, data, digest)
        return StoredObject(url, key, len(data), digest, self._verify(key, len(data), digest), True)

    def get(self, key: str, dst: Path) -> None:
        self.fs.get_file(f"{self.bucket}/{self._key(key)}", str(dst))

    def open(self, key: str, mode: str) -> IO[Any]:
        f: IO[Any] = self.fs.open(f"{self.bucket}/{self._key(key)}", mode)  # s3fs is untyped
        return f

    def info(self, key: str) -> StoredObject | None:
        head = self._head(key)
        if head is None:
            return None
        sha = (head.get("Metadata") or {}).get(SHA_META, "")
        return StoredObject(
            join_url(self.base_url, key),
            key,
            int(head.get("ContentLength", 0)),
            sha,
            "sha256" if sha else "none",
            False,
        )

    def recorded_sha256(self, key: str) -> str | None:
        obj = self.info(key)
        return obj.sha256 if obj and obj.sha256 else None

    def list(self, prefix: str) -> list[str]:
        root = f"{self.bucket}/{self.prefix}" if self.prefix else self.bucket
        path = f"{root}/{prefix}" if prefix else root
        try:
            found = self.fs.find(path)
        except FileNotFoundError as exc:
            if "bucket" in str(exc).lower():
                raise StoreError(f"S3 bucket {self.bucket!r} does not exist ({self.base_url})") from exc
            return []
        out = []
        for p in found:
            if p.startswith(root + "/"):
                out.append(p[len(root) + 1 :])
        return out

    def delete(self, key: str) -> None:
        self.fs.call_s3("delete_object", Bucket=self.bucket, Key=self._key(key))


class _FsspecBackend(_Backend):
    """Any other fsspec filesystem: upload to a temporary key, then ``mv`` onto the final one."""

    def __init__(self, url: str, options: Mapping[str, Any]) -> None:
        import fsspec

        try:
            self.fs, root = fsspec.core.url_to_fs(url, **options)
        except (ImportError, ValueError) as exc:
            raise StoreError(f"unsupported storage URL {url}: {exc}") from exc
        self.root = root.rstrip("/")
        self.base_url = url.rstrip("/")

    def _p(self, key: str) -> str:
        return f"{self.root}/{key}"

    def _commit(self, upload: Callable[[str], None], key: str, size: int, digest: str) -> StoredObject:
        parent, _, name = key.rpartition("/")
        tmp_key = f"{parent}/{_tmp_name(name)}" if parent else _tmp_name(name)
        try:
            upload(self._p(tmp_key))
            got = self.fs.info(self._p(tmp_key)).get("size")
            if got is not None and int(got) != size:
                raise ChecksumMismatch(f"{key}: stored {got} bytes, sent {size}")
            self.fs.mv(self._p(tmp_key), self._p(key))
        except BaseException:
            try:
                self.fs.rm(self._p(tmp_key))
            except Exception:  # noqa: BLE001
                pass
            raise
        return StoredObject(join_url(self.base_url, key), key, size, digest, "size", True)

    def put(self, src: Path, key: str, expected: str | None, skip_identical: bool) -> StoredObject:
        digest, size = sha256_file(src)
        if expected and digest != expected:
            raise _source_mismatch(src, digest, expected)
        return self._commit(lambda p: self.fs.put_file(str(src), p), key, size, digest)

    def put_bytes(self, data: bytes, key: str, skip_identical: bool) -> StoredObject:
        return self._commit(
            lambda p: self.fs.pipe_file(p, data), key, len(data), hashlib.sha256(data).hexdigest()
        )

    def get(self, key: str, dst: Path) -> None:
        self.fs.get_file(self._p(key), str(dst))

    def open(self, key: str, mode: str) -> IO[Any]:
        f: IO[Any] = self.fs.open(self._p(key), mode)  # fsspec is untyped
        return f

    def info(self, key: str) -> StoredObject | None:
        try:
            inf = self.fs.info(self._p(key))
        except FileNotFoundError:
            return None
        if inf.get("type") == "directory":
            return None
        return StoredObject(join_url(self.base_url, key), key, int(inf.get("size") or 0), "", "none", False)

    def list(self, prefix: str) -> list[str]:
        path = self._p(prefix) if prefix else self.root
        root = self.root.lstrip("/")
        out = []
        for p in self.fs.find(path):
            p = p.lstrip("/")
            if p.startswith(root + "/"):
                out.append(p[len(root) + 1 :])
        return out

    def delete(self, key: str) -> None:
        try:
            self.fs.rm(self._p(key))
        except FileNotFoundError:
            pass


__all__ = [
    "StoreError",
    "StoredObject",
    "TraceStore",
    "RetryPolicy",
    "sha256_file",
    "check_key",
    "join_url",
    "is_local_url",
]
