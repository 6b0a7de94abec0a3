"""Fuzzing what a traced process can leave at its trace path (issue 32), for the daemon's status
check (``file_status`` below a pinned root), the client's (``kscope trace --wait``:
``check_trace_file``) and the upload's vetting (``kscope trace --store``: ``refused_local_files``).

Planted: symlinks (to devices, ``/proc/self/mem``, an operator's file, a directory, dangling, a
loop), FIFOs, sockets, directories, hard links, sparse files from 0 bytes to 4 GiB, random bytes,
JSON fragments and gzip streams (whole, truncated, bombs). Properties: every check returns (a
FIFO or device never blocks it: pytest-timeout), reads at most the syntax-check limit (every
``pread`` is counted), refuses anything but a regular file with one link with a reason and
without reading it, says ``complete`` only of one whole JSON object, and the three agree.
"""

from __future__ import annotations

import gzip
import os
import shutil
import socket
import zlib

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from kinetoscope.collect.deliver import refused_local_files
from kinetoscope.collect.trigger import check_trace_file
from kinetoscope.daemon.paths import TraceRoot
from kinetoscope.daemon.traces import file_status
from kinetoscope.protocol import tracefile

from . import fuzz_settings

NAME = "rank-0_4242.pt.trace.json"
GZIP_LIMIT = 8 << 20  # the inflate limit while fuzzing (256 MiB by default: same code, less CPU)
LINK_TARGETS = [
    "/dev/zero",
    "/dev/urandom",
    "/dev/null",
    "/proc/self/mem",
    "{secret}",
    "{outside}",
    "/nonexistent",
    "{self}",
]
SPARSE_SIZES = [0, 1, 4095, tracefile.SYNTAX_CHECK_LIMIT, tracefile.SYNTAX_CHECK_LIMIT + 1, 1 << 30, 4 << 30]
FRAGMENTS = [
    b"{",
    b"}",
    b"[",
    b"]",
    b"{}",
    b"[{},{}]",
    b'{"traceEvents": []}',
    b"  \n",
    b"\x00",
    b'"',
    b"1e999",
    b",",
]

planted = st.one_of(
    st.tuples(st.just("symlink"), st.sampled_from(LINK_TARGETS)),
    st.tuples(st.sampled_from(["fifo", "socket", "directory", "hardlink"]), st.none()),
    st.tuples(st.just("sparse"), st.sampled_from(SPARSE_SIZES)),
    st.tuples(st.just("bytes"), st.binary(max_size=512)),
    st.tuples(st.just("json"), st.lists(st.sampled_from(FRAGMENTS), max_size=12).map(b"".join)),
    st.tuples(st.just("gzip"), st.tuples(st.lists(st.sampled_from(FRAGMENTS), max_size=8).map(b"".join), st.integers(-20, 0))),
    st.tuples(st.just("bomb"), st.integers(1, 6)),
)  # fmt: skip


@pytest.fixture(scope="module")
def place(tmp_path_factory):
    base = tmp_path_factory.mktemp("planted")
    root = base / "traces"
    (root / "req").mkdir(parents=True)
    secret = base / "secret.json"
    secret.write_bytes(b'{"traceEvents": [], "password": "hunter2"}')
    secret.chmod(0o600)
    (base / "outside").mkdir()
    pinned = TraceRoot(str(root))
    yield root / "req", {"secret": str(secret), "outside": str(base / "outside")}, pinned
    pinned.close()


def _plant(directory, extra, kind, arg) -> bytes | None:
    """Create the thing; returns the content of a regular file written whole (None otherwise)."""
    path = directory / NAME
    if kind == "symlink":
        os.symlink(arg.format(self=str(path), **extra), path)
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "socket":
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        here = os.getcwd()
        os.chdir(directory)
        try:
            s.bind(NAME)
        finally:
            os.chdir(here)
            s.close()
    elif kind == "directory":
        path.mkdir()
    elif kind == "hardlink":
        os.link(extra["secret"], path)
    elif kind == "sparse":
        with open(path, "wb") as f:
            f.truncate(arg)
    elif kind in ("bytes", "json"):
        path.write_bytes(arg)
        return bytes(arg)
    elif kind == "gzip":
        body, cut = arg
        data = gzip.compress(body)
        path.write_bytes(data[: len(data) + cut] if cut else data)
        return body if not cut else None
    elif kind == "bomb":
        path.write_bytes(_bomb(arg * (GZIP_LIMIT // 4)))
    return None


_BOMBS: dict[int, bytes] = {}


def _bomb(blanks: int) -> bytes:
    """gzip of ``{`` + ``blanks`` spaces + ``}``, compressed in steps (and once per size)."""
    if blanks not in _BOMBS:
        z = zlib.compressobj(9, zlib.DEFLATED, 31)
        parts = [z.compress(b"{")]
        chunk = b" " * (1 << 20)
        for _ in range(blanks >> 20):
            parts.append(z.compress(chunk))
        parts += [z.compress(b"}"), z.flush()]
        _BOMBS[blanks] = b"".join(parts)
    return _BOMBS[blanks]


def _is_object(data: bytes) -> bool:
    try:
        return isinstance(orjson.loads(data), dict)
    except orjson.JSONDecodeError:
        return False


@pytest.mark.timeout(600)
@fuzz_settings(150)
@given(planted)
def test_planted_files_are_checked_without_blocking_following_or_reading_unbounded(place, fuzz_counts, thing):
    directory, extra, root = place
    kind, arg = thing
    for child in directory.iterdir():
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child)
        else:
            child.unlink()
    content = _plant(directory, extra, kind, arg)
    read: list[int] = []
    real_pread = os.pread

    def counting(fd: int, n: int, offset: int) -> bytes:
        data = real_pread(fd, n, offset)
        read.append(len(data))
        return data

    with pytest.MonkeyPatch.context() as m:
        m.setattr(tracefile.os, "pread", counting)
        m.setattr(tracefile, "GZIP_CHECK_LIMIT", GZIP_LIMIT)
        tracefile._cache.clear()
        daemon = file_status(str(directory / NAME), root)
        tracefile._cache.clear()
        exists, size, complete = check_trace_file(directory / NAME)
        refused = refused_local_files(directory, [{"file": NAME}])
    fuzz_counts["planted files: daemon"] += 1
    fuzz_counts["planted files: client"] += 1
    fuzz_counts["planted files: store vetting"] += 1
    # both checks read at most the syntax-check limit (+ a gzip stream's compressed bytes)
    limit = tracefile.SYNTAX_CHECK_LIMIT + 2 * tracefile.END_BYTES + 16
    if kind in ("gzip", "bomb"):
        limit += 2 * os.path.getsize(directory / NAME)
    assert sum(read) <= 2 * limit, (kind, sum(read))
    assert (daemon["exists"], daemon["bytes"], daemon["complete"]) == (exists, size, complete)
    regular = kind in ("sparse", "bytes", "json", "gzip", "bomb")
    if regular:
        assert daemon["reason"] is None and refused == {}
    else:
        assert daemon["exists"] and daemon["reason"] and not complete, (kind, daemon)
        assert refused == {NAME: daemon["reason"]}
        assert kind != "symlink" or "symlink refused" in daemon["reason"]
    if complete:
        assert regular and kind != "sparse"
        if content is not None:
            assert _is_object(content), (kind, content[:80])
    elif content is not None and kind in ("json", "bytes"):
        assert not _is_object(content), (kind, content[:80])
