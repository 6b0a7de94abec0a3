"""TLS for RPC clients: one set of options for every command that talks to daemons.

Why one place: ``kscope trace``, ``kscope autopilot``, ``kscope serve``'s trigger (and any later
command that calls a daemon) take the same ``--tls-ca [--tls-cert --tls-key]`` flags
(``kinetoscope.cli.tls_options``) and turn them into one :class:`TlsClientOptions`; the command
installs it with :func:`use_tls`, and every :class:`~kinetoscope.collect.client.DaemonClient`
made afterwards in that process speaks TLS (an explicit ``tls=`` argument wins). The daemon side
is ``kinetoscope.daemon.tls``; docs/deploy.md §4 says how to make the certificates.

TLS failures become one line naming the reason (:func:`tls_reason`): the daemon's certificate is
not signed by ``--tls-ca`` or does not name the host, the daemon wants a client certificate, the
daemon does not trust ours, or the daemon speaks plain text.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from functools import cached_property

from kinetoscope.errors import UsageError


@dataclass(frozen=True)
class TlsClientOptions:
    """``ca``: the CA file that signed the daemons' certificates (turns TLS on); ``cert`` and
    ``key``: this client's certificate and key, for daemons that require one (mutual TLS);
    ``server_name``: check the daemons' certificate against this name instead of the host name
    or address dialed (a fleet of daemons sharing one certificate, reached by pod IP)."""

    ca: str
    cert: str | None = None
    key: str | None = None
    server_name: str | None = None  # the name the daemons' certificate must carry (default: the host dialed)

    def __post_init__(self) -> None:
        if (self.cert is None) != (self.key is None):
            raise UsageError("--tls-cert and --tls-key go together (the client certificate and its key)")

    @cached_property
    def context(self) -> ssl.SSLContext:
        """The verifying client context (TLS 1.2+, host names checked), built once."""
        try:
            ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=self.ca)
        except (OSError, ssl.SSLError) as exc:
            raise UsageError(f"--tls-ca {self.ca}: cannot load CA certificates ({_why(exc)})") from exc
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        if self.cert is not None:
            try:
                ctx.load_cert_chain(self.cert, self.key)
            except (OSError, ssl.SSLError) as exc:
                raise UsageError(
                    f"--tls-cert {self.cert} / --tls-key {self.key}: cannot load ({_why(exc)})"
                ) from exc
        return ctx


def _why(exc: BaseException) -> str:
    return str(getattr(exc, "strerror", None) or getattr(exc, "reason", None) or exc)


def client_tls(
    ca: str | None, cert: str | None, key: str | None, server_name: str | None = None
) -> TlsClientOptions | None:
    """Options from the three flags; None without ``--tls-ca``. Raises UsageError for a
    client certificate without a CA (it would silently go unused)."""
    if ca is None:
        if cert is not None or key is not None:
            raise UsageError(
                "--tls-cert/--tls-key need --tls-ca (the CA that signed the daemons' certificates)"
            )
        return None
    options = TlsClientOptions(ca, cert, key, server_name or None)
    _ = options.context  # bad files are a usage error now, not one per host later
    return options


_default: TlsClientOptions | None = None


def use_tls(options: TlsClientOptions | None) -> None:
    """Make ``options`` the TLS setting of every DaemonClient created afterwards in this process."""
    global _default
    _default = options


def default_tls() -> TlsClientOptions | None:
    """The process-wide TLS setting (:func:`use_tls`), None = plain text."""
    return _default


# OpenSSL reason codes -> what they mean for a kscope client.
_REASONS = {
    "CERTIFICATE_VERIFY_FAILED": "the daemon's certificate was not accepted",
    "TLSV13_ALERT_CERTIFICATE_REQUIRED": (
        "the daemon requires a client certificate (mutual TLS): pass --tls-cert and --tls-key"
    ),
    "SSLV3_ALERT_HANDSHAKE_FAILURE": (
        "the daemon refused the TLS handshake (does it require a client certificate? pass --tls-cert and --tls-key)"
    ),
    "TLSV1_ALERT_UNKNOWN_CA": (
        "the daemon refused our client certificate: it is not signed by a CA the daemon trusts (--tls-client-ca)"
    ),
    "SSLV3_ALERT_BAD_CERTIFICATE": "the daemon refused our client certificate (bad certificate)",
    "SSLV3_ALERT_CERTIFICATE_EXPIRED": "the daemon refused our client certificate: it has expired",
    "WRONG_VERSION_NUMBER": "the daemon does not speak TLS (a plain-text daemon? then drop --tls-ca)",
    "RECORD_LAYER_FAILURE": "the daemon does not speak TLS (a plain-text daemon? then drop --tls-ca)",
    "PACKET_LENGTH_TOO_LONG": "the daemon does not speak TLS (a plain-text daemon? then drop --tls-ca)",
}


def tls_reason(exc: ssl.SSLError, ca: str | None = None) -> str:
    """One line saying why a TLS connection failed."""
    if isinstance(exc, ssl.SSLCertVerificationError):
        detail = exc.verify_message or "verification failed"
        hint = f"is it signed by the CA in --tls-ca {ca}" if ca else "is it signed by the CA in --tls-ca"
        return (
            f"TLS: the daemon's certificate was not accepted ({detail}; {hint}, and does it name this host?)"
        )
    reason = getattr(exc, "reason", None) or ""
    text = _REASONS.get(reason)
    if text is None and isinstance(exc, (ssl.SSLEOFError, ssl.SSLZeroReturnError)):
        text = "the daemon closed the TLS connection (did it refuse our client certificate?)"
    return f"TLS: {text or reason or exc}"
