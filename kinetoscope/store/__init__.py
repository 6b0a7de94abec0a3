"""Trace storage (local/NFS/S3 via fsspec) and the catalog (SQLite/PostgreSQL via SQLAlchemy).

Names are imported lazily so that ``from kinetoscope.store import TraceStore`` does not pull in
SQLAlchemy, and ``Catalog`` does not pull in s3fs. See docs/storage-and-catalog.md.

* storage: :class:`TraceStore`, :class:`StoredObject`, :class:`StoreError`, :class:`RetryPolicy`
* one request: :func:`upload_trace_request`, :func:`download_trace_request`, :func:`fetch`
* manifests (defined in :mod:`kinetoscope.protocol.manifest`): :func:`load_trace_dir`,
  :func:`validate_manifest`, :class:`ManifestError`
* catalog: :class:`Catalog`, :class:`CatalogError`, :func:`record_request_dir`
"""

from __future__ import annotations

from kinetoscope.lazy import lazy_exports

_EXPORTS = {
    "TraceStore": "storage",
    "StoredObject": "storage",
    "StoreError": "storage",
    "sha256_file": "storage",
    "RetryPolicy": "retry",
    "upload_trace_request": "upload",
    "download_trace_request": "upload",
    "fetch": "upload",
    "split_request_url": "upload",
    "load_trace_dir": "kinetoscope.protocol.manifest",
    "validate_manifest": "kinetoscope.protocol.manifest",
    "read_manifest_file": "kinetoscope.protocol.manifest",
    "ManifestError": "kinetoscope.protocol.manifest",
    "Catalog": "catalog",
    "CatalogError": "catalog",
    "record_request_dir": "catalog",
    "resolve_catalog_url": "catalog",
}

__all__, __getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
