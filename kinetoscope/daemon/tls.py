"""TLS and mutual TLS for the daemon's RPC port (``--tls-cert --tls-key [--tls-client-ca]``).

Why in the daemon and with the standard library's ``ssl``: the RPC port is the one way to
trigger traces and list processes; across hosts it used to need stunnel or an SSH tunnel in
front (docs/security.md). With a certificate the daemon speaks TLS itself (TLS 1.2 or newer);
with ``--tls-client-ca`` it also requires every client to present a certificate signed by that
CA (mutual TLS), which authenticates clients without a shared token. A token, when set, is still
checked inside the TLS connection.

A client that speaks plain text to a TLS daemon gets one plain-text answer saying so (the first
byte of a TLS connection is always 0x16, a handshake record; rpc_server peeks at it), so
``dyno`` and old ``kscope`` clients fail with a clear line instead of a reset.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass

from kinetoscope.errors import KinetoscopeError

TLS_HANDSHAKE_RECORD = 0x16  # the first byte a TLS client sends (a handshake record)
PLAIN_CLIENT_ERROR = (
    "this daemon requires TLS (it runs with --tls-cert): connect with --tls-ca CA.pem "
    "(and --tls-cert/--tls-key if it requires client certificates)"
)


@dataclass(frozen=True)
class TlsServerOptions:
    """The daemon's certificate and key; ``client_ca`` turns on mutual TLS."""

    cert: str
    key: str
    client_ca: str | None = None

    def context(self) -> ssl.SSLContext:
        """The server context. Raises KinetoscopeError naming the file that cannot be used."""
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        try:
            ctx.load_cert_chain(self.cert, self.key)
        except (OSError, ssl.SSLError) as exc:
            raise KinetoscopeError(
                f"--tls-cert {self.cert} / --tls-key {self.key}: cannot load the certificate and key ({_why(exc)})"
            ) from exc
        if self.client_ca is not None:
            try:
                ctx.load_verify_locations(cafile=self.client_ca)
            except (OSError, ssl.SSLError) as exc:
                raise KinetoscopeError(
                    f"--tls-client-ca {self.client_ca}: cannot load CA certificates ({_why(exc)})"
                ) from exc
            ctx.verify_mode = ssl.CERT_REQUIRED
        return ctx

    @property
    def mutual(self) -> bool:
        return self.client_ca is not None


def _why(exc: BaseException) -> str:
    return str(getattr(exc, "strerror", None) or getattr(exc, "reason", None) or exc)


def server_tls(cert: str | None, key: str | None, client_ca: str | None) -> TlsServerOptions | None:
    """Options from the daemon's flags; None without ``--tls-cert``. Raises KinetoscopeError
    for a half-given pair or a client CA without a certificate."""
    if cert is None and key is None:
        if client_ca is not None:
            raise KinetoscopeError("--tls-client-ca needs --tls-cert and --tls-key (mutual TLS is TLS first)")
        return None
    if cert is None or key is None:
        raise KinetoscopeError("--tls-cert and --tls-key go together (the daemon's certificate and its key)")
    return TlsServerOptions(cert, key, client_ca)
