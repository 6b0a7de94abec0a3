"""Decompressed bytes of a trace file, block by block (bounded memory).

gzip is detected by its magic bytes (not the file name) and inflated with ISA-L
(``isal.isal_zlib``, ~4x zlib); multi-member gzip files are followed to the end. Plain JSON is
read in blocks. Errors name the file: missing/unreadable files, corrupt gzip data (with the
compressed offset), and a gzip stream that ends early (truncated download or a profiler killed
while writing). With ``salvage=True`` a truncated or corrupt stream ends quietly after the last
good byte and :attr:`BlockReader.problem` says why, so the JSON layer can keep what is complete.
"""

from __future__ import annotations

import os
import stat
from typing import BinaryIO, cast

from isal import isal_zlib

from kinetoscope.trace.errors import TraceError
from kinetoscope.trace.limits import Limits

# isal types its decompression error as an instance; it is the exception class the except clauses need
ZLIB_ERROR = cast("type[Exception]", isal_zlib.error)

GZIP_MAGIC = b"\x1f\x8b"
READ_BYTES = 1 << 20  # compressed bytes per read
BLOCK_BYTES = 4 << 20  # at most this many decompressed bytes per block


def _kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a FIFO (named pipe)"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
    ):
        if test(mode):
            return name
    return "not a regular file"


