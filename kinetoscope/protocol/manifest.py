"""``manifest.json``: what one trace request produced (schema in docs/architecture.md).

The one module that reads and writes the manifest format, for every part of kinetoscope:

* the trigger (``kscope trace``) writes ``manifest.json`` in the request's folder and rewrites it
  after ``--wait`` with sizes and completeness (typed: :class:`Manifest`, :func:`write_manifest`);
* each daemon writes ``manifest.<hostname>.json`` for its own processes (:func:`encode_manifest`,
  :func:`write_bytes_atomic`);
* the store and the catalog read a request folder as one merged, validated JSON object
  (:func:`load_trace_dir`, :func:`validate_manifest`, :func:`merge_manifests`) and the upload
  rewrites it with ``sha256``/``url``/``key`` per file and ``store_url`` (:func:`dumps_manifest`);
* the analyzer reads ranks from it (typed: :func:`read_manifest`, :func:`read_manifests`).

Files a manifest names are read only inside the manifest's folder (:func:`folder_file`,
:func:`find_local_file`): a ``path`` or ``file`` that leads elsewhere (absolute, ``..``, a symlink)
is refused with a :class:`ManifestError` naming the manifest and the field, and only regular files
are opened (``O_NOFOLLOW``/``O_NONBLOCK``, ``fstat``). Manifests themselves are read the same way,
bounded (:func:`read_regular_bytes`).

Readers are tolerant (unknown keys are kept in the JSON view and ignored by the typed view, optional
fields may be missing) but refuse what would make the catalog or storage keys wrong: a missing or
unsafe ``trace_id``, a ``files`` entry without a plain file name, fields of the wrong type, a
newer ``kinetoscope_manifest`` version. Every such error is a :class:`ManifestError` naming the
file and what is wrong.
"""

from __future__ import annotations

import copy
import errno
import os
import re
import stat
import tempfile
from collections.abc import Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import msgspec
import orjson

from kinetoscope.errors import KinetoscopeError
from kinetoscope.protocol.structinfo import prime_structs

MANIFEST_NAME = "manifest.json"
MANIFEST_VERSION = 1
MAX_MANIFEST_BYTES = 64 << 20  # a manifest lists files: real ones are kilobytes
# What readers accept as a trace id (a folder name and a storage key segment). New ids made by
# ``kscope trace`` are stricter (kinetoscope.collect.trigger.validate_trace_id).
TRACE_ID_RE = re.compile(r"\A[A-Za-z0-9][A-Za-z0-9._-]{0,199}\Z")

_INT_FIELDS = (
    "pid", "rank", "local_rank", "world_size", "bytes", "iterations", "group_rank", "host_pid", "container_pid",
)  # fmt: skip
_STR_FIELDS = (
    "host", "job_id", "cmdline", "path", "sha256", "url", "key", "refused", "job_source", "kineto_job_id", "pod",
    "namespace",
)  # fmt: skip
_TOP_STR_FIELDS = ("config", "requested_by", "status", "job_id", "store_url", "host", "updated")


class ManifestError(KinetoscopeError):
    """A manifest is missing, not JSON, or does not follow the schema."""


# ---------------------------------------------------------------------------------------------
# Times: ISO 8601 UTC with "Z", second precision ("2026-11-21T05:30:12Z")
# ---------------------------------------------------------------------------------------------
def parse_time(value: Any, *, what: str = "time") -> datetime | None:
    """ISO 8601 (``2026-11-21T05:30:12Z``) or epoch seconds → aware UTC datetime."""
    if value is None or value == "":
        return None
    if isinstance(value, datetime):
        dt = value
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        dt = datetime.fromtimestamp(float(value), tz=timezone.utc)
    elif isinstance(value, str):
        try:
            dt = datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
        except ValueError as exc:
            raise ManifestError(f"{what}: not an ISO 8601 time: {value!r}") from exc
    else:
        raise ManifestError(f"{what}: not a time: {value!r}")
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=timezone.utc)
    return dt.astimezone(timezone.utc)


