"""RPC client for a Kinetoscope (or Dynolog) daemon.

Framing is dyno's (``kinetoscope.protocol.wire``): native ``int32`` length + UTF-8 JSON, one request
per TCP connection; the kscope functions take the typed requests of ``kinetoscope.protocol.rpc``
and return its typed responses (an answer that does not fit is refused, naming the field).
Every failure becomes a :class:`DaemonError` whose message names the host and
the cause, so the trigger can report it without a traceback.
"""

from __future__ import annotations

import errno
import socket
import ssl
from dataclasses import dataclass
from typing import Any, TypeVar

import msgspec
import orjson

from kinetoscope.collect.tls import TlsClientOptions, default_tls, tls_reason
from kinetoscope.errors import KinetoscopeError, UsageError
from kinetoscope.protocol import rpc
from kinetoscope.protocol.defaults import DEFAULT_PORT
from kinetoscope.protocol.wire import MAX_RPC_BYTES, FrameError, frame_rpc, read_rpc_frame

DEFAULT_HOST = "localhost"
DEFAULT_TIMEOUT_S = 10.0
STACKS_MAX_REPLY_BYTES = 64 << 20  # a stacks answer: up to 256 processes of bounded stacks

R = TypeVar("R", bound=msgspec.Struct)


@dataclass(frozen=True, order=True)
class HostAddress:
    """Where a daemon listens. ``str()`` gives ``host:port`` (``[v6]:port`` for IPv6 literals)."""

    host: str
    port: int = DEFAULT_PORT

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"


def parse_host(text: str, default_port: int = DEFAULT_PORT, *, what: str = "--host") -> HostAddress:
    """``node7``, ``node7:1779``, ``10.0.0.3:1779``, ``[::1]:1779`` or ``::1`` -> HostAddress.

    ``what`` names the value in error messages (``--host``, or ``host`` for a hosts file line)."""
    raw = text.strip()
    if not raw:
        raise UsageError(f"empty {what} value")
    host, port_text = raw, ""
    if raw.startswith("["):
        end = raw.find("]")
        if end < 0:
            raise UsageError(f"bad {what} {text!r}: missing ']' after an IPv6 address")
        host = raw[1:end]
        rest = raw[end + 1 :]
        if rest:
            if not rest.startswith(":"):
                raise UsageError(f"bad {what} {text!r}: expected ':PORT' after ']'")
            port_text = rest[1:]
    elif raw.count(":") == 1:
        host, port_text = raw.split(":")
    # more than one ':' without brackets: a bare IPv6 address, default port
    if not host:
        raise UsageError(f"bad {what} {text!r}: no host name")
    port = default_port
    if port_text:
        if not port_text.isdigit() or not 0 < int(port_text) < 65536:
            raise UsageError(f"bad {what} {text!r}: port must be a number from 1 to 65535")
        port = int(port_text)
    return HostAddress(host, port)


def parse_hosts(values: list[str] | None, default_port: int = DEFAULT_PORT) -> list[HostAddress]:
    """Repeated and/or comma-separated ``--host`` values, de-duplicated in order; default localhost."""
    out: dict[HostAddress, None] = {}  # ordered and O(1) per host (hosts files list thousands)
    for value in values or []:
        for part in value.split(","):
            if part.strip():
                out[parse_host(part, default_port)] = None
    return list(out) or [HostAddress(DEFAULT_HOST, default_port)]


def read_hosts_file(path: str) -> list[str]:
    """Daemon addresses (``host:port``) from a file: one ``host[:port]`` per line, ``#`` comments and
    blank lines ignored, duplicates dropped. Shared by ``kscope trace --hosts-file`` and
    ``kscope autopilot --hosts-file``; a bad file is one UsageError naming the file and the line."""
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except OSError as exc:
        raise UsageError(f"cannot read hosts file {path}: {exc.strerror or exc}") from exc
    except UnicodeDecodeError as exc:
        raise UsageError(f"hosts file {path}: not UTF-8 text (byte {exc.start})") from exc
    out: dict[str, None] = {}  # ordered, de-duplicated
    for n, line in enumerate(lines, 1):
        text = line.split("#", 1)[0].strip()
        if not text:
            continue
        try:
            out[str(parse_host(text, what="host"))] = None
        except UsageError as exc:
            raise UsageError(f"hosts file {path} line {n}: {exc}") from exc
    return list(out)


