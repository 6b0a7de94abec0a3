"""Reading a file that a traced process controls: regular files only, bounded work.

Why: a trace path is named by the daemon but *written* by the traced process (another user,
any code). Whatever it leaves there - a symlink to ``/dev/zero`` or to an operator's 0600
file, a FIFO, a hard link, a 1 GB sparse file, 63 MiB of ``[{},{},...]`` - the daemon's
status check (``kscopeTraceStatus``), ``kscope trace --wait`` and ``kscope trace --store``
must neither block, nor read without bound, nor follow it. So every such file is opened here:

* ``O_NOFOLLOW`` (a symlink at the name is refused, never followed), ``O_NONBLOCK`` (opening
  a FIFO does not wait for a writer), relative to a directory descriptor when the caller has
  one (no symlink in the directories either);
* ``fstat`` on the descriptor before any read: only a regular file with one link is read; a
  *refusal* names why ("symlink refused", "not a regular file: fifo", ...);
* the completeness check reads at most :data:`SYNTAX_CHECK_LIMIT` bytes for a whole-document
  syntax check (``msgspec`` validates without building objects), larger files only their first
  and last :data:`END_BYTES`; gzip files are inflated in 1 MiB steps up to
  :data:`GZIP_CHECK_LIMIT` decompressed bytes. At most :data:`MAX_CONCURRENT_CHECKS` content
  checks run at once (memory: that many buffers, not one per caller).
"""

from __future__ import annotations

import errno
import os
import stat
import threading
import zlib
from collections import OrderedDict

import msgspec

from kinetoscope.protocol.structinfo import prime_structs

SYNTAX_CHECK_LIMIT = 16 << 20  # files up to this size are syntax-checked whole; larger: both ends
END_BYTES = 64 << 10  # bytes read at each end of a larger file
GZIP_CHECK_LIMIT = 256 << 20  # decompressed bytes inflated for a gzip file's check, at most
MAX_CONCURRENT_CHECKS = 2  # content checks at once (each holds up to SYNTAX_CHECK_LIMIT bytes)
_CHUNK = 1 << 20
_GZ_READ = 16 << 10  # compressed bytes per inflate step (deflate inflates at most ~1032x)

_OPEN_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_checks = threading.BoundedSemaphore(MAX_CONCURRENT_CHECKS)

_KINDS = (
    (stat.S_ISDIR, "directory"),
    (stat.S_ISFIFO, "fifo"),
    (stat.S_ISCHR, "character device"),
    (stat.S_ISBLK, "block device"),
    (stat.S_ISSOCK, "socket"),
)


