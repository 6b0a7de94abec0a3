"""Fuzz fixtures: input counters per surface, printed after the run (the figures of issue 16)."""

from __future__ import annotations

from collections import Counter

import pytest

_COUNTS: Counter[str] = Counter()


@pytest.fixture(scope="session")
def fuzz_counts() -> Counter[str]:
    """``fuzz_counts[surface] += k`` for every ``k`` hostile inputs a test sends to ``surface``
    (a name ending in ``)``, like ``"paths (accepted)"``, counts a subset: not in the total)."""
    return _COUNTS


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not _COUNTS:
        return
    terminalreporter.section("kscope fuzz: inputs tried per surface")
    for surface, n in sorted(_COUNTS.items()):
        terminalreporter.write_line(f"{surface:<28} {n:>8}")
    total = sum(n for surface, n in _COUNTS.items() if not surface.endswith(")"))  # "(...)": a subset
    terminalreporter.write_line(f"{'total':<28} {total:>8}")


# ------------------------------------------------------------------ a live daemon to fuzz
@pytest.fixture(scope="module")
def live_daemon(tmp_path_factory: pytest.TempPathFactory):
    """An in-process daemon on private endpoints (filesystem IPC socket in a short /tmp dir,
    ephemeral RPC port, temp trace root), shared by one module's fuzz tests."""
    import shutil
    import tempfile

    from kinetoscope.daemon.daemon import Daemon, DaemonOptions

    sockdir = tempfile.mkdtemp(prefix="ksf", dir="/tmp")
    root = str((tmp_path_factory.mktemp("fuzz") / "traces").resolve())
    d = Daemon(
        DaemonOptions(
            port=0, ipc_socket_dir=sockdir, trace_root=root, metrics_port=None, hostname="fuzzhost",
            gpu_metrics=False, rpc_timeout_s=5.0,
        )
    )  # fmt: skip
    d.start()
    try:
        yield d
    finally:
        d.stop()
        shutil.rmtree(sockdir, ignore_errors=True)