def format_time(dt: datetime | float | None) -> str | None:
    """A datetime (naive = UTC) or epoch seconds → ``2026-11-21T05:30:12Z``."""
    if dt is None:
        return None
    if isinstance(dt, (int, float)):
        dt = datetime.fromtimestamp(float(dt), tz=timezone.utc)
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=timezone.utc)
    return dt.astimezone(timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")


def utc_now_iso() -> str:
    """Now, as manifests write times."""
    return format_time(datetime.now(timezone.utc)) or ""


# ---------------------------------------------------------------------------------------------
# Typed view
# ---------------------------------------------------------------------------------------------
class ManifestFile(msgspec.Struct, kw_only=True, omit_defaults=False):
    """One trace file of the request (one traced process)."""

    file: str  # base name, e.g. "rank-3_4242.pt.trace.json"
    path: str | None = None  # absolute path on ``host``
    host: str | None = None
    pid: int | None = None
    rank: int | None = None
    local_rank: int | None = None
    world_size: int | None = None
    job_id: str | None = None
    cmdline: str | None = None
    bytes: int | None = None
    complete: bool = False
    # Extensions (written only when set): from the daemon, the upload and the catalog.
    group_rank: int | None = None
    iterations: int | None = None
    duration_ms: float | None = None
    sha256: str | None = None  # added by the upload, with url/key
    url: str | None = None
    key: str | None = None
    # why the file at this name was not read or uploaded ("symlink refused", "not a regular
    # file: fifo", ...): a traced process controls what it leaves there (docs/security.md)
    refused: str | None = None
    # Namespaces and job identity (docs/deploy.md): ``pid`` is the pid the process has itself
    # (in a container: the container's pid, the one in the file name); ``host_pid`` the daemon's
    # view of it; ``container_pid`` only when the two differ. ``job_id`` is the job identity
    # (kinetoscope.protocol.jobident), ``kineto_job_id`` what libkineto reported (SLURM_JOB_ID or 0).
    host_pid: int | None = None
    container_pid: int | None = None
    job_source: str | None = None
    kineto_job_id: str | None = None
    pod: str | None = None
    namespace: str | None = None


class Manifest(msgspec.Struct, kw_only=True, omit_defaults=False):
    kinetoscope_manifest: int = MANIFEST_VERSION
    trace_id: str
    created: str | None = None  # ISO-8601 UTC, e.g. "2026-11-21T05:30:12Z"
    config: str = ""
    files: list[ManifestFile] = []
    # Extensions (readers must not require them; written only when set).
    request: dict[str, Any] | None = None  # the trigger's target and options
    hosts: list[str] | None = None  # the daemons asked
    updated: str | None = None  # the trigger's rewrite after --wait
    host: str | None = None  # a daemon's manifest.<host>.json: that host
    job_id: str | None = None
    requested_by: str | None = None
    status: str | None = None
    store_url: str | None = None  # added by the upload

    def by_rank(self) -> dict[int, ManifestFile]:
        return {f.rank: f for f in self.files if f.rank is not None}

    def to_dict(self) -> dict[str, Any]:
        """The JSON object this manifest is written as (extensions left out when unset)."""
        return manifest_to_dict(self)


_CORE_FILE_FIELDS = ManifestFile.__struct_fields__[: ManifestFile.__struct_fields__.index("group_rank")]
_CORE_TOP_FIELDS = Manifest.__struct_fields__[: Manifest.__struct_fields__.index("request")]


def manifest_to_dict(manifest: Manifest) -> dict[str, Any]:
    """Core fields always (nulls included, as docs/architecture.md shows them), extensions only
    when set."""
    doc: dict[str, Any] = msgspec.to_builtins(manifest)
    for k in list(doc):
        if k not in _CORE_TOP_FIELDS and doc[k] is None:
            del doc[k]
    for entry in doc["files"]:
        for k in list(entry):
            if k not in _CORE_FILE_FIELDS and entry[k] is None:
                del entry[k]
    return doc


def manifest_from_dict(doc: Any, source: str = "manifest") -> Manifest:
    """Validate a JSON object (:func:`validate_manifest`) and give its typed view."""
    clean = validate_manifest(doc, source)
    clean = {k: v for k, v in clean.items() if v is not None}
    if "created" in clean and not isinstance(clean["created"], str):  # epoch seconds
        clean["created"] = format_time(parse_time(clean["created"]))
    clean["files"] = [{k: v for k, v in e.items() if v is not None} for e in clean["files"]]
    try:
        return msgspec.convert(clean, Manifest)
    except msgspec.ValidationError as exc:
        raise _schema_error(source, str(exc)) from exc


# ---------------------------------------------------------------------------------------------
# Validation (the JSON view: unknown keys kept)
# ---------------------------------------------------------------------------------------------
def _schema_error(source: str, what: str) -> ManifestError:
    return ManifestError(f"{source} does not follow the kinetoscope manifest schema: {what}")


def _check_int(entry: Mapping[str, Any], key: str, where: str, source: str) -> None:
    v = entry.get(key)
    if v is None:
        return
    if isinstance(v, bool) or not isinstance(v, int):
        if isinstance(v, float) and v.is_integer():
            return
        raise _schema_error(source, f"{where}{key!r} must be an integer or null, got {v!r}")


def validate_manifest(doc: Any, source: str = "manifest") -> dict[str, Any]:
    """Check ``doc`` and return a normalised deep copy: ``files`` always a list, each entry with
    a ``file`` name, integral floats as ints, numeric ids (``job_id``...) as strings."""
    if not isinstance(doc, Mapping):
        raise _schema_error(source, f"must be a JSON object, got {type(doc).__name__}")
    _check_header(doc, source)
    files = doc.get("files", [])
    if files is None:
        files = []
    if not isinstance(files, list):
        raise _schema_error(source, "'files' must be a list")
    seen: set[str] = set()
    for i, entry in enumerate(files):
        _check_entry(entry, f"files[{i}]: ", seen, source)
    return _normalised(doc, files)


def _check_header(doc: Mapping[str, Any], source: str) -> None:
    """The top-level fields: version (refused when newer than this reader), trace id, times,
    strings, hosts, request."""
    version = doc.get("kinetoscope_manifest")
    if version is None:
        raise _schema_error(source, "not a Kinetoscope manifest (no 'kinetoscope_manifest' key)")
    if isinstance(version, bool) or not isinstance(version, int):
        raise _schema_error(source, f"'kinetoscope_manifest' must be an integer, got {version!r}")
    if version > MANIFEST_VERSION:
        raise ManifestError(
            f"{source} has manifest version {version}, newer than this kinetoscope reads "
            f"(version {MANIFEST_VERSION}); upgrade kinetoscope"
        )
    trace_id = doc.get("trace_id")
    if not isinstance(trace_id, str) or not TRACE_ID_RE.match(trace_id):
        raise _schema_error(source, f"'trace_id' must be letters, digits, '-', '_' or '.', got {trace_id!r}")
    parse_time(doc.get("created"), what=f"{source}: 'created'")
    for key in _TOP_STR_FIELDS:
        v = doc.get(key)
        if v is not None and not isinstance(v, str) and not (key == "job_id" and type(v) is int):
            raise _schema_error(source, f"{key!r} must be a string, got {v!r}")
    hosts = doc.get("hosts")
    if hosts is not None and (not isinstance(hosts, list) or not all(isinstance(h, str) for h in hosts)):
        raise _schema_error(source, "'hosts' must be a list of host names")
    if doc.get("request") is not None and not isinstance(doc["request"], Mapping):
        raise _schema_error(source, "'request' must be an object")


def _check_entry(entry: Any, where: str, seen: set[str], source: str) -> None:
    """One ``files`` entry (``where``: its position, for messages); its name joins ``seen``."""
    if not isinstance(entry, Mapping):
        raise _schema_error(source, f"{where}must be an object")
    name = entry.get("file")
    if name is None and isinstance(entry.get("path"), str):
        name = os.path.basename(entry["path"])
    if not isinstance(name, str) or not name or "/" in name or "\\" in name or name in (".", ".."):
        raise _schema_error(source, f"{where}'file' must be a plain file name, got {name!r}")
    if name in seen:
        raise _schema_error(source, f"{where}file {name!r} is listed twice")
    seen.add(name)
    for key in _INT_FIELDS:
        _check_int(entry, key, where, source)
    for key in _STR_FIELDS:
        v = entry.get(key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, (str, int))):
            raise _schema_error(source, f"{where}{key!r} must be a string, got {v!r}")
    c = entry.get("complete")
    if c is not None and not isinstance(c, bool):
        raise _schema_error(source, f"{where}'complete' must be true/false, got {c!r}")
    d = entry.get("duration_ms")
    if d is not None and (isinstance(d, bool) or not isinstance(d, (int, float))):
        raise _schema_error(source, f"{where}'duration_ms' must be a number, got {d!r}")


