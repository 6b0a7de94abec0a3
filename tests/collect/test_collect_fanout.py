"""`kscope trace --hosts-file` to many hosts (issue 12, "Fan-out to 1,000 hosts"), against a
simulated fleet: 50 daemons on loopback, each the daemon's real RPC server, handlers and registry
(benchmarks/sim_fleet.py; only the registered processes are invented), some of them down.

Hosts that are down are listed as ``unreachable`` errors and the others are triggered all the
same (exit 1, docs/collect.md); the fan-out is counted and timed in ``--json``; on a terminal a
hosts answered/failed bar goes to stderr, never into ``--json`` stdout. No timing is asserted."""

from __future__ import annotations

import os
import pty
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from kinetoscope.collect.client import read_hosts_file
from kinetoscope.collect.trigger import save_manifest
from kinetoscope.errors import UsageError
from tests.collect.conftest import REPO_ROOT, kscope_env

sys.path.insert(0, str(REPO_ROOT / "benchmarks"))
from sim_fleet import SimFleet, write_hosts_file  # noqa: E402 - benchmarks/ is not a package

HOSTS, PROCS, DOWN = 50, 2, (0, 7, 21, 33, 49)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimFleet]:
    """50 simulated daemons sharing one trace root; those at DOWN are stopped (refuse connections)."""
    root = tmp_path_factory.mktemp("fanout") / "traces"
    with SimFleet(HOSTS, procs_per_host=PROCS, trace_root=str(root)) as f:
        for i in DOWN:
            f.hosts[i].server.stop()
        yield f


@pytest.fixture()
def hosts_file(fleet: SimFleet, tmp_path: Path) -> Path:
    """Every address once, the first three again (duplicates are dropped), comments and blank lines."""
    path = write_hosts_file(tmp_path / "fleet.txt", fleet.addresses)
    with path.open("a", encoding="utf-8") as f:
        f.write("\n# again\n" + "\n".join(fleet.addresses[:3]) + "  # dup\n")
    return path


def _split(fleet: SimFleet) -> tuple[set[str], set[str]]:
    down = {fleet.addresses[i] for i in DOWN}
    return down, set(fleet.addresses) - down


def _poll(fleet: SimFleet) -> None:
    """The simulated processes pick up their configs, so the next request does not find them busy."""
    fleet.poll_all()


def test_hosts_file_fanout_lists_down_hosts_and_triggers_the_others(kscope_main, fleet, hosts_file):
    down, up = _split(fleet)
    code, out, _err = kscope_main(
        "trace",
        "--hosts-file",
        str(hosts_file),
        "--host",
        fleet.addresses[1],  # also in the file: asked once
        "--all",
        "--iterations",
        "3",
        "--no-align",
        "--no-catalog",
        "--json",
    )
    _poll(fleet)
    assert code == 1  # an error (the hosts that are down), the others triggered all the same
    doc = orjson.loads(out)  # stdout is one JSON document
    assert {e["host"] for e in doc["errors"]} == down
    assert {e["kind"] for e in doc["errors"]} == {"unreachable"}
    assert all("connection refused" in e["message"] for e in doc["errors"])
    triggered = [m for m in doc["matched"] if m["triggered"]]
    assert len(triggered) == len(up) * PROCS
    assert {m["host"] for m in triggered} == up
    assert len(doc["files"]) == len(up) * PROCS and doc["manifest"]
    assert doc["hosts"] == {"total": HOSTS, "answered": len(up), "failed": len(down)}
    timing = doc["timing"]
    assert 0 <= timing["first_answer_s"] <= timing["all_answered_s"]
    assert timing["listing_s"] is None  # --no-align: no listing before the trigger


def test_wait_over_many_hosts_reports_each_missing_file_once(kscope_main, fleet, hosts_file):
    """--wait polls only the hosts that answered; the simulated processes never write their
    files, so each triggered file is one ``timeout`` error, and each down host one ``unreachable``."""
    down, up = _split(fleet)
    code, out, _err = kscope_main(
        "trace", "--hosts-file", str(hosts_file), "--all", "--iterations", "3", "--no-align",
        "--no-catalog", "--wait", "--timeout", "1", "--json",
    )  # fmt: skip
    _poll(fleet)
    doc = orjson.loads(out)
    assert code == 1 and doc["waited"]
    by_kind: dict[str, list[dict[str, object]]] = {}
    for e in doc["errors"]:
        by_kind.setdefault(str(e["kind"]), []).append(e)
    assert sorted(by_kind) == ["timeout", "unreachable"]
    assert {e["host"] for e in by_kind["unreachable"]} == down
    timeouts = {(e["host"], e["pid"]) for e in by_kind["timeout"]}
    assert timeouts == {(f["host"], f["pid"]) for f in doc["files"]} and len(timeouts) == len(up) * PROCS


def _trace_all_args(hosts_file) -> tuple[str, ...]:
    """``kscope trace`` of every process of the hosts in ``hosts_file``, 3 iterations, unaligned."""
    return (
        "trace",
        "--hosts-file",
        str(hosts_file),
        "--all",
        "--iterations",
        "3",
        "--no-align",
        "--no-catalog",
    )


def test_large_requests_print_a_summary_not_every_row(kscope_main, fleet, hosts_file, monkeypatch):
    """Above TABLE_MAX_ROWS processes the human output is a summary plus the rows that need a look."""
    import kinetoscope.cli.trace_cmd as trace_cmd

    monkeypatch.setattr(trace_cmd, "TABLE_MAX_ROWS", 10)
    args = _trace_all_args(hosts_file)
    code, out, _err = kscope_main(*args)
    _poll(fleet)
    flat = " ".join(out.split())
    assert code == 1
    assert "90 processes matched on 45 hosts: 90 traced (--json lists every process)" in flat
    assert "90 trace files: 90 pending" in flat and ".pt.trace.json" not in out  # no table of 90 rows

    code, out, _err = kscope_main(*args, "--wait", "--timeout", "1")
    _poll(fleet)
    flat = " ".join(out.split())
    assert code == 1 and "90 trace files: 90 incomplete" in flat
    assert "90 incomplete file(s) (first 10)" in flat and flat.count(".pt.trace.json") == 10