def open_trace_file(path: str) -> BinaryIO:
    """Open ``path`` for reading without blocking (``O_NONBLOCK``: opening a FIFO would wait for
    a writer forever) and refuse anything but a regular file (checked with ``fstat`` on the open
    descriptor, so a swap between check and read changes nothing). Symlinks to regular files
    are followed: the user named the file."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise TraceError(path, "no such file") from None
    except IsADirectoryError:
        raise TraceError(path, "is a directory, not a trace file") from None
    except PermissionError:
        raise TraceError(path, "permission denied") from None
    except OSError as exc:
        raise TraceError(path, f"cannot open: {exc.strerror or exc}") from None
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise TraceError(path, "is a directory, not a trace file")
        if not stat.S_ISREG(mode):
            raise TraceError(
                path, f"is {_kind(mode)}, not a regular file: trace files are read from regular files only"
            )
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def check_trace_file(path: str) -> None:
    """Raise the :func:`open_trace_file` error for ``path`` now (before anything else opens it:
    the cache's content hash, the size estimate)."""
    open_trace_file(path).close()


def gzip_header_length(head: bytes) -> int | None:
    """Bytes of the gzip member header at the start of ``head`` (RFC 1952), or None."""
    if len(head) < 10 or head[:3] != b"\x1f\x8b\x08":
        return None
    flags = head[3]
    pos = 10
    if flags & 4:  # FEXTRA
        if len(head) < pos + 2:
            return None
        pos += 2 + int.from_bytes(head[pos : pos + 2], "little")
    for bit in (8, 16):  # FNAME, FCOMMENT: zero-terminated
        if flags & bit:
            end = head.find(b"\0", pos)
            if end < 0:
                return None
            pos = end + 1
    if flags & 2:  # FHCRC
        pos += 2
    return pos if pos <= len(head) else None


class BlockReader:
    """``read_block()`` returns the next decompressed block, or ``b""`` at the end."""

    def __init__(
        self,
        path: str,
        *,
        salvage: bool = False,
        block_bytes: int = BLOCK_BYTES,
        limits: Limits | None = None,
    ):
        self.path = path
        self.salvage = salvage
        self.block_bytes = block_bytes
        self.limits = limits or Limits.from_env()
        self.member_start = 0  # compressed offset of the current gzip member
        self.member_produced = 0  # decompressed bytes handed out before the current member
        self.fh = open_trace_file(path)
        self.problem: str | None = None  # salvage: why the data ended early
        self.produced = 0  # decompressed bytes handed out
        self.consumed = 0  # compressed bytes fed to the decompressor
        try:
            head = self.fh.read(2)
        except OSError as exc:
            self.close()
            raise TraceError(path, f"cannot read: {exc.strerror or exc}") from None
        self.gzip = head == GZIP_MAGIC
        self._pending = head  # bytes read but not yet processed
        self._done = False
        self._d = isal_zlib.decompressobj(31) if self.gzip else None  # None between members
        self._tail = b""  # compressed bytes not yet consumed

    # ---- public -------------------------------------------------------------------------
    def compressed_size(self) -> int | None:
        """The size on disk of a gzip file (None for plain JSON)."""
        if not self.gzip:
            return None
        try:
            return os.fstat(self.fh.fileno()).st_size
        except OSError:  # pragma: no cover - an open descriptor
            return None

    def read_block(self) -> bytes:
        if self._done:
            return b""
        try:
            out = self._next_gzip() if self.gzip else self._next_plain()
        except OSError as exc:
            self._finish()
            if self.salvage:
                self.problem = f"read error: {exc.strerror or exc}"
                return b""
            raise TraceError(self.path, f"cannot read: {exc.strerror or exc}", offset=self.produced) from None
        if self.produced + len(out) > self.limits.max_trace_bytes:
            self._finish()
            raise TraceError(
                self.path,
                f"the decompressed JSON is larger than {self.limits.trace_hint()}"
                + (f"; {self.consumed} compressed bytes read so far" if self.gzip else ""),
                offset=self.limits.max_trace_bytes,
            )
        self.produced += len(out)
        if not out:
            self._finish()
        return out

    def close(self) -> None:
        try:
            self.fh.close()
        except OSError:  # pragma: no cover
            pass

    def __enter__(self) -> BlockReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- internals ----------------------------------------------------------------------
    def _finish(self) -> None:
        self._done = True
        self.close()

    def _next_plain(self) -> bytes:
        if self._pending:
            data = self._pending + self.fh.read(self.block_bytes - len(self._pending))
            self._pending = b""
        else:
            data = self.fh.read(self.block_bytes)
        self.consumed += len(data)
        return data

    def _next_gzip(self) -> bytes:
        while True:
            if not self._tail:
                data = self._pending + self.fh.read(READ_BYTES)
                self._pending = b""
                if not data:  # end of the file
                    out = self._gzip_end()
                    if out is None:
                        continue
                    return out
                self.consumed += len(data)
                self._tail = data
            if self._d is None:  # between gzip members: another member, zero padding, or garbage
                out = self._between_members()
                if out is None:
                    continue
                return out
            d = self._d
            try:
                out = d.decompress(self._tail, self.block_bytes)
            except ZLIB_ERROR as exc:
                return self._corrupt(exc)
            self._tail = d.unconsumed_tail
            if d.eof:
                self._tail = d.unused_data + self._tail
                self._d = None
            if out:
                return out

    def _gzip_end(self) -> bytes | None:
        """At the end of the file: the rest of the member in progress (b"" when done, an error
        when it is cut short), or None when data follows the member (read on)."""
        if self._d is None:
            return b""
        try:
            out: bytes = self._d.flush()
        except ZLIB_ERROR as exc:
            return self._corrupt(exc)
        if self._d.eof:
            self._tail = self._d.unused_data
            self._d = None
            if out:
                return out
            return None if self._tail else b""
        if out:
            return out
        return self._truncated()

    def _between_members(self) -> bytes | None:
        """Between gzip members: start the next member, skip zero padding (None: read on), or
        judge what follows as trailing garbage."""
        rest = self._tail
        if len(rest) < 2 and not self._done:
            more = self.fh.read(READ_BYTES)
            self.consumed += len(more)
            if more:
                self._tail = rest + more
                return None
        if rest.startswith(GZIP_MAGIC):
            self._d = isal_zlib.decompressobj(31)
            self.member_start = self.consumed - len(rest)
            self.member_produced = self.produced
            return None  # (the member is decompressed on the next turn: ``_tail`` holds it)
        if not rest.strip(b"\x00"):
            self._tail = b""  # padding after the stream: ignore
            return None
        return self._trailing_garbage(len(rest))

    def _truncated(self) -> bytes:
        msg = f"gzip stream ends early after {self.consumed} compressed bytes (file truncated?)"
        if self.salvage:
            self.problem = msg
            self._finish()
            return b""
        raise TraceError(self.path, msg, offset=self.produced)

    def _corrupt(self, exc: Exception) -> bytes:
        offset = self.produced
        text = str(exc).lower()
        if "incorrect data check" in text or "incorrect length check" in text or "checksum" in text:
            # the member inflated completely but its CRC-32 / length trailer disagrees: the
            # output of that last call is lost with the exception, so count it again
            end = self._member_end()
            what = "length" if "length" in text else "CRC"
            msg = (
                f"gzip {what} mismatch at the end of the stream (compressed byte {self.consumed}): "
                "the decompressed data is damaged"
            )
            if end is not None:
                offset = end
        else:
            msg = f"corrupt gzip data near compressed byte {self.consumed}: {exc}"
        if self.salvage:
            self.problem = msg
            self._finish()
            return b""
        raise TraceError(self.path, msg, offset=offset)

    def _member_end(self) -> int | None:
        """Decompressed offset of the end of the current gzip member, by inflating it again
        as raw deflate (no trailer check). None when that is not possible."""
        try:
            with open(self.path, "rb") as fh:
                fh.seek(self.member_start)
                head = fh.read(1 << 16)
                skip = gzip_header_length(head)
                if skip is None:
                    return None
                fh.seek(self.member_start + skip)
                d = isal_zlib.decompressobj(-15)
                total = 0
                while not d.eof:
                    data = d.unconsumed_tail or fh.read(READ_BYTES)
                    if not data:
                        return None
                    total += len(d.decompress(data, self.block_bytes))
                    if total > self.limits.max_trace_bytes:
                        return None
        except (OSError, ZLIB_ERROR):
            return None
        return self.member_produced + total

    def _trailing_garbage(self, n: int) -> bytes:
        msg = f"{n}+ bytes of non-gzip data after the end of the gzip stream"
        if self.salvage:
            self.problem = msg
            self._finish()
            return b""
        raise TraceError(self.path, msg, offset=self.produced)
