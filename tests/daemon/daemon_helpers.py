"""Test clients speaking the real protocols (built on kinetoscope.protocol.wire)."""

from __future__ import annotations

import os
import socket
import uuid
from typing import Any

import orjson

from kinetoscope.protocol import wire


class IpcClient:
    """A libkineto-like datagram client: a bound AF_UNIX socket named dynoconfigclient<uuid>."""

    def __init__(self, daemon_addr: str | bytes, socket_dir: str | None) -> None:
        self.daemon_addr = daemon_addr
        name = f"dynoconfigclient{uuid.uuid4()}"
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        if socket_dir:
            self.addr: str | bytes = os.path.join(socket_dir, name)
        else:
            self.addr = b"\0" + name.encode() + b"\0"
        self.sock.bind(self.addr)
        self.socket_dir = socket_dir

    def send(self, datagram: bytes) -> None:
        self.sock.sendto(datagram, self.daemon_addr)

    def recv(self, timeout: float = 2.0) -> tuple[bytes, bytes] | None:
        """(type, payload) of the next reply, or None if nothing came within ``timeout``."""
        self.sock.settimeout(timeout)
        try:
            data = self.sock.recv(65536)
        except TimeoutError:
            return None
        return wire.unpack_datagram(data)

    def poll(
        self, pids: list[int], job_id: int = 0, config_type: int = 3, timeout: float = 2.0
    ) -> str | None:
        """Send a "req" and return the config text of the reply ("" when nothing pending)."""
        self.send(wire.pack_request(config_type, job_id, pids))
        reply = self.recv(timeout)
        if reply is None:
            return None
        msg_type, payload = reply
        assert msg_type == b"req"
        return payload.decode()

    def close(self) -> None:
        self.sock.close()
        if isinstance(self.addr, str):
            try:
                os.unlink(self.addr)
            except OSError:
                pass


def rpc_raw(port: int, payload: bytes, host: str = "127.0.0.1", timeout: float = 5.0) -> bytes:
    """Send ``payload`` as is (no framing added) and return the response body."""
    with socket.create_connection((host, port), timeout=timeout) as s:
        s.sendall(payload)
        return wire.read_rpc_frame(s)


def rpc(port: int, request: dict[str, Any] | bytes, host: str = "127.0.0.1") -> dict[str, Any]:
    body = request if isinstance(request, bytes) else orjson.dumps(request)
    return orjson.loads(rpc_raw(port, wire.frame_rpc(body), host))