def _normalised(doc: Mapping[str, Any], files: list[Any]) -> dict[str, Any]:
    """A deep copy of a checked manifest: ``files`` a list of entries, each with a ``file``
    name, integral floats as ints, numeric ids as strings."""
    out = copy.deepcopy(dict(doc))
    out_files = []
    for entry in files:
        e = copy.deepcopy(dict(entry))
        if e.get("file") is None:
            e["file"] = os.path.basename(e["path"])
        for key in _INT_FIELDS:
            if isinstance(e.get(key), float):
                e[key] = int(e[key])
        for key in _STR_FIELDS:
            if type(e.get(key)) is int:
                e[key] = str(e[key])
        out_files.append(e)
    out["files"] = out_files
    if type(out.get("job_id")) is int:
        out["job_id"] = str(out["job_id"])
    return out


# ---------------------------------------------------------------------------------------------
# Encoding and atomic writes
# ---------------------------------------------------------------------------------------------
def dumps_manifest(doc: Manifest | Mapping[str, Any]) -> bytes:
    """The bytes of a manifest file (2-space indented JSON, newline-terminated)."""
    if isinstance(doc, Manifest):
        doc = manifest_to_dict(doc)
    return orjson.dumps(doc, option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS) + b"\n"


encode_manifest = dumps_manifest


