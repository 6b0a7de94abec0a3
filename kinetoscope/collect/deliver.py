"""After the trigger: store a request's files and record it in the catalog.

What ``kscope trace --store URL`` and its catalog recording do, as a library, so that the web app
and the demo can do the same with a :class:`~kinetoscope.collect.trigger.TraceResult`:

.. code-block:: python

    res = trigger_trace(TraceRequest(hosts, target, options))
    record_trace_result(res)                       # as soon as the request is made
    res = wait_for_trace(res, timeout=120)
    stored = store_trace_result(res, "s3://bucket/traces") if res.files else []
    record_trace_result(res, stored=stored)        # upsert: sizes, sha256, storage URLs, status

Like the trigger, nothing here raises for a problem of the store or the catalog: an upload
failure is a ``store`` entry in ``result.errors`` (the local files are kept); a catalog failure is
a note (``result.notes``, starting with ``catalog:``), never a failed trace. Importing this module
imports neither s3fs nor SQLAlchemy (they load when used).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kinetoscope.collect.trigger import TraceProblem, TraceResult, build_manifest
from kinetoscope.errors import KinetoscopeError
from kinetoscope.protocol.manifest import MANIFEST_NAME, host_manifests, load_trace_dir, manifest_to_dict
from kinetoscope.protocol.tracefile import FileRefused, open_regular
from kinetoscope.store.storage import parse_store_options  # noqa: F401 - part of this API

if TYPE_CHECKING:
    from kinetoscope.store.catalog import Catalog, TraceRequestRecord
    from kinetoscope.store.retry import RetryPolicy
    from kinetoscope.store.storage import StoredObject, TraceStore

CATALOG_NOTE = "catalog:"


def _local_request_dir(result: TraceResult) -> Path | None:
    """The first request folder of ``result`` that exists on this machine with a manifest."""
    for d in result.output_dirs or sorted({os.path.dirname(f.path) for f in result.files}):
        p = Path(d)
        if p.is_dir() and ((p / MANIFEST_NAME).is_file() or host_manifests(p)):
            return p
    return None


def _add_note(result: TraceResult, note: str) -> None:
    if note not in result.notes:
        result.notes.append(note)


_SECRET_WORDS = ("key", "secret", "token", "password", "credential")


def _retry_hint(
    trace_dir: Path | str, store_url: str, storage_options: Mapping[str, Any] | None = None
) -> str:
    """The command that uploads (and records) the folder again; secrets are never printed."""
    opts = "".join(
        f" --store-option {k}={v}"
        for k, v in (storage_options or {}).items()
        if not any(w in k.lower() for w in _SECRET_WORDS) and isinstance(v, (str, int, bool))
    )
    return f"kscope catalog import {trace_dir} --store {store_url}{opts}"


def refused_local_files(trace_dir: Path, entries: Sequence[Mapping[str, Any]]) -> dict[str, str]:
    """file name -> why it must not be uploaded, for the entries whose file is in ``trace_dir``.

    Each is opened the way the upload may read it - relative to the folder, without following a
    symlink (``O_NOFOLLOW``), without waiting on a FIFO (``O_NONBLOCK``) - and only a regular
    file with one link passes (:func:`kinetoscope.protocol.tracefile.open_regular`): a traced
    process that planted a symlink to an operator's file must not get it stored (issue 32)."""
    out: dict[str, str] = {}
    try:
        dir_fd = os.open(trace_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        return {str(e["file"]): f"cannot open {trace_dir}: {exc.strerror or exc}" for e in entries}
    try:
        for e in entries:
            name = str(e["file"])
            try:
                fd, _st = open_regular(name, dir_fd)
            except FileNotFoundError:
                if _names_a_file_elsewhere(trace_dir, e):  # the upload would fall back to it
                    out[name] = f"its manifest names a file outside {trace_dir}: {e.get('path')}"
                continue  # not on this machine (another host's file)
            except FileRefused as exc:
                out[name] = exc.reason
                continue
            except OSError as exc:
                out[name] = f"cannot open: {exc.strerror or exc}"
                continue
            os.close(fd)
    finally:
        os.close(dir_fd)
    return out


def _names_a_file_elsewhere(trace_dir: Path, entry: Mapping[str, Any]) -> bool:
    """Whether ``entry``'s ``path`` is an existing file outside ``trace_dir`` (any manifest in the
    folder - one a traced process planted too - may say so; it is never uploaded from here)."""
    path = entry.get("path")
    if not isinstance(path, str) or not path:
        return False
    inside = os.path.dirname(os.path.normpath(path)) == os.path.normpath(trace_dir)
    return not inside and os.path.lexists(path)


def _note_refused(result: TraceResult, refused: Mapping[str, str]) -> None:
    for f in result.files:
        reason = refused.get(os.path.basename(f.path))
        if reason:
            f.refused, f.complete = reason, False


def store_trace_result(
    result: TraceResult,
    store: TraceStore | str | os.PathLike[str],
    *,
    storage_options: Mapping[str, Any] | None = None,
    retry: RetryPolicy | None = None,
) -> list[StoredObject]:
    """Upload every complete file of the request that is on this machine, plus its manifest(s),
    with :func:`kinetoscope.store.upload.upload_trace_request` (atomic, sha256-verified, retried).

    Returns the stored objects (the manifest last) and sets ``result.stored`` /
    ``result.store_url``. ``storage_options`` (fsspec/s3fs: ``endpoint_url``...) are used when
    ``store`` is a URL, and shown (secrets left out) in the retry command of error messages.

    Problems become ``kind="store"`` entries in ``result.errors``: the upload failed (the message
    names the file and URL; the local files are kept and the command to retry is given), or
    complete files are not on this machine (another host's local folder)."""
    from kinetoscope.store.storage import TraceStore
    from kinetoscope.store.upload import PartialUploadError, upload_trace_request

    url = store.url if isinstance(store, TraceStore) else os.fspath(store)
    result.store_url = url
    if not result.files:
        return []
    trace_dir = _local_request_dir(result)
    if trace_dir is None:
        where = ", ".join(result.output_dirs) or "its request folder"
        _store_problem(
            result,
            None,
            f"cannot store trace {result.trace_id} in {url}: its files are not on this machine "
            f"({where} does not exist here). Run `{_retry_hint('<dir>', url, storage_options)}` on each "
            "host that has them, or put the daemons' trace root on shared storage",
        )
        return []
    try:
        ts = (
            store
            if isinstance(store, TraceStore)
            else TraceStore(url, storage_options=storage_options, retry=retry)
        )
        result.store_url = ts.url
        entries = load_trace_dir(trace_dir)["files"]
        expected = [e for e in entries if e.get("complete") is not False]
        if _refused_now(result, trace_dir, expected, url):
            return []
        objs = upload_trace_request(trace_dir, ts, update_local=_writable(trace_dir))
    except PartialUploadError as exc:  # disk full, quota...: what arrived is kept and recorded
        result.stored, result.store_error = list(exc.stored), str(exc.manifest["store_error"])
        _store_problem(
            result,
            trace_dir,
            f"storing trace {result.trace_id} in {url} stopped part-way ({result.store_error}); "
            f"recorded as partial. The trace files are kept in {trace_dir}; finish with "
            f"`{_retry_hint(trace_dir, url, storage_options)}`",
        )
        return []
    except (KinetoscopeError, OSError) as exc:
        what = (
            str(exc)
            if isinstance(exc, KinetoscopeError)
            else f"{exc.filename or trace_dir}: {exc.strerror or exc}"
        )
        _store_problem(
            result,
            trace_dir,
            f"storing trace {result.trace_id} in {url} failed: {what}. Nothing was lost: the trace files "
            f"are kept in {trace_dir}; retry with `{_retry_hint(trace_dir, url, storage_options)}`",
        )
        return []
    result.stored = list(objs)
    _report_upload(
        result, trace_dir, entries, expected, objs, ts.url, _retry_hint("<dir>", url, storage_options)
    )
    return objs


def _store_problem(result: TraceResult, trace_dir: Path | None, message: str) -> None:
    path = str(trace_dir) if trace_dir is not None else None
    result.errors.append(TraceProblem(kind="store", path=path, message=message))


def _writable(trace_dir: Path) -> bool:
    """Whether this user may update the folder's manifest. The trigger's user may not own the
    daemon-made folder: then only the stored manifest.json carries sha256/url (and the catalog
    gets them from the stored objects)."""
    manifest = trace_dir / MANIFEST_NAME
    return os.access(trace_dir, os.W_OK) and (not manifest.exists() or os.access(manifest, os.W_OK))


def _refused_now(result: TraceResult, trace_dir: Path, expected: list[dict[str, Any]], url: str) -> bool:
    """Whether a file listed as complete is no longer a regular trace file (then nothing is stored)."""
    refused = refused_local_files(trace_dir, expected)
    if not refused:
        return False
    _note_refused(result, refused)
    listed = "; ".join(f"{name}: {why}" for name, why in sorted(refused.items()))
    _store_problem(
        result,
        trace_dir,
        f"nothing of trace {result.trace_id} was stored in {url}: {len(refused)} file(s) "
        f"listed as complete are not regular trace files now ({listed}); a traced process "
        "replaced them after they were checked, so they are not read (docs/security.md)",
    )
    return True


def _report_upload(
    result: TraceResult,
    trace_dir: Path,
    entries: list[dict[str, Any]],
    expected: list[dict[str, Any]],
    objs: Sequence[StoredObject],
    store_url: str,
    hint: str,
) -> None:
    """Errors and notes about what the upload left out: complete files of other hosts, planted
    files, incomplete files."""
    uploaded = {o.key.rsplit("/", 1)[-1] for o in objs}
    missing = [e for e in expected if e["file"] not in uploaded]
    if missing:
        listed = ", ".join(f"{e['file']} (host {e.get('host') or '?'})" for e in missing)
        _store_problem(
            result,
            trace_dir,
            f"{len(missing)} complete trace file(s) of {result.trace_id} are not on this machine and "
            f"were not stored in {store_url}: {listed}; run `{hint}` on their host",
        )
    skipped = len(entries) - len(expected)
    planted = [e for e in entries if e.get("refused")]
    if planted:
        _add_note(
            result,
            f"{len(planted)} file(s) not stored because they are not regular trace files: "
            + "; ".join(f"{e['file']}: {e['refused']}" for e in planted),
        )
    if skipped > 0:
        _add_note(result, f"{skipped} incomplete trace file(s) were not stored; they stay in {trace_dir}")


def trace_result_manifest(result: TraceResult) -> tuple[dict[str, Any], Path | None]:
    """The manifest to record for ``result`` and the folder it describes: the request folder's
    merged manifest(s) when they are on this machine (after an upload they carry ``sha256``,
    ``url``, ``store_url``), else the one built from ``result``; ``hosts`` are the daemons' host
    names, ``status`` is ``requested`` until the result has been waited for."""
    trace_dir = _local_request_dir(result)
    doc: dict[str, Any] | None = None
    if trace_dir is not None:
        try:
            doc = load_trace_dir(trace_dir)
        except KinetoscopeError:
            doc = None
        if doc is not None and doc.get("trace_id") != result.trace_id:
            doc = None
    if doc is None:
        doc = manifest_to_dict(build_manifest(result))
    by_name = {o.key.rsplit("/", 1)[-1]: o for o in result.stored}
    for e in doc["files"]:  # what the upload verified, also when the local manifest was not rewritten
        o = by_name.get(e["file"])
        if o is not None:
            e.update(sha256=o.sha256, bytes=o.bytes, url=o.url, key=o.key)
    if result.stored and result.store_url:
        doc["store_url"] = result.store_url
    # The catalog lists host names (as its files and jobs do), not the daemon addresses
    # (host:port) the trigger's manifest.json keeps in "hosts".
    names = {m.host: m.hostname for m in result.matched}
    doc["hosts"] = list(dict.fromkeys(names.get(str(h), h.host) for h in result.hosts))
    if not result.waited:
        doc["status"] = "requested"  # triggered; completeness not checked yet
        if result.waiter:
            doc["waiter"] = dict(result.waiter)
    else:
        doc.pop("status", None)  # the catalog works it out from the files
    if result.store_error:  # the upload stopped part-way: say so (as `catalog import --store`)
        doc["status"], doc["store_error"] = "partial", result.store_error
    return doc, trace_dir


def record_trace_result(
    result: TraceResult,
    catalog_url: str | os.PathLike[str] | Catalog | None = None,
    stored: Sequence[StoredObject] | None = None,
    *,
    raise_errors: bool = False,
    hash_local_files: bool = False,
) -> TraceRequestRecord | None:
    """Record (upsert) the request in the catalog: ``catalog_url`` (a URL, or an open
    :class:`~kinetoscope.store.catalog.Catalog`, left open), else ``$KSCOPE_CATALOG``, else
    ``~/.kinetoscope/catalog.db``. Call it as soon as the request is made and again after
    waiting/uploading: the second call fills in sizes, sha256, storage URLs and completeness.
    This is the one trigger -> wait -> record step of ``kscope trace``, the web app and the demo.

    ``stored`` defaults to ``result.stored``. ``hash_local_files``: when the request folder is on
    this machine, import it with the files' sizes and sha256 (``Catalog.import_trace_dir``; the
    web app, which serves those files); otherwise the manifest is recorded as it is. Returns the
    catalog's record, or None when there is nothing to record (no file was triggered) or recording
    failed: then a note starting with ``catalog:`` explains why (``raise_errors=True`` raises
    instead). Sets ``result.catalog`` to the catalog's URL (password hidden) on success."""
    if not result.files:
        return None
    objs = list(stored if stored is not None else result.stored)
    try:
        from kinetoscope.store.catalog import Catalog

        doc, trace_dir = trace_result_manifest(result)
        with contextlib.ExitStack() as stack:
            if isinstance(catalog_url, Catalog):
                cat = catalog_url
            else:
                cat = stack.enter_context(Catalog.open(catalog_url))
            if hash_local_files and trace_dir is not None and not objs:
                rec = cat.import_trace_dir(trace_dir)
            else:
                rec = cat.record_trace_request(doc, objs or None, base_dir=trace_dir)
            result.catalog = cat.display_url
            return rec
    except (KinetoscopeError, OSError, ImportError) as exc:
        if raise_errors:
            raise
        if isinstance(exc, KinetoscopeError):
            why = str(exc)
        elif isinstance(exc, OSError):
            why = f"{exc.strerror or exc}"
        else:
            why = f"a catalog dependency is not installed ({exc})"
        _add_note(
            result,
            f"{CATALOG_NOTE} could not record trace {result.trace_id}: {why} "
            "(the trace itself is fine; record it later with `kscope catalog import <dir>`)",
        )
        return None


ABANDONED = "abandoned"


def job_step_rate(
    job_id: str | int, catalog_url: str | os.PathLike[str] | None = None
) -> tuple[float, str] | None:
    """The job's step rate (steps/s) from the newest analysis in the catalog of a trace of that
    job (its ``step_time_ms``), with the trace id it came from; None when the catalog knows none
    (or cannot be opened: the caller's own recording reports that). Used to align iteration
    windows (``TraceOptions.steps_per_s``)."""
    try:
        from kinetoscope.store.catalog import Catalog

        with Catalog.open(catalog_url) as cat:
            for rec in cat.trace_requests(job_id=str(job_id), limit=20):
                for a in cat.analyses(trace_id=rec.trace_id, limit=5):
                    if a.step_time_ms and a.step_time_ms > 0:
                        return 1000.0 / a.step_time_ms, rec.trace_id
    except (KinetoscopeError, OSError, ImportError):
        return None
    return None


def waiter_info() -> dict[str, Any]:
    """This process as the waiter of a request: host name, pid and start time (epoch seconds;
    with the pid it identifies the process even after the pid is reused)."""
    import socket

    import psutil

    return {
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "started": round(psutil.Process().create_time(), 3),
    }


def _waiter_gone(waiter: Any, hostname: str) -> bool:
    """Whether ``waiter`` (a catalog row's ``waiter``) was a process of this host that is gone.
    Waiters on other hosts cannot be checked from here and are left alone."""
    import psutil

    if not isinstance(waiter, Mapping) or waiter.get("host") != hostname:
        return False
    pid, started = waiter.get("pid"), waiter.get("started")
    if isinstance(pid, bool) or not isinstance(pid, int) or not isinstance(started, (int, float)):
        return False
    try:
        return bool(abs(psutil.Process(pid).create_time() - float(started)) > 1.0)  # pid reused
    except psutil.NoSuchProcess:
        return True
    except psutil.Error:  # e.g. access denied: it exists
        return False


def mark_abandoned_requests(catalog_url: str | os.PathLike[str] | None = None) -> list[str]:
    """Mark ``abandoned`` the catalog's ``requested`` rows whose waiter (a ``kscope trace --wait`` /
    ``--store`` of this host) is gone: it was killed before it could record the outcome, so the
    row would otherwise say "requested" forever. Returns their trace ids; a catalog that cannot be
    opened gives [] (the caller's own recording reports that)."""
    import socket

    from kinetoscope.store.catalog import Catalog

    hostname = socket.gethostname()
    marked: list[str] = []
    try:
        with Catalog.open(catalog_url) as cat:
            for rec in cat.trace_requests(status="requested", limit=None, with_manifest=True):
                if not _waiter_gone(rec.manifest.get("waiter"), hostname):
                    continue
                doc = {k: v for k, v in rec.manifest.items() if k != "waiter"}
                doc["status"] = ABANDONED
                doc["abandoned_waiter"] = rec.manifest.get("waiter")
                cat.record_trace_request(doc)
                marked.append(rec.trace_id)
    except (KinetoscopeError, OSError, ImportError):
        return marked
    return marked


__all__ = [
    "job_step_rate",
    "mark_abandoned_requests",
    "waiter_info",
    "parse_store_options",
    "record_trace_result",
    "refused_local_files",
    "store_trace_result",
    "trace_result_manifest",
]
