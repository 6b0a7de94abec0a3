"""Upload one trace request (its files + manifest) to a store, and fetch one back.

Layout in a store: ``<store url>/<trace_id>/<file>`` for every trace file, the daemons'
``manifest.<host>.json`` as they are, and ``<trace_id>/manifest.json`` **last**: the manifest,
updated with each uploaded file's ``sha256``, ``bytes`` and ``url``, is the commit marker of the
request (a reader that finds it finds every file it lists with ``"url"``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from kinetoscope.protocol.manifest import (
    MANIFEST_NAME,
    dumps_manifest,
    find_local_file,
    host_manifests,
    load_trace_dir,
    loads_manifest,
    open_folder_file,
    write_bytes_atomic,
)
from kinetoscope.store.retry import RetryPolicy
from kinetoscope.store.storage import StoredObject, StoreError, TraceStore, join_url


def _as_store(
    store: TraceStore | str | os.PathLike[str],
    storage_options: Mapping[str, Any] | None,
    retry: RetryPolicy | None,
) -> TraceStore:
    if isinstance(store, TraceStore):
        return store
    return TraceStore(store, storage_options=storage_options, retry=retry)


class PartialUploadError(StoreError):
    """An upload stopped part-way (disk full, lost credentials...): ``stored`` holds the objects
    that did reach the store, ``total`` how many files the request has to upload, ``reason`` the
    one-line cause, and ``manifest`` the request's manifest with those objects' ``url``/``sha256``
    and ``"status": "partial"``/``"store_error"`` set, ready for ``Catalog.record_trace_request``
    (the store has no ``manifest.json`` for it: readers treat it as not uploaded)."""

    def __init__(
        self, message: str, *, stored: list[StoredObject], total: int, reason: str, manifest: dict[str, Any]
    ) -> None:
        super().__init__(message)
        self.stored = stored
        self.total = total
        self.reason = reason
        self.manifest = manifest


def upload_trace_request(
    trace_dir: str | os.PathLike[str],
    store_url: TraceStore | str | os.PathLike[str],
    *,
    include_incomplete: bool = False,
    update_local: bool = True,
    storage_options: Mapping[str, Any] | None = None,
    retry: RetryPolicy | None = None,
) -> list[StoredObject]:
    """Upload every complete file of the request in ``trace_dir`` plus its manifest(s).

    * Files whose manifest entry says ``"complete": false`` are skipped (unless
      ``include_incomplete``); entries without ``complete`` count as complete. Files not present
      on this machine are skipped (another host uploads them).
    * Each uploaded entry gains ``sha256``, ``bytes``, ``url`` (its storage URL) and ``key``; the
      manifest gains ``store_url``. With ``update_local`` the folder's ``manifest.json`` is
      rewritten (atomically) with those fields, so the catalog can record them.
    * Only files inside ``trace_dir`` are read: a ``file``/``path`` leading elsewhere (absolute,
      ``..``, a symlink out) or naming a FIFO/device is a ``ManifestError`` naming the field.
      Each file is opened once, checked as opened (``open_folder_file``), and hashed and
      uploaded from that descriptor: swapping it for a symlink after the check has no effect.
    * Idempotent: re-running after a failure uploads only what is missing or different.

    Returns the stored objects, the manifest last.
    """
    d = Path(trace_dir)
    store = _as_store(store_url, storage_options, retry)
    doc = load_trace_dir(d)
    trace_id = doc["trace_id"]
    out: list[StoredObject] = []
    todo: list[tuple[int, dict[str, Any], Path]] = []
    for i, entry in enumerate(doc["files"]):
        if entry.get("complete") is False and not include_incomplete:
            continue
        local = find_local_file(d, entry, index=i)  # inside the folder only (ManifestError else)
        if local is not None:
            todo.append((i, entry, local))
    source = str(d / MANIFEST_NAME)
    for i, entry, local in todo:
        # read from the descriptor checked as opened: a swap after the check changes nothing
        fd = open_folder_file(d, local, source=source, field=f"files[{i}]")
        try:
            obj = store.put_file(local, f"{trace_id}/{entry['file']}", fd=fd)
        except StoreError as exc:
            raise _partial(doc, out, len(todo), exc) from exc
        finally:
            os.close(fd)
        entry.update(sha256=obj.sha256, bytes=obj.bytes, url=obj.url, key=obj.key)
        out.append(obj)
    for hm in host_manifests(d):
        out.append(store.put_file(hm, f"{trace_id}/{hm.name}"))
    doc["store_url"] = store.url
    data = dumps_manifest(doc)
    if update_local:
        try:
            write_bytes_atomic(d / MANIFEST_NAME, data)
        except OSError as exc:
            raise StoreError(f"cannot update {d / MANIFEST_NAME}: {exc.strerror or exc}") from exc
    out.append(store.put_bytes(data, f"{trace_id}/{MANIFEST_NAME}"))
    return out


def _partial(
    doc: dict[str, Any], stored: list[StoredObject], total: int, exc: StoreError
) -> PartialUploadError:
    """The error of an upload that stopped after ``stored`` of ``total`` files, with the manifest
    the catalog records for it (status ``partial``, the reason in ``store_error``)."""
    reason = str(exc)
    manifest = dict(doc)
    manifest["status"] = "partial"
    manifest["store_error"] = f"{len(stored)} of {total} files stored: {reason}"
    msg = (
        f"upload of {doc['trace_id']} stopped after {len(stored)} of {total} files: {reason} "
        "(re-run the same command to finish: what is stored is kept)"
    )
    return PartialUploadError(msg, stored=list(stored), total=total, reason=reason, manifest=manifest)


def split_request_url(url: str) -> tuple[str, str]:
    """``s3://b/prefix/<trace_id>[/manifest.json]`` → (``s3://b/prefix``, trace_id)."""
    u = str(url).rstrip("/")
    if u.endswith("/" + MANIFEST_NAME):
        u = u[: -len(MANIFEST_NAME) - 1]
    base, _, trace_id = u.rpartition("/")
    if not base or not trace_id:
        raise StoreError(f"{url}: expected <store url>/<trace_id>")
    return base, trace_id


