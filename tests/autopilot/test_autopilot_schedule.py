"""The schedule a user can read and change: `--once` says per job why nothing was traced and when
it will be; a changed policy applies to jobs already known; jobs nobody sees any more end; no
daemon answering is a non-zero exit. Against the simulated fleet (real RPC servers on loopback)
and the real CLI."""

from __future__ import annotations

import re
import socket
from dataclasses import replace
from datetime import timedelta
from pathlib import Path

import pytest
from sim_fleet import SimFleet

from kinetoscope.autopilot.fleetview import all_job_rows
from kinetoscope.autopilot.policy import Policy
from kinetoscope.autopilot.service import Autopilot, AutopilotConfig
from kinetoscope.store.catalog import Catalog
from kinetoscope.store.fleet import FleetStore, SeenJob, utcnow
from tests.autopilot.conftest import run_kscope

POLICY = Policy(
    interval_s=3600, iterations=3, trace_timeout_s=1, rpc_timeout_s=5, max_in_flight=1000, workers=8
)
DUE = re.compile(r"first due \d\d:\d\d:\d\d UTC, in [\d.]+ (s|min|h) \(warmup_s=(\d+)\)$")


@pytest.fixture()
def fleet(tmp_path: Path):
    with SimFleet(4, procs_per_host=2, trace_root=str(tmp_path / "traces"), opted_out_every=4) as f:
        yield f


def _pilot(fleet: SimFleet, url: str, policy: Policy) -> Autopilot:
    return Autopilot(AutopilotConfig(hosts=fleet.addresses, catalog_url=url, policy=policy, instance="p"))


def test_once_says_why_each_job_waits_and_a_new_policy_applies_to_known_jobs(
    fleet: SimFleet, tmp_path: Path
) -> None:
    url = str(tmp_path / "c.db")
    pilot = _pilot(fleet, url, replace(POLICY, warmup_s=3600))
    report = pilot.run_cycle()
    pilot.close()
    assert report.started == [] and len(report.waiting) == 4
    opted = [k for k, why in report.waiting.items() if why.startswith("opted out")]
    assert opted == ["torch:sim0:29500:sim-0"]
    for key, why in report.waiting.items():
        if key not in opted:
            m = DUE.search(why)
            assert m and m.group(2) == "3600", why
    pilot = _pilot(fleet, url, replace(POLICY, warmup_s=0))  # the same jobs, a new policy
    again = pilot.run_cycle()
    pilot.close()
    assert len(again.started) == 3, again.waiting
    pilot = _pilot(fleet, url, replace(POLICY, warmup_s=0, interval_s=600))
    third = pilot.run_cycle()
    pilot.close()
    assert third.started == []
    assert all("next due" in w and "interval_s=600" in w for k, w in third.waiting.items() if k not in opted)


def test_cli_once_prints_one_line_per_waiting_job(fleet: SimFleet, tmp_path: Path) -> None:
    url = str(tmp_path / "c.db")
    res = run_kscope(
        "autopilot", *[a for h in fleet.addresses for a in ("--host", h)], "--catalog", url, "--once"
    )
    assert res.returncode == 0, res.stderr
    lines = res.stdout.strip().splitlines()
    waiting = [ln for ln in lines if DUE.search(ln)]
    assert len(waiting) == 3 and all(m.group(2) == "300" for ln in waiting if (m := DUE.search(ln)))
    assert lines[-1].startswith("autopilot cycle: 4/4 daemons answered, 4 jobs, 0 samples started")


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_no_daemon_answering_is_a_non_zero_exit(tmp_path: Path) -> None:
    address = f"127.0.0.1:{_closed_port()}"
    url = str(tmp_path / "c.db")
    res = run_kscope("autopilot", "--host", address, "--catalog", url, "--once")
    errors = [ln for ln in res.stderr.splitlines() if ln.startswith("error:")]
    assert res.returncode == 1 and len(errors) == 1, res.stderr
    assert errors[0].startswith(f"error: no daemon answered: daemon {address}: connection refused")
    again = run_kscope(
        "autopilot", "--host", address, "--catalog", url, "--once", "--json"
    )  # now in back-off
    assert again.returncode == 1 and f"{address}: down earlier, in back-off" in again.stderr


def test_a_job_nobody_sees_any_more_ends(tmp_path: Path) -> None:
    with Catalog.open(str(tmp_path / "c.db")) as cat:
        store = FleetStore(cat)
        job = SeenJob("proc:gone:1", "0", "python x.py", ["down:1778"], [{"pid": 1}], 1, 1, False, 10)
        store.upsert_jobs([job], warmup_s=300, now=utcnow() - timedelta(hours=2))
        assert [r["state"] for r in all_job_rows(store)] == ["not seen"]  # no autopilot ended it yet
        # its host does not answer: only the stale rule can end it
        assert store.mark_ended([], [], stale_after_s=7200 + 60) == []
        assert store.mark_ended([], [], stale_after_s=3600) == ["proc:gone:1"]
        row = all_job_rows(store)[0]
        assert (row["state"], row["samples_total"], row["traces"]) == ("ended", 0, 0)
