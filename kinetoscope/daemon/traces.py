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

from kinetoscope.daemon.paths import PathRefused, TraceRoot, open_dir_under, write_file_under
from kinetoscope.daemon.registry import PendingConfig, Process
from kinetoscope.protocol.manifest import (
    Manifest,
    ManifestFile,
    dumps_manifest,
    format_time,
    write_bytes_atomic,
)
from kinetoscope.protocol.tracefile import FileCheck, check_file

log = logging.getLogger("kinetoscope.daemon.traces")

_SAFE_NAME = re.compile(r"[^A-Za-z0-9._-]")


def safe_name(text: str) -> str:
    """A host name usable in a file name."""
    return _SAFE_NAME.sub("_", text) or "host"


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
            refused=status.get("reason"),
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
    # the daemon's trace root: the manifest is written without following symlinks below it
    root: str | TraceRoot | None = None
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
def file_status(path: str, root: str | TraceRoot | None = None) -> dict[str, Any]:
    """``exists`` (final name), ``bytes``, ``complete`` (whole JSON), ``writing`` (.tmp present)
    and ``reason`` (why a file that is there was not read: "symlink refused", "not a regular
    file: fifo", ...; else None).

    The traced process controls what is at ``path``: it is opened without following symlinks
    (below ``root`` when given, directories included), only a regular file is read, and only a
    bounded part of it (:mod:`kinetoscope.protocol.tracefile`)."""
    directory, name = os.path.split(path)
    check: FileCheck
    if root is None:
        check = check_file(path)
    else:
        try:
            dir_fd, _ = open_dir_under(root, directory)
        except PathRefused as exc:
            check = FileCheck(exists=True, reason=str(exc))
        except FileNotFoundError:
            check = FileCheck(exists=False)
        except OSError as exc:
            check = FileCheck(exists=False, reason=f"cannot open {directory}: {exc.strerror or exc}")
        else:
            try:
                check = check_file(name, dir_fd)
            finally:
                os.close(dir_fd)
    writing = not check.exists and os.path.lexists(path + ".tmp")
    return {
        "exists": check.exists,
        "bytes": check.bytes,
        "complete": check.complete,
        "writing": writing,
        "reason": check.reason,
    }


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