def loads_manifest(data: bytes, source: str = "manifest") -> dict[str, Any]:
    """Parse and validate manifest bytes (the JSON view)."""
    try:
        doc = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise ManifestError(f"{source} is not valid JSON ({exc})") from exc
    return validate_manifest(doc, source)


def decode_manifest(data: bytes, source: str = "manifest") -> Manifest:
    """Parse and validate manifest bytes into the typed view."""
    return manifest_from_dict(loads_manifest(data, source), source)


def write_bytes_atomic(
    path: str | os.PathLike[str], data: bytes, *, fsync: bool = True, mode: int = 0o644
) -> Path:
    """Write ``data`` to ``path`` so that readers see the old file or the whole new one, never a
    part: a hidden temporary file in the same folder, renamed over ``path``. Raises ``OSError``
    (the temporary file is removed)."""
    target = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            if fsync:
                fh.flush()
                os.fsync(fh.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target


def write_manifest(
    manifest: Manifest | Mapping[str, Any] | bytes,
    directory: str | os.PathLike[str],
    name: str = MANIFEST_NAME,
) -> Path:
    """Write atomically (temp file + rename) into ``directory`` (created if needed). ``bytes``:
    a manifest already encoded by :func:`dumps_manifest` (one encoding for many folders)."""
    folder = Path(directory)
    folder.mkdir(parents=True, exist_ok=True)
    data = manifest if isinstance(manifest, bytes) else dumps_manifest(manifest)
    return write_bytes_atomic(folder / name, data)


# ---------------------------------------------------------------------------------------------
# Reading files and request folders
# ---------------------------------------------------------------------------------------------
def _kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
    ):
        if test(mode):
            return name
    return "not a regular file"