class DaemonError(KinetoscopeError):
    """A daemon could not be asked, or answered with a failure. ``kind`` is stable for ``--json``:
    ``unreachable`` (no connection), ``no_answer`` (connected, no usable reply) or ``failed``
    (the daemon said why)."""

    def __init__(self, address: HostAddress, kind: str, reason: str) -> None:
        super().__init__(f"daemon {address}: {reason}")
        self.address = address
        self.kind = kind
        self.reason = reason


def _connect_reason(address: HostAddress, exc: OSError) -> str:
    if isinstance(exc, socket.gaierror):
        return f"cannot resolve host name {address.host!r} ({exc.strerror or exc})"
    if isinstance(exc, (socket.timeout, TimeoutError)):
        return "connection timed out (host down, or a firewall drops the port?)"
    if exc.errno == errno.ECONNREFUSED:
        return (
            f"connection refused: no daemon listens on port {address.port} (start one with `kscope daemon`)"
        )
    if exc.errno in (errno.EHOSTUNREACH, errno.ENETUNREACH):
        return f"host unreachable ({exc.strerror})"
    return f"cannot connect ({exc.strerror or exc})"


class DaemonClient:
    """Calls one daemon. Thread-safe (a new connection per call)."""

    def __init__(
        self,
        address: HostAddress | str,
        token: str | None = None,
        timeout: float = DEFAULT_TIMEOUT_S,
        tls: TlsClientOptions | None = None,
    ) -> None:
        self.address = parse_host(address) if isinstance(address, str) else address
        self.token = token
        self.timeout = timeout
        # None: the process-wide setting (collect.tls.use_tls, set by the CLI's --tls-* flags)
        self.tls = tls if tls is not None else default_tls()

    def _tls_error(self, fn: str, exc: ssl.SSLError) -> DaemonError:
        return DaemonError(
            self.address, "failed", f"{fn}: {tls_reason(exc, self.tls.ca if self.tls else None)}"
        )

    def _open(self, fn: str) -> socket.socket:
        """A connected socket, TLS-wrapped (handshake done) when TLS is configured."""
        try:
            sock = socket.create_connection((self.address.host, self.address.port), timeout=self.timeout)
        except OSError as exc:
            raise DaemonError(self.address, "unreachable", _connect_reason(self.address, exc)) from exc
        if self.tls is None:
            return sock
        try:
            return self.tls.context.wrap_socket(
                sock, server_hostname=self.tls.server_name or self.address.host
            )
        except ssl.SSLError as exc:
            sock.close()
            raise self._tls_error(fn, exc) from exc
        except OSError as exc:
            sock.close()
            raise DaemonError(
                self.address, "no_answer", f"{fn}: TLS handshake failed ({exc.strerror or exc})"
            ) from exc

    def _refusal(self, fn: str, sock: socket.socket, exc: OSError) -> DaemonError:
        """A failed send on a TLS connection: read the daemon's alert, which says why."""
        if isinstance(sock, ssl.SSLSocket):
            try:
                sock.recv(1)
            except ssl.SSLError as alert:
                return self._tls_error(fn, alert)
            except OSError:
                pass
        return DaemonError(self.address, "no_answer", f"{fn}: connection failed ({exc.strerror or exc})")

    def call(self, fn: str, *, max_reply_bytes: int = MAX_RPC_BYTES, **fields: Any) -> dict[str, Any]:
        """Send ``{"fn": fn, **fields}`` (plus ``token``) and return the decoded JSON object
        (an answer over ``max_reply_bytes`` is refused).

        Raises DaemonError for connection problems, missing/garbled replies, and
        ``{"status": "failed", ...}`` answers."""
        request: dict[str, Any] = {"fn": fn}
        request.update({k: v for k, v in fields.items() if v is not None})
        if self.token:
            request["token"] = self.token
        body = orjson.dumps(request)
        sock = self._open(fn)
        try:
            with sock:
                sock.settimeout(self.timeout)
                try:
                    sock.sendall(frame_rpc(body))
                except ssl.SSLError:
                    raise
                except OSError as exc:
                    raise self._refusal(fn, sock, exc) from exc
                raw = read_rpc_frame(sock, max_reply_bytes)
        except ssl.SSLError as exc:
            raise self._tls_error(fn, exc) from exc
        except FrameError as exc:
            raise DaemonError(
                self.address,
                "no_answer",
                f"{fn}: the daemon closed the connection without a valid answer ({exc}); it is probably "
                f"a plain Dynolog daemon or an older kscope daemon that does not know {fn!r}",
            ) from exc
        except TimeoutError as exc:
            raise DaemonError(
                self.address, "no_answer", f"{fn}: no answer within {self.timeout:g} s"
            ) from exc
        except OSError as exc:
            raise DaemonError(
                self.address, "no_answer", f"{fn}: connection failed ({exc.strerror or exc})"
            ) from exc
        try:
            reply = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            raise DaemonError(self.address, "no_answer", f"{fn}: the answer is not JSON ({exc})") from exc
        if not isinstance(reply, dict):
            raise DaemonError(self.address, "no_answer", f"{fn}: the answer is not a JSON object")
        status = reply.get("status")
        if isinstance(status, str) and status.startswith("failed"):
            why = reply.get("error") or status
            raise DaemonError(self.address, "failed", f"{fn} failed: {why}")
        return reply

    def ask(self, fn: str, kind: type[R], *, max_reply_bytes: int = MAX_RPC_BYTES, **fields: Any) -> R:
        """:meth:`call`, its answer decoded as the response struct ``kind`` (protocol/rpc.py); an
        answer that is not one is a ``no_answer`` DaemonError naming the field."""
        reply = self.call(fn, max_reply_bytes=max_reply_bytes, **fields)
        try:
            return rpc.decode_response(reply, kind)
        except rpc.ResponseError as exc:
            raise DaemonError(self.address, "no_answer", f"{fn}: malformed answer: {exc}") from None

    # -- dyno functions -------------------------------------------------------------------
    def get_status(self) -> rpc.StatusResponse:
        return self.ask("getStatus", rpc.StatusResponse)

    def get_version(self) -> rpc.VersionResponse:
        return self.ask("getVersion", rpc.VersionResponse)

    # -- kscope extensions (docs/protocol.md §9; typed requests in kinetoscope.protocol.rpc) --
    def list_processes(
        self, job_id: int | None = None, max_pages: int = 64
    ) -> rpc.KscopeListProcessesResponse:
        """Every registered process (of ``job_id``): the daemon answers pages of at most
        ``rpc.MAX_LIST_PROCESSES``; at most ``max_pages`` are fetched (``next_offset`` is kept in
        the answer when more remain)."""
        kind = rpc.KscopeListProcessesResponse
        answer = self.ask(
            rpc.LIST_PROCESSES, kind, **rpc.request_fields(rpc.KscopeListProcessesRequest(job_id=job_id))
        )
        for _ in range(max_pages - 1):
            offset = answer.next_offset
            if offset is None or offset <= 0:
                break
            page = self.ask(
                rpc.LIST_PROCESSES,
                kind,
                **rpc.request_fields(rpc.KscopeListProcessesRequest(job_id=job_id, offset=offset)),
            )
            if not page.processes:
                break
            answer.processes.extend(page.processes)
            answer.next_offset = page.next_offset
        return answer

    def trace(self, request: rpc.KscopeTraceRequest) -> rpc.KscopeTraceResponse:
        return self.ask(rpc.TRACE, rpc.KscopeTraceResponse, **rpc.request_fields(request))

    def trace_status(self, trace_id: str) -> rpc.KscopeTraceStatusResponse:
        return self.ask(
            rpc.TRACE_STATUS,
            rpc.KscopeTraceStatusResponse,
            **rpc.request_fields(rpc.KscopeTraceStatusRequest(trace_id=trace_id)),
        )

    def stacks(self, request: rpc.KscopeStacksRequest) -> rpc.KscopeStacksResponse:
        """§9.4 ``kscopeStacks`` (its answer may be up to ``STACKS_MAX_REPLY_BYTES``)."""
        return self.ask(
            rpc.STACKS,
            rpc.KscopeStacksResponse,
            max_reply_bytes=STACKS_MAX_REPLY_BYTES,
            **rpc.request_fields(request),
        )