def test_aligned_fanout_times_the_listing_too(kscope_main, fleet, hosts_file):
    code, out, _err = kscope_main(
        "trace", "--hosts-file", str(hosts_file), "--all", "--iterations", "3", "--no-catalog", "--json"
    )
    _poll(fleet)
    doc = orjson.loads(out)
    assert code == 1 and doc["hosts"]["answered"] == HOSTS - len(DOWN)
    assert any("aligning" in n for n in doc["notes"])
    assert doc["timing"]["listing_s"] >= 0 and doc["timing"]["all_answered_s"] >= 0


def _run_with_tty_stderr(*args: str) -> tuple[int, str, str]:
    """The real CLI with stderr on a pseudo-terminal (as a person sees it) and stdout on a pipe."""
    master, slave = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "kinetoscope.cli.main", *args],
        cwd=REPO_ROOT,
        env=kscope_env({"TERM": "xterm"}),
        stdout=subprocess.PIPE,
        stderr=slave,
        stdin=subprocess.DEVNULL,
    )
    os.close(slave)
    chunks: list[bytes] = []

    def drain() -> None:
        while True:
            try:
                data = os.read(master, 65536)
            except OSError:  # EIO: the child closed the terminal
                return
            if not data:
                return
            chunks.append(data)

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    out, _ = proc.communicate(timeout=120)
    reader.join(timeout=10)
    os.close(master)
    return proc.returncode, out.decode(), b"".join(chunks).decode(errors="replace")


def test_progress_on_a_terminal_and_never_in_json(fleet, hosts_file):
    args = _trace_all_args(hosts_file)
    code, out, err = _run_with_tty_stderr(*args)
    _poll(fleet)
    flat = " ".join(err.split())
    assert code == 1, err
    assert "answered, 5 failed / 50 hosts" in flat  # the bar (its last frame is drawn when it stops)
    assert "45 of 50 hosts answered, 5 failed" in flat and "90 processes triggered" in flat
    assert "Traceback" not in err and "pid" in out  # the matched table on stdout

    code, out, err = _run_with_tty_stderr(*args, "--json")
    _poll(fleet)
    assert code == 1
    assert orjson.loads(out)["hosts"]["failed"] == 5  # stdout is only the JSON document
    assert "/ 50 hosts" not in err and "hosts answered" not in err  # no bar, no summary with --json


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("node1\n# rack 2\nnode2:99999\n", "line 3: bad host 'node2:99999': port must be a number"),
        ("node1\n[::1\n", "line 2: bad host '[::1': missing ']'"),
        ("# nothing but comments\n\n", "no host listed"),
        (b"node1\n\xff\xfe\n", "not UTF-8 text"),
    ],
)
def test_bad_hosts_file_is_one_line_naming_file_and_line(kscope_main, tmp_path, content, message):
    path = tmp_path / "hosts.txt"
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content, encoding="utf-8")
    code, out, err = kscope_main("trace", "--hosts-file", str(path), "--all", "--iterations", "3")
    assert code == 2 and out == ""
    line = " ".join(err.split())
    assert f"hosts file {path}" in line and message in line
    assert "Traceback" not in err


def test_missing_hosts_file_real_cli(run_kscope, tmp_path):
    r = run_kscope("trace", "--hosts-file", str(tmp_path / "nope.txt"), "--all", "--iterations", "3")
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [
        f"error: cannot read hosts file {tmp_path / 'nope.txt'}: No such file or directory"
    ]


def test_read_hosts_file_normalises_and_drops_duplicates(tmp_path):
    p = tmp_path / "hosts"
    p.write_text("node1\nnode1:1778\n[::1]:1780 # v6\n::1\n", encoding="utf-8")
    assert read_hosts_file(str(p)) == ["node1:1778", "[::1]:1780", "[::1]:1778"]
    p.write_text("node1:0\n", encoding="utf-8")
    with pytest.raises(UsageError, match=r"hosts file .* line 1: bad host"):
        read_hosts_file(str(p))


def test_per_host_trace_roots_each_get_the_whole_manifest(tmp_path):
    """save_manifest encodes once and writes the same manifest into every request folder."""
    from kinetoscope.collect.trigger import MatchedProcess, Target, TraceFile, TraceOptions, TraceResult
    from kinetoscope.protocol.manifest import read_manifest

    res = TraceResult("kst-roots", [], Target(all=True), TraceOptions(iterations=3))
    for i in range(3):
        folder = tmp_path / f"host{i}" / "kst-roots"
        res.output_dirs.append(str(folder))
        path = str(folder / f"rank-{i}_{100 + i}.pt.trace.json")
        res.matched.append(
            MatchedProcess(f"h{i}:1778", f"h{i}", 100 + i, i, i, 3, "0", "python x", path, True, False)
        )
        res.files.append(TraceFile(host=f"h{i}:1778", pid=100 + i, rank=i, path=path))
    written = save_manifest(res)
    assert written == [str(tmp_path / f"host{i}" / "kst-roots" / "manifest.json") for i in range(3)]
    for folder in res.output_dirs:
        m = read_manifest(folder)
        assert m.trace_id == "kst-roots" and [f.rank for f in m.files] == [0, 1, 2]
