"""``kscope stacks`` bad input and unreachable daemons: one line naming the cause, non-zero exit,
never a traceback."""

from __future__ import annotations

import json
import socket
from pathlib import Path

from tests.stacks.conftest import kscope


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_needs_exactly_one_target() -> None:
    res = kscope("stacks", "--host", "127.0.0.1:9")
    assert res.returncode != 0 and "exactly one of --job-id" in res.stderr and "Traceback" not in res.stderr
    res = kscope("stacks", "--job-id", "1", "--samples", "0")
    assert res.returncode != 0 and "--samples must be from 1 to 20" in res.stderr


def test_empty_hosts_file_is_named(tmp_path: Path) -> None:
    f = tmp_path / "hosts.txt"
    f.write_text("# nobody\n", encoding="utf-8")
    res = kscope("stacks", "--hosts-file", str(f), "--job-id", "1")
    assert res.returncode != 0 and f"hosts file {f}: no host listed" in res.stderr


def test_unreachable_daemon_is_an_error_line_and_json_says_so() -> None:
    port = _closed_port()
    res = kscope("stacks", "--host", f"127.0.0.1:{port}", "--job-id", "1")
    assert res.returncode == 1 and "connection refused" in res.stderr and "Traceback" not in res.stderr
    res = kscope("stacks", "--host", f"127.0.0.1:{port}", "--job-id", "1", "--json")
    assert res.returncode == 1
    doc = json.loads(res.stdout)
    assert doc["ranks"] == [] and doc["errors"][0]["kind"] == "unreachable"
