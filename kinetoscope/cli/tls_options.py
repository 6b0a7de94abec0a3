"""The client TLS flags every command that calls daemons shares: ``--tls-ca [--tls-cert --tls-key]
[--tls-server-name]``.

Use in a command (see trace_cmd.py)::

    tls_ca: str | None = TLS_CA, tls_cert: str | None = TLS_CERT, tls_key: str | None = TLS_KEY,
    tls_server_name: str | None = TLS_SERVER_NAME,
    ...
    apply_client_tls(tls_ca, tls_cert, tls_key, tls_server_name)   # before the first DaemonClient

``apply_client_tls`` validates the files (a one-line UsageError naming the flag) and installs the
setting process-wide (``kinetoscope.collect.tls.use_tls``), so every DaemonClient the command
creates afterwards, in any thread, speaks TLS. docs/deploy.md §4 describes the flags.
"""

from __future__ import annotations

import typer

from kinetoscope.collect.tls import TlsClientOptions, client_tls, use_tls

TLS_CA = typer.Option(
    None,
    "--tls-ca",
    envvar="KSCOPE_TLS_CA",
    metavar="PEM",
    help="Talk TLS to the daemons, trusting the CA in this file (env KSCOPE_TLS_CA).",
    show_default=False,
)
TLS_CERT = typer.Option(
    None,
    "--tls-cert",
    envvar="KSCOPE_TLS_CERT",
    metavar="PEM",
    help="Client certificate for daemons that require one (mutual TLS; with --tls-key).",
    show_default=False,
)
TLS_KEY = typer.Option(
    None,
    "--tls-key",
    envvar="KSCOPE_TLS_KEY",
    metavar="PEM",
    help="The key of --tls-cert.",
    show_default=False,
)

TLS_SERVER_NAME = typer.Option(
    None,
    "--tls-server-name",
    envvar="KSCOPE_TLS_SERVER_NAME",
    metavar="NAME",
    help="Check the daemons' certificate for this name instead of the host dialed.",
    show_default=False,
)


def apply_client_tls(
    ca: str | None, cert: str | None, key: str | None, server_name: str | None = None
) -> TlsClientOptions | None:
    """Validate the flags and make them the process's client TLS setting."""
    options = client_tls(ca, cert, key, server_name)
    use_tls(options)
    return options
