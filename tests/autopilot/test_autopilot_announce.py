"""`kscope daemon --catalog URL` announces itself; `kscope autopilot --announced` watches it
without being told its address. Real daemon subprocess, real catalog."""

from __future__ import annotations

import json
from pathlib import Path

from kinetoscope.store.catalog import Catalog
from kinetoscope.store.fleet import FleetStore
from tests.autopilot.conftest import run_kscope, wait_until, write_policy


def _announced(url: str) -> list[dict]:
    if not Path(url).exists():
        return []
    with Catalog.open(url) as cat:
        return [h for h in FleetStore(cat).hosts() if h["announced"] is not None]


def test_a_daemon_announces_itself_and_the_autopilot_finds_it(tmp_path: Path) -> None:
    from kinetoscope.demo.local import LocalDaemon

    url = str(tmp_path / "catalog.db")
    daemon = LocalDaemon(tmp_path / "host", extra_args=["--catalog", url])
    try:
        daemon.start(timeout=60)
        rows = wait_until(lambda: _announced(url), 120, "the daemon's heartbeat in the catalog")
        assert [r["address"] for r in rows] == [str(daemon.address)]
        assert rows[0]["hostname"] and rows[0]["version"]
        none = run_kscope("autopilot", "--catalog", url, "--once")
        assert none.returncode == 2 and "--announced" in none.stderr
        res = run_kscope(
            "autopilot",
            "--announced",
            "--catalog",
            url,
            "--once",
            "--json",
            "--policy",
            str(write_policy(tmp_path / "p.toml")),
        )
        assert res.returncode == 0, res.stderr[-2000:]
        report = json.loads(res.stdout)
        assert report["hosts_answered"] == 1 and report["hosts_failed"] == {}
    finally:
        daemon.stop()
