"""What the web app may serve and whom it answers: serving roots, the Host allow-list and the
request body limit (docs/web.md, "Security"; docs/security.md, "The trace loader and the web app").

* **Serving roots.** Trace file paths come from manifests (daemons, ``kscope catalog import``),
  so a path is served only when, with every symlink resolved, it lies under one of the
  configured roots; a remote storage URL only when it starts with a root given as a URL.
* **Host allow-list.** A DNS-rebinding page reaches the server under the attacker's host name;
  IP literals, ``localhost``, this machine's names and ``--allowed-host`` values are accepted.
* **Body limit.** Request bodies over ``max_body_bytes`` get 413 before they are read.
"""

from __future__ import annotations

import ipaddress
import os
import re
import socket
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from kinetoscope.protocol.defaults import DEFAULT_TRACE_ROOT

SERVE_ROOTS_ENV = "KSCOPE_SERVE_ROOTS"  # comma-separated extra roots (folders or URL prefixes)
ALLOWED_HOSTS_ENV = "KSCOPE_ALLOWED_HOSTS"  # comma-separated extra Host names
MAX_BODY_ENV = "KSCOPE_MAX_BODY_BYTES"
DEFAULT_MAX_BODY_BYTES = 1 << 20  # forms and trigger requests are a few hundred bytes
LOOPBACK_NAMES = ("localhost", "ip6-localhost", "127.0.0.1", "::1")


def split_list(value: str | None) -> list[str]:
    """``"a, b,,c"`` -> ``["a", "b", "c"]``."""
    return [p.strip() for p in (value or "").split(",") if p.strip()]


# ---------------------------------------------------------------------------------------------
# serving roots
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ServeRoots:
    """Folders (resolved) and remote URL prefixes trace files may be served from."""

    local: tuple[Path, ...]
    remote: tuple[str, ...]

    @classmethod
    def from_list(cls, roots: Iterable[str]) -> ServeRoots:
        local: list[Path] = []
        remote: list[str] = []
        for r in roots:
            if "://" in r and not r.startswith("file://"):
                remote.append(r.rstrip("/") + "/")
            else:
                p = Path(os.path.expanduser(r.removeprefix("file://")))
                local.append(p.resolve())  # a root that is itself a symlink counts as its target
        return cls(tuple(dict.fromkeys(local)), tuple(dict.fromkeys(remote)))

    def local_file(self, path: str | os.PathLike[str]) -> Path | None:
        """The real path of ``path`` when it is a regular file under a root (every symlink
        resolved, so a link inside a root that points outside is refused), else None."""
        try:
            real = Path(path).resolve(strict=True)
        except (OSError, RuntimeError, ValueError):
            return None
        if not any(real.is_relative_to(root) for root in self.local):
            return None
        return real if real.is_file() else None

    def allows_url(self, url: str) -> bool:
        """A remote storage URL under a remote root (``..`` segments never pass)."""
        if "/../" in url + "/" or "/./" in url + "/":
            return False
        return any(url.startswith(prefix) for prefix in self.remote)

    def describe(self) -> list[str]:
        return [str(p) for p in self.local] + list(self.remote)


def default_serve_roots(catalog: Any) -> list[str]:
    """The roots every server has: the daemon's default trace root, the download cache of
    remote traces, and ``<catalog folder>/traces`` for a SQLite catalog (the demo's layout)."""
    from kinetoscope.store.upload import default_cache_dir

    roots = [DEFAULT_TRACE_ROOT, str(default_cache_dir())]
    url = getattr(getattr(catalog, "engine", None), "url", None)
    if url is not None and url.get_backend_name() == "sqlite" and url.database not in (None, "", ":memory:"):
        roots.append(str(Path(url.database).parent / "traces"))
    return roots


# ---------------------------------------------------------------------------------------------
# Host header
# ---------------------------------------------------------------------------------------------
# A Host header is ``host[:port]`` (RFC 9110 / 3986): a DNS name or IPv4 literal, or an IPv6
# literal in brackets, and an optional port. Anything else (``127.0.0.1:80@evil.com``, spaces, a
# path, userinfo) is refused outright rather than split into a name that happens to pass.
_HOST_HEADER = re.compile(
    r"(?:\[([0-9a-f:.]+)\]|([a-z0-9](?:[a-z0-9._-]{0,252}[a-z0-9])?))(?::[0-9]{1,5})?\Z"
)


def host_name(header: str) -> str:
    """The name part of a well-formed Host header (``[::1]:80`` -> ``::1``), lower case; ``""``
    for a malformed one."""
    m = _HOST_HEADER.match(header.strip().lower())
    if m is None:
        return ""
    return m.group(1) or m.group(2) or ""


def is_ip_literal(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def machine_names() -> list[str]:
    """This machine's host name and fully qualified name (what a colleague types)."""
    names = [socket.gethostname()]
    try:
        names.append(socket.getfqdn())
    except OSError:  # pragma: no cover - resolver trouble
        pass
    return [n.lower() for n in names if n]


class HostCheck:
    """Accepts a Host header naming an IP literal, a loopback name, or an allowed name.

    ``allowed`` None accepts any host (the library default; ``kscope serve`` always passes a
    list). ``"*"`` in the list also accepts any (an explicit opt-out, for a reverse proxy that
    rewrites Host)."""

    def __init__(self, allowed: Iterable[str] | None) -> None:
        given = [h.strip() for h in allowed or ()]
        self.any = allowed is None or "*" in given
        self.names = {host_name(h) or h.lower() for h in given if h != "*"} | set(LOOPBACK_NAMES)

    def allows(self, header: str | None) -> bool:
        """A malformed header is refused even when any name is accepted."""
        if not (header or "").strip():
            return self.any
        name = host_name(header or "")
        if not name:
            return False
        return self.any or name in self.names or is_ip_literal(name)


# ---------------------------------------------------------------------------------------------
# request body limit (pure ASGI: refuses before the body is read)
# ---------------------------------------------------------------------------------------------
class _TooLarge(Exception):
    pass


class BodyLimit:
    """ASGI middleware: 413 for a request body over ``max_bytes`` (by Content-Length before
    anything is read, or counted while a chunked body streams in)."""

    def __init__(self, app: Any, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for k, v in scope.get("headers") or ():
            if k == b"content-length":
                try:
                    declared = int(v)
                except ValueError:
                    await self._refuse(send, 400, "invalid Content-Length")
                    return
                if declared > self.max_bytes:
                    await self._refuse(send, 413, self._message())
                    return
        seen = 0
        started = refused = False

        async def limited_receive() -> Any:
            nonlocal seen, refused
            msg = await receive()
            if msg.get("type") == "http.request":
                seen += len(msg.get("body") or b"")
                if seen > self.max_bytes:
                    if not started:  # answer now; whatever the app sends after is dropped
                        await self._refuse(send, 413, self._message())
                    refused = True
                    raise _TooLarge
            return msg

        async def tracking_send(msg: Any) -> None:
            nonlocal started
            if refused:
                return
            if msg.get("type") == "http.response.start":
                started = True
            await send(msg)

        try:
            await self.app(scope, limited_receive, tracking_send)
        except _TooLarge:
            pass

    def _message(self) -> str:
        return f"request body larger than {self.max_bytes} bytes (kscope serve --max-body-bytes)"

    @staticmethod
    async def _refuse(send: Any, status: int, detail: str) -> None:
        body = orjson.dumps({"detail": detail})
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"connection", b"close"),
        ]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})
