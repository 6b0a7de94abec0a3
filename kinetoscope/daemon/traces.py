"""Trace requests issued through ``kscopeTrace``: their files, status and per-host manifest.

Why: the trigger must know, host by host, when every rank's file is finished - Kineto gives
no signal besides the file itself (written as ``<name>.tmp``, then renamed). Each request is
remembered (in memory, the newest ``max_records``) with the pending-config objects the
registry hands out, so status can say "delivered" (the process picked the config up),
"alive" (it still runs) and "complete" (the final file exists and is whole JSON).
"""

from __future__ import annotations

import logging
import os
import re
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import orjson

from kinetoscope.daemon.paths import PathRefused, write_file_under
from kinetoscope.daemon.registry import PendingConfig, Process
from kinetoscope.protocol.manifest import (
    Manifest,
    ManifestFile,
    dumps_manifest,
    format_time,
    write_bytes_atomic,
)

log = logging.getLogger("kinetoscope.daemon.traces")

_SAFE_NAME = re.compile(r"[^A-Za-z0-9._-]")


def safe_name(text: str) -> str:
    """A host name usable in a file name."""
    return _SAFE_NAME.sub("_", text) or "host"


FULL_PARSE_LIMIT = 64 << 20  # parse files up to this size; above, check the JSON's two ends


@dataclass
class TraceFile:
    """One process's expected trace file within a request."""

    process: Process
    log_file: str  # ACTIVITIES_LOG_FILE as configured
    path: str  # the file Kineto really writes (pid inserted)
    pending: PendingConfig
    retries: int = 0  # times the daemon re-sent the config after Kineto dropped it (handlers)

    def manifest_entry(self, hostname: str, status: dict[str, Any]) -> ManifestFile:
        info = self.process.info
        ident = self.process.identity
        return ManifestFile(
            file=os.path.basename(self.path),
            path=self.path,
            host=hostname,
            pid=self.process.pid,
            rank=info.rank if info else None,
            local_rank=info.local_rank if info else None,
            world_size=info.world_size if info else None,
            job_id=ident.id,
            cmdline=info.cmdline if info else None,
            bytes=status["bytes"],
            complete=bool(status["complete"]),
            host_pid=info.pid if info else None,
            container_pid=info.container_pid if info and info.in_other_pid_ns else None,
            job_source=ident.source,
            kineto_job_id=self.process.job_id,
            pod=ident.pod,
            namespace=ident.namespace,
        )


@dataclass
class TraceRecord:
    trace_id: str
    output_dir: str
    trace_dir: str
    config: str  # the part shared by every process (no ACTIVITIES_LOG_FILE line)
    root: str | None = (
        None  # the daemon's trace root: the manifest is written without following symlinks below it
    )
    created_at: float = field(default_factory=time.time)
    files: list[TraceFile] = field(default_factory=list)
    manifest_path: str | None = None
    _last_manifest: bytes | None = None


class TraceBook:
    """The newest ``max_records`` trace requests, by trace id (thread-safe)."""

    def __init__(self, max_records: int = 512) -> None:
        self.max_records = max_records
        self._records: OrderedDict[str, TraceRecord] = OrderedDict()
        self._lock = threading.Lock()

    def reserve(self, record: TraceRecord) -> bool:
        """Add ``record`` unless its trace id is taken (returns False then)."""
        with self._lock:
            if record.trace_id in self._records:
                return False
            self._records[record.trace_id] = record
            while len(self._records) > self.max_records:
                self._records.popitem(last=False)
            return True

    def discard(self, trace_id: str) -> None:
        with self._lock:
            self._records.pop(trace_id, None)

    def get(self, trace_id: str) -> TraceRecord | None:
        with self._lock:
            return self._records.get(trace_id)


# ---------------------------------------------------------------------------------------
# Files
# ---------------------------------------------------------------------------------------
_complete_cache: dict[tuple[str, int, int], bool] = {}
_cache_lock = threading.Lock()


def _json_complete(path: str, size: int) -> bool:
    """Whether the file is a whole JSON object: parsed in full up to FULL_PARSE_LIMIT bytes;
    larger files must start with ``{`` and end with ``}`` (Kineto writes them atomically via a
    rename, so a final name never holds a half-written file unless something else broke).
    A gzip file (``.json.gz``) must decompress to the end (its CRC checks out) and hold the same."""
    try:
        with open(path, "rb") as f:
            if f.read(2) == b"\x1f\x8b":
                f.seek(0)
                return _gzip_json_complete(f)
            f.seek(0)
            if size <= FULL_PARSE_LIMIT:
                try:
                    return isinstance(orjson.loads(f.read()), dict)
                except orjson.JSONDecodeError:
                    return False
            head = f.read(4096).lstrip()
            f.seek(max(0, size - 4096))
            tail = f.read().rstrip()
            return head.startswith(b"{") and tail.endswith(b"}")
    except OSError:
        return False


def _gzip_json_complete(f: Any) -> bool:
    import gzip
    import zlib

    head = b""
    tail = b""
    try:
        with gzip.open(f) as gz:
            while chunk := gz.read(1 << 20):
                if len(head) < 4096:
                    head += chunk[: 4096 - len(head)]
                tail = (tail + chunk)[-4096:]
    except (OSError, EOFError, zlib.error):
        return False
    return head.lstrip().startswith(b"{") and tail.rstrip().endswith(b"}")


def file_status(path: str) -> dict[str, Any]:
    """``exists`` (final name), ``bytes``, ``complete`` (whole JSON), ``writing`` (.tmp present)."""
    try:
        st = os.stat(path)
    except OSError:
        return {"exists": False, "bytes": None, "complete": False, "writing": os.path.exists(path + ".tmp")}
    key = (path, st.st_size, st.st_mtime_ns)
    with _cache_lock:
        complete = _complete_cache.get(key)
    if complete is None:
        complete = _json_complete(path, st.st_size)
        with _cache_lock:
            if len(_complete_cache) > 4096:
                _complete_cache.clear()
            _complete_cache[key] = complete
    return {"exists": True, "bytes": st.st_size, "complete": complete, "writing": False}


def write_manifest(record: TraceRecord, hostname: str, statuses: list[dict[str, Any]]) -> str | None:
    """Write ``manifest.<hostname>.json`` in the trace directory (atomically); None on failure.

    Rewritten only when its content changes (status calls refresh bytes/complete).
    """
    manifest = Manifest(
        trace_id=record.trace_id,
        created=format_time(record.created_at),
        config=record.config,
        host=hostname,
        files=[tf.manifest_entry(hostname, st) for tf, st in zip(record.files, statuses)],
    )
    data = dumps_manifest(manifest)
    path = os.path.join(record.trace_dir, f"manifest.{safe_name(hostname)}.json")
    if data == record._last_manifest:
        return path
    try:
        # no fsync: rewritten on every status change; a lost version is rewritten on the next call
        if record.root is not None:
            write_file_under(record.root, path, data)
        else:
            write_bytes_atomic(path, data, fsync=False)
    except (OSError, PathRefused) as exc:
        log.warning("cannot write manifest %s: %s", path, exc)
        return None
    record._last_manifest = data
    record.manifest_path = path
    return path