def _open_regular(path: str | os.PathLike[str], *, follow: bool) -> int:
    """A descriptor of ``path`` opened without blocking (a FIFO would wait for a writer) and
    checked with ``fstat`` to be a regular file; ``follow=False`` refuses a symlink as the last
    component (``O_NOFOLLOW``). Raises ``OSError`` (``ENXIO``-style errors) or ``_NotRegular``."""
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow else os.O_NOFOLLOW)
    fd = os.open(path, flags)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise _NotRegular(_kind(mode))
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


class _NotRegular(Exception):
    pass


def read_regular_bytes(
    path: str | os.PathLike[str],
    *,
    limit: int = MAX_MANIFEST_BYTES,
    follow: bool = True,
    what: str = "manifest",
) -> bytes:
    """The bytes of a regular file, at most ``limit`` of them: a FIFO, device or directory (or,
    with ``follow=False``, a symlink) is a :class:`ManifestError`, never a blocked or endless
    read. Used for every manifest this package reads."""
    p = Path(path)
    try:
        fd = _open_regular(p, follow=follow)
    except FileNotFoundError as exc:
        raise ManifestError(f"no {what} at {p}") from exc
    except _NotRegular as exc:
        raise ManifestError(f"{what} {p} is {exc}, not a regular file: refused") from None
    except OSError as exc:
        if not follow and exc.errno == errno.ELOOP:  # ELOOP: O_NOFOLLOW met a symlink
            raise ManifestError(f"{what} {p} is a symlink: refused (only regular files are read)") from None
        raise ManifestError(f"cannot read {what} {p}: {exc.strerror or exc}") from exc
    with os.fdopen(fd, "rb") as fh:
        data = fh.read(limit + 1)
    if len(data) > limit:
        raise ManifestError(f"{what} {p} is larger than {limit} bytes: refused")
    return data


