"""Byte-level framing of the two Dynolog protocols (docs/protocol.md §1.2 and §3.2).

* IPC fabric (libkineto <-> daemon, AF_UNIX datagrams): a 40-byte ``Metadata{u64 size;
  char type[32]}`` header in native byte order, then ``size`` payload bytes (§1.2).
* RPC (dyno CLI <-> daemon, TCP): native ``int32`` length, then that many bytes of UTF-8
  JSON (§3.2). Responses are JSON with sorted keys and compact separators, as nlohmann emits.

Pure functions over bytes so that the server, the client and the tests share one definition.
"""

from __future__ import annotations

import socket
import struct
from dataclasses import dataclass
from typing import Any

import orjson

# ---------------------------------------------------------------------------------------
# IPC fabric
# ---------------------------------------------------------------------------------------
METADATA = struct.Struct("=Q32s")  # size_t size; char type[32]
REQ_HEADER = struct.Struct("=iiq")  # int32 type; int32 n; int64 jobid
CONTEXT = struct.Struct("=iiq")  # int32 gpu; int32 pid; int64 jobid
PID = struct.Struct("=i")

TYPE_REQ = b"req"
TYPE_CTXT = b"ctxt"

CONFIG_EVENTS = 1
CONFIG_ACTIVITIES = 2

MAX_PIDS = 64  # kineto sends at most 11 (self + 10 ancestors); anything far above is garbage


class FrameError(ValueError):
    """A datagram or RPC frame that does not follow the protocol."""


@dataclass(frozen=True)
class LibkinetoRequest:
    """A "req" poll: config type bitmask, job id, and the pid chain (leaf first)."""

    config_type: int
    job_id: int
    pids: tuple[int, ...]


@dataclass(frozen=True)
class LibkinetoContext:
    """A "ctxt" GPU-context registration (old CUDA builds only)."""

    gpu: int
    pid: int
    job_id: int


def pack_datagram(msg_type: bytes, payload: bytes) -> bytes:
    """Metadata header + payload; ``size`` always equals ``len(payload)`` (the client trusts it)."""
    return METADATA.pack(len(payload), msg_type) + payload


def unpack_datagram(data: bytes) -> tuple[bytes, bytes]:
    """(type tag without NUL padding, payload). Raises FrameError if sizes disagree."""
    if len(data) < METADATA.size:
        raise FrameError(f"datagram of {len(data)} bytes is shorter than the {METADATA.size}-byte header")
    size, raw_type = METADATA.unpack_from(data)
    payload = data[METADATA.size :]
    if size != len(payload):
        raise FrameError(f"header says {size} payload bytes, datagram carries {len(payload)}")
    return raw_type.split(b"\0", 1)[0], payload


def pack_request(config_type: int, job_id: int, pids: list[int] | tuple[int, ...]) -> bytes:
    """A complete "req" datagram as libkineto sends it (used by tests and the benchmark)."""
    body = REQ_HEADER.pack(config_type, len(pids), job_id) + b"".join(PID.pack(p) for p in pids)
    return pack_datagram(TYPE_REQ, body)


def parse_request(payload: bytes) -> LibkinetoRequest:
    if len(payload) < REQ_HEADER.size:
        raise FrameError(
            f"req payload of {len(payload)} bytes is shorter than its {REQ_HEADER.size}-byte header"
        )
    config_type, n, job_id = REQ_HEADER.unpack_from(payload)
    if n < 0 or n > MAX_PIDS:
        raise FrameError(f"req carries an implausible pid count {n}")
    expected = REQ_HEADER.size + PID.size * n
    if len(payload) != expected:
        raise FrameError(f"req with n={n} must be {expected} bytes, got {len(payload)}")
    pids = struct.unpack_from(f"={n}i", payload, REQ_HEADER.size) if n else ()
    return LibkinetoRequest(config_type=config_type, job_id=job_id, pids=tuple(pids))


def pack_context(gpu: int, pid: int, job_id: int) -> bytes:
    return pack_datagram(TYPE_CTXT, CONTEXT.pack(gpu, pid, job_id))


def parse_context(payload: bytes) -> LibkinetoContext:
    if len(payload) != CONTEXT.size:
        raise FrameError(f"ctxt payload must be {CONTEXT.size} bytes, got {len(payload)}")
    gpu, pid, job_id = CONTEXT.unpack(payload)
    return LibkinetoContext(gpu=gpu, pid=pid, job_id=job_id)


# ---------------------------------------------------------------------------------------
# RPC
# ---------------------------------------------------------------------------------------
RPC_LENGTH = struct.Struct("=i")
MAX_RPC_BYTES = 1 << 20  # dyno requests are a few hundred bytes; refuse anything huge


def encode_rpc_json(obj: Any) -> bytes:
    """JSON as dynolog's nlohmann ``dump()`` writes it: sorted keys, no spaces."""
    return orjson.dumps(obj, option=orjson.OPT_SORT_KEYS)


def frame_rpc(body: bytes) -> bytes:
    return RPC_LENGTH.pack(len(body)) + body


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    chunks = []
    remaining = n
    while remaining:
        chunk = sock.recv(min(remaining, 65536))
        if not chunk:
            raise FrameError(f"connection closed after {n - remaining} of {n} bytes")
        chunks.append(chunk)
        remaining -= len(chunk)
    return b"".join(chunks)


def read_rpc_frame(sock: socket.socket, max_bytes: int = MAX_RPC_BYTES) -> bytes:
    """One length-prefixed frame from a blocking socket (with its timeout set by the caller)."""
    (length,) = RPC_LENGTH.unpack(_recv_exact(sock, RPC_LENGTH.size))
    if length <= 0:
        raise FrameError(f"frame length {length} is not positive")
    if length > max_bytes:
        raise FrameError(f"frame length {length} exceeds the {max_bytes}-byte limit")
    return _recv_exact(sock, length)


class FrameAssembler:
    """Incremental reader of one RPC request frame from a non-blocking socket.

    Feed it what ``recv`` returned; ``done`` once the body is complete. Raises FrameError as
    soon as the length prefix is impossible (<= 0 or over ``max_bytes``), so a client that
    claims a huge frame is answered at once instead of being waited for.
    """

    def __init__(self, max_bytes: int = MAX_RPC_BYTES) -> None:
        self.max_bytes = max_bytes
        self._buf = bytearray()
        self.length: int | None = None
        self.received = 0  # bytes seen so far, prefix included

    @property
    def wanted(self) -> int:
        """Bytes still missing (the prefix first, then the body)."""
        if self.length is None:
            return RPC_LENGTH.size - len(self._buf)
        return self.length - len(self._buf)

    @property
    def done(self) -> bool:
        return self.length is not None and len(self._buf) == self.length

    def feed(self, data: bytes) -> None:
        self.received += len(data)
        while data:
            take = self.wanted
            self._buf += data[:take]
            data = data[take:]
            if self.length is None and len(self._buf) == RPC_LENGTH.size:
                (length,) = RPC_LENGTH.unpack(self._buf)
                if length <= 0:
                    raise FrameError(f"frame length {length} is not positive")
                if length > self.max_bytes:
                    raise FrameError(f"frame length {length} exceeds the {self.max_bytes}-byte limit")
                self.length = length
                self._buf = bytearray()
            elif self.done:
                return  # one request per connection: anything after the frame is ignored

    @property
    def body(self) -> bytes:
        return bytes(self._buf)