class FileRefused(OSError):
    """A file that is there but is not read: ``reason`` says why (one line, for status answers)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def kind_of(mode: int) -> str:
    """ "regular file", "fifo", "character device", ... of an ``st_mode``."""
    if stat.S_ISREG(mode):
        return "regular file"
    if stat.S_ISLNK(mode):
        return "symlink"
    return next((name for test, name in _KINDS if test(mode)), "unknown file type")


def open_regular(name: str, dir_fd: int | None = None) -> tuple[int, os.stat_result]:
    """Open ``name`` (relative to ``dir_fd`` when given) for reading, refusing anything but a
    regular file with a single link. Returns (fd, its fstat); the caller closes the fd.

    Raises FileNotFoundError when nothing is there, :class:`FileRefused` (with the reason) for
    a symlink, a FIFO, a device, a directory, a socket or a hard link; other OSErrors as they
    come (permission denied, ...)."""
    try:
        fd = os.open(name, _OPEN_FLAGS, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.EMLINK):  # O_NOFOLLOW met a symlink
            raise FileRefused("symlink refused (trace files are not followed)") from None
        if exc.errno == errno.ENXIO:  # a socket, or a FIFO/device without the other end
            raise FileRefused("not a regular file") from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise FileRefused(f"not a regular file: {kind_of(st.st_mode)}")
        if st.st_nlink != 1:
            raise FileRefused(f"hard link refused ({st.st_nlink} links to the file)")
    except BaseException:
        os.close(fd)
        raise
    return fd, st


class FileCheck(msgspec.Struct, kw_only=True):
    """What a status check says about one trace file (``reason`` is None unless refused or
    unreadable)."""

    exists: bool
    bytes: int | None = None
    complete: bool = False
    reason: str | None = None


def check_file(name: str, dir_fd: int | None = None) -> FileCheck:
    """Exists / size / whole-JSON-object of the file at ``name`` (see the module docstring).

    Never raises for the file's sake: a refused or unreadable file is ``exists=True`` (something
    is there), ``complete=False`` and a ``reason``."""
    try:
        fd, st = open_regular(name, dir_fd)
    except FileNotFoundError:
        return FileCheck(exists=False)
    except FileRefused as exc:
        return FileCheck(exists=True, reason=exc.reason)
    except OSError as exc:
        if exc.errno == errno.ENOTDIR:
            return FileCheck(exists=False)
        return FileCheck(exists=True, reason=f"cannot open: {exc.strerror or exc}")
    key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    try:
        complete = _cached(key)
        if complete is None:
            with _checks:
                complete = json_object_complete(fd, st.st_size)
            _remember(key, complete)
    except OSError as exc:
        return FileCheck(exists=True, bytes=st.st_size, reason=f"cannot read: {exc.strerror or exc}")
    finally:
        os.close(fd)
    return FileCheck(exists=True, bytes=st.st_size, complete=complete)


# Completeness of files already checked, by identity and version (status is polled every
# 0.5 s while a trace is written; a final file is checked once).
_CacheKey = tuple[int, int, int, int, int]
_cache: OrderedDict[_CacheKey, bool] = OrderedDict()
_cache_lock = threading.Lock()
_CACHE_SIZE = 4096


def _cached(key: _CacheKey) -> bool | None:
    with _cache_lock:
        return _cache.get(key)


def _remember(key: _CacheKey, complete: bool) -> None:
    with _cache_lock:
        _cache[key] = complete
        while len(_cache) > _CACHE_SIZE:
            _cache.popitem(last=False)


def json_object_complete(fd: int, size: int) -> bool:
    """Whether the regular file ``fd`` (of ``size`` bytes) holds one whole JSON object.

    Up to SYNTAX_CHECK_LIMIT: the whole document is syntax-checked; above: it must start with
    ``{`` and end with ``}`` (Kineto writes ``<name>.tmp`` and renames it, so a final name
    holds a half-written file only when something else broke). A gzip file must inflate to its
    end within GZIP_CHECK_LIMIT bytes (its CRC checks out) and hold the same."""
    if size <= 0:
        return False
    if os.pread(fd, 2, 0) == b"\x1f\x8b":
        return _gzip_complete(fd)
    if size <= SYNTAX_CHECK_LIMIT:
        return _whole_object(_read_at(fd, 0, size))
    head = _read_at(fd, 0, END_BYTES)
    tail = _read_at(fd, max(0, size - END_BYTES), END_BYTES)
    return _ends_ok(head, tail)


def _ends_ok(head: bytes, tail: bytes) -> bool:
    return head.lstrip().startswith(b"{") and tail.rstrip().endswith(b"}")


def _read_at(fd: int, offset: int, n: int) -> bytes:
    """Up to ``n`` bytes from ``offset`` (fewer at the end of the file)."""
    parts: list[bytes] = []
    while n > 0:
        chunk = os.pread(fd, min(n, _CHUNK * 4), offset)
        if not chunk:
            break
        parts.append(chunk)
        offset += len(chunk)
        n -= len(chunk)
    return b"".join(parts)


def _gzip_complete(fd: int) -> bool:
    """Inflate (bounded) and check: a stream that does not end within GZIP_CHECK_LIMIT, does not
    end at all, fails its CRC or is followed by other bytes is not complete; one that inflates to
    at most SYNTAX_CHECK_LIMIT is syntax-checked whole, a larger one at both ends."""
    inflater = zlib.decompressobj(wbits=31)  # gzip header and trailer (CRC-32, size) checked
    kept: list[bytes] | None = []  # the whole document while it is small enough to check
    head = tail = b""
    inflated = offset = 0
    try:
        while not inflater.eof:
            data = os.pread(fd, _GZ_READ, offset)
            if not data:
                return False  # the stream does not end: truncated
            offset += len(data)
            out = inflater.decompress(data)  # <= ~1032x its input: ~16 MiB at most
            inflated += len(out)
            if inflated > GZIP_CHECK_LIMIT:
                return False
            if kept is not None:
                kept = kept + [out] if inflated <= SYNTAX_CHECK_LIMIT else None
            if len(head) < 4096:
                head += out[: 4096 - len(head)]
            tail = (tail + out[-4096:])[-4096:]
    except zlib.error:
        return False
    if inflater.unused_data.strip(b"\0") or os.pread(fd, 1, offset):
        return False  # another member or trailing bytes: not what a trace writer produces
    if kept is not None:
        return _whole_object(b"".join(kept))
    return _ends_ok(head, tail)


def _whole_object(data: bytes) -> bool:
    """Whether ``data`` is one JSON object (validated without building it)."""
    if not data.lstrip().startswith(b"{"):
        return False
    try:
        msgspec.json.decode(data, type=msgspec.Raw)
    except (msgspec.DecodeError, RecursionError):
        return False
    return True


prime_structs(globals())