def download_trace_request(
    store_url: TraceStore | str | os.PathLike[str],
    trace_id: str,
    dest_dir: str | os.PathLike[str],
    *,
    storage_options: Mapping[str, Any] | None = None,
    retry: RetryPolicy | None = None,
) -> Path:
    """Fetch ``<store>/<trace_id>/`` into ``dest_dir/<trace_id>/`` (each file verified against the
    manifest's sha256; files already there with the right hash are kept). Returns that folder,
    ready for ``kscope analyze``. The manifest is written last."""
    store = _as_store(store_url, storage_options, retry)
    key = f"{trace_id}/{MANIFEST_NAME}"
    if not store.exists(key):
        raise StoreError(f"{store.url_for(key)}: no manifest (request not uploaded, or still uploading)")
    doc = loads_manifest(store.read_bytes(key), source=store.url_for(key))
    target = Path(dest_dir) / trace_id
    target.mkdir(parents=True, exist_ok=True)
    from kinetoscope.store.storage import sha256_file

    for entry in doc["files"]:
        if not entry.get("url"):
            continue
        dst = target / entry["file"]
        sha = entry.get("sha256")
        if dst.is_file() and sha and sha256_file(dst)[0] == sha:
            continue
        store.get_file(entry.get("key") or f"{trace_id}/{entry['file']}", dst, expected_sha256=sha)
        entry["path"] = str(dst)
    for k in store.list(trace_id):
        name = k.rsplit("/", 1)[-1]
        if name.startswith("manifest.") and name != MANIFEST_NAME and name.endswith(".json"):
            store.get_file(k, target / name)
    write_bytes_atomic(target / MANIFEST_NAME, dumps_manifest(doc))
    return target


def default_cache_dir() -> Path:
    """Where fetched traces go: ``$KSCOPE_CACHE_DIR`` or ``~/.cache/kinetoscope/traces``."""
    env = os.environ.get("KSCOPE_CACHE_DIR")
    return Path(env).expanduser() if env else Path("~/.cache/kinetoscope/traces").expanduser()


def fetch(
    url: str | os.PathLike[str],
    cache_dir: str | os.PathLike[str] | None = None,
    *,
    storage_options: Mapping[str, Any] | None = None,
    retry: RetryPolicy | None = None,
) -> Path:
    """A local path for what ``url`` names, for ``kscope analyze``.

    * a local path (or ``file://``): returned as is, nothing copied;
    * ``<store>/<trace_id>`` or ``<store>/<trace_id>/manifest.json``: the whole request,
      downloaded (verified) into ``<cache_dir>/<trace_id>/``, which is returned;
    * ``<store>/<trace_id>/<file>``: that file (plus the request's ``manifest.json`` when there
      is one, so rank/host metadata is known), returned as ``<cache_dir>/<trace_id>/<file>``.
    """
    from kinetoscope.store.storage import is_local_url

    u = os.fspath(url)
    if is_local_url(u):
        return Path(u[len("file://") :] if u.startswith("file://") else u).expanduser()
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    u = u.rstrip("/")
    base, _, last = u.rpartition("/")
    store = TraceStore(base, storage_options=storage_options, retry=retry)
    looks_like_file = last != MANIFEST_NAME and (".json" in last or last.endswith((".gz", ".pftrace")))
    if looks_like_file:
        _, _, trace_id = base.rpartition("/")
        if not trace_id:
            raise StoreError(f"{url}: expected <store url>/<trace_id>/<file>")
        dst = cache / trace_id / last
        store.get_file(last, dst)
        if store.exists(MANIFEST_NAME):
            store.get_file(MANIFEST_NAME, dst.parent / MANIFEST_NAME)
        return dst
    store_url, trace_id = split_request_url(u)
    return download_trace_request(store_url, trace_id, cache, storage_options=storage_options, retry=retry)


def request_url(store: TraceStore | str, trace_id: str) -> str:
    base = store.url if isinstance(store, TraceStore) else str(store)
    return join_url(base, trace_id)