def read_manifest_file(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Parse and validate one manifest file (the JSON view); a regular file of at most
    ``MAX_MANIFEST_BYTES``."""
    p = Path(path)
    return loads_manifest(read_regular_bytes(p), str(p))


def folder_file(trace_dir: str | os.PathLike[str], name: str, *, source: str, field: str) -> Path | None:
    """The regular file ``name`` (a file name, or a path relative to ``trace_dir`` or absolute)
    names inside the request folder ``trace_dir``, every symlink resolved; None when nothing is
    there (another host's file). What leads outside the folder (an absolute path elsewhere,
    ``..``, a symlink out) or is not a regular file (FIFO, device, directory) is a
    :class:`ManifestError` naming ``source`` (the manifest) and ``field`` (``files[3].path``):
    manifests come from traced hosts and imports, so nothing they say may widen what is read."""
    root = Path(trace_dir).resolve()
    raw = Path(name)
    cand = raw if raw.is_absolute() else root / raw
    if not os.path.lexists(cand):
        return None
    try:
        real = cand.resolve(strict=True)
    except (OSError, RuntimeError):  # a dangling or looping symlink: nothing readable there
        return None
    if real == root or not real.is_relative_to(root):
        raise ManifestError(
            f"{source}: {field} {name!r} leads outside the request folder {root} (to {real}): refused; "
            "only files inside the manifest's folder are read"
        )
    try:
        os.close(_open_regular(real, follow=False))
    except _NotRegular as exc:
        raise ManifestError(f"{source}: {field} {name!r} is {exc}, not a regular file: refused") from None
    except OSError as exc:
        raise ManifestError(f"{source}: {field} {name!r}: cannot open: {exc.strerror or exc}") from None
    return real


def read_manifest(path: str | os.PathLike[str]) -> Manifest:
    """Read ``manifest.json`` (``path`` may be the file or the request folder); typed."""
    p = Path(path)
    if p.is_dir():
        p = p / MANIFEST_NAME
    return manifest_from_dict(read_manifest_file(p), str(p))


def host_manifests(trace_dir: str | os.PathLike[str]) -> list[Path]:
    """The daemons' ``manifest.<host>.json`` files of a request folder, sorted (symlinks and
    anything but regular files left out: a manifest is read only from the folder itself)."""
    out = []
    for p in Path(trace_dir).glob("manifest.*.json"):
        try:
            st = p.lstat()
        except OSError:
            continue
        if stat.S_ISREG(st.st_mode):
            out.append(p)
    return sorted(out)


def merge_manifests(
    main: dict[str, Any] | None, per_host: list[dict[str, Any]], source: str, names: list[str] | None = None
) -> dict[str, Any]:
    """Combine ``manifest.json`` with the daemons' ``manifest.<host>.json`` (same trace_id).

    Files are matched by name. The first manifest's values are kept; later ones fill its gaps
    (missing or null fields, files it does not list), and a file that any of them reports
    ``"complete": true`` is complete, with that manifest's ``bytes`` (the daemon sees its files
    finish; the trigger may have written its manifest before). ``names`` label the documents in
    messages (default: ``manifest #n``).
    """
    docs = ([main] if main else []) + list(per_host)
    labels = names or [f"manifest #{i}" for i in range(len(docs))]
    if not docs:
        raise ManifestError(f"{source}: no {MANIFEST_NAME} or manifest.<host>.json")
    first = docs[0]
    for d, label in zip(docs[1:], labels[1:]):
        if d["trace_id"] != first["trace_id"]:
            raise ManifestError(
                f"{source}: manifests disagree on trace_id: {label} is for trace "
                f"{d['trace_id']!r}, {labels[0]} for {first['trace_id']!r}"
            )
    merged = copy.deepcopy(first)
    if main is None:
        merged.pop("host", None)  # a daemon's own host; the merged request spans hosts
    by_name: dict[str, dict[str, Any]] = {e["file"]: e for e in merged["files"]}
    order = [e["file"] for e in merged["files"]]
    hosts = list(merged.get("hosts") or [])
    for d in docs[1:]:
        for k, v in d.items():
            if k != "host" and merged.get(k) is None and v is not None:
                merged[k] = copy.deepcopy(v)
        for h in d.get("hosts") or []:
            if h not in hosts:
                hosts.append(h)
        for e in d["files"]:
            _merge_entry(by_name, order, e)
    merged["files"] = [by_name[n] for n in order]
    for e in merged["files"]:
        h = e.get("host")
        if isinstance(h, str) and h not in hosts:
            hosts.append(h)
    if hosts:
        merged["hosts"] = hosts
    return merged


def _merge_entry(by_name: dict[str, dict[str, Any]], order: list[str], e: dict[str, Any]) -> None:
    """Merge a later manifest's file entry ``e`` into the entries so far (``merge_manifests``)."""
    have = by_name.get(e["file"])
    if have is None:
        by_name[e["file"]] = copy.deepcopy(e)
        order.append(e["file"])
        return
    for k, v in e.items():
        if have.get(k) is None and v is not None:
            have[k] = copy.deepcopy(v)
    if e.get("complete") is True and have.get("complete") is not True:
        have["complete"] = True
        if e.get("bytes") is not None:
            have["bytes"] = e["bytes"]


def load_trace_dir(trace_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """The merged manifest of one request folder (``manifest.json`` + ``manifest.*.json``), as a
    validated JSON object."""
    d = Path(trace_dir)
    if not d.is_dir():
        raise ManifestError(f"{d}: not a directory")
    main_p = d / MANIFEST_NAME
    main = (
        loads_manifest(read_regular_bytes(main_p, follow=False), str(main_p))
        if os.path.lexists(main_p)
        else None
    )
    host_paths = host_manifests(d)
    per_host = [loads_manifest(read_regular_bytes(p, follow=False), str(p)) for p in host_paths]
    if main is None and not per_host:
        raise ManifestError(f"{d}: no {MANIFEST_NAME} (not a kscope trace folder)")
    names = ([MANIFEST_NAME] if main is not None else []) + [p.name for p in host_paths]
    return merge_manifests(main, per_host, str(d), names)


def read_manifests(directory: str | os.PathLike[str]) -> Manifest:
    """Typed view of :func:`load_trace_dir`: ``manifest.json`` merged with every
    ``manifest.<host>.json`` of the folder."""
    return manifest_from_dict(load_trace_dir(directory), str(directory))


def find_local_file(
    trace_dir: str | os.PathLike[str], entry: Mapping[str, Any], *, source: str | None = None, index: int = 0
) -> Path | None:
    """Where a manifest entry's file is on this machine: beside the manifest (its ``file``
    name), else its ``path`` when that lies inside the folder; None when neither is there.
    Anything leading outside the folder is a :class:`ManifestError` (:func:`folder_file`)."""
    src = source or str(Path(trace_dir) / MANIFEST_NAME)
    found = folder_file(trace_dir, str(entry["file"]), source=src, field=f"files[{index}].file")
    if found is not None:
        return found
    p = entry.get("path")
    if isinstance(p, str) and p:
        return folder_file(trace_dir, p, source=src, field=f"files[{index}].path")
    return None


def open_folder_file(
    trace_dir: str | os.PathLike[str], path: str | os.PathLike[str], *, source: str, field: str
) -> int:
    """A read-only descriptor of ``path`` (what :func:`folder_file` / :func:`find_local_file`
    returned), checked again *as opened*: a regular file (``O_NOFOLLOW``: not a symlink, never a
    FIFO wait) that the kernel places inside the request folder ``trace_dir``. Read the file
    through this descriptor only, so a file swapped for a symlink (or a folder swapped for one)
    after the check cannot change what is read. The caller closes it. Refusals are a
    :class:`ManifestError` naming ``source`` and ``field``."""
    root = Path(trace_dir).resolve()
    try:
        fd = _open_regular(path, follow=False)
    except _NotRegular as exc:
        raise ManifestError(
            f"{source}: {field} {os.fspath(path)!r} is {exc}, not a regular file: refused"
        ) from None
    except OSError as exc:
        why = "a symlink (replaced after it was checked)" if exc.errno == errno.ELOOP else exc.strerror or exc
        raise ManifestError(f"{source}: {field} {os.fspath(path)!r}: cannot open: {why}: refused") from None
    try:
        real = Path(os.readlink(f"/proc/self/fd/{fd}"))  # where the opened file is, per the kernel
    except OSError:  # no /proc (not Linux): the O_NOFOLLOW open of the checked real path stands
        return fd
    if real == root or not real.is_relative_to(root):
        os.close(fd)
        raise ManifestError(
            f"{source}: {field} {os.fspath(path)!r} was opened at {real}, outside the request folder "
            f"{root} (a folder was replaced after it was checked): refused"
        )
    return fd


def path_inside(trace_dir: str | os.PathLike[str], path: str) -> bool:
    """``path`` (absolute, or relative to ``trace_dir``) names a place inside the folder once
    resolved (it need not exist)."""
    root = Path(trace_dir).resolve()
    raw = Path(path)
    real = (raw if raw.is_absolute() else root / raw).resolve()
    return real != root and real.is_relative_to(root)


__all__ = [
    "MANIFEST_NAME",
    "MANIFEST_VERSION",
    "TRACE_ID_RE",
    "Manifest",
    "ManifestError",
    "ManifestFile",
    "decode_manifest",
    "dumps_manifest",
    "encode_manifest",
    "find_local_file",
    "folder_file",
    "format_time",
    "host_manifests",
    "load_trace_dir",
    "loads_manifest",
    "manifest_from_dict",
    "manifest_to_dict",
    "merge_manifests",
    "parse_time",
    "open_folder_file",
    "path_inside",
    "read_manifest",
    "read_manifest_file",
    "read_manifests",
    "read_regular_bytes",
    "utc_now_iso",
    "validate_manifest",
    "write_bytes_atomic",
    "write_manifest",
]


prime_structs(globals())
