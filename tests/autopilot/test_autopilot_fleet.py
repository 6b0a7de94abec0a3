"""The autopilot against a simulated fleet (real RPC servers and handlers on loopback, invented
processes): leases keep two autopilots from tracing one job twice, the limits hold, a daemon that
is down is marked and retried with back-off, opt-outs are honoured."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from threading import Barrier, Thread

import pytest
from sim_fleet import SimFleet

from kinetoscope.autopilot.policy import Policy
from kinetoscope.autopilot.service import Autopilot, AutopilotConfig, CycleReport
from kinetoscope.store.catalog import Catalog
from kinetoscope.store.fleet import FleetStore

POLICY = Policy(
    warmup_s=0,
    min_age_s=0,
    interval_s=3600,
    iterations=3,
    trace_timeout_s=1,
    rpc_timeout_s=5,
    max_in_flight=1000,
    backoff_base_s=60,
    workers=16,
)


def _pilot(fleet: SimFleet, url: str, instance: str, policy: Policy = POLICY) -> Autopilot:
    return Autopilot(
        AutopilotConfig(hosts=fleet.addresses, catalog_url=url, policy=policy, instance=instance)
    )


@pytest.fixture()
def fleet(tmp_path: Path):
    with SimFleet(12, procs_per_host=2, trace_root=str(tmp_path / "traces"), opted_out_every=4) as f:
        yield f


def test_two_autopilots_on_one_catalog_never_claim_the_same_job(fleet: SimFleet, catalog_url: str) -> None:
    pilots = [_pilot(fleet, catalog_url, f"pilot-{i}") for i in range(2)]
    planned: dict[str, list] = {}
    barrier = Barrier(2)

    def plan(p: Autopilot) -> None:
        report = CycleReport()
        result = p.discover(report)
        barrier.wait()
        planned[p.config.instance] = p.plan(report, set(result.failed))

    threads = [Thread(target=plan, args=(p,)) for p in pilots]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    keys = [s.job_key for v in planned.values() for s in v]
    assert len(keys) == len(set(keys)) == 9  # 12 hosts, one job each, hosts 0, 4, 8 opted out
    store = FleetStore(pilots[0].catalog)
    assert sorted(s.job_key for s in store.active_samples()) == sorted(keys)
    opted = {j["job_key"] for j in store.jobs() if j["opted_out"]}
    assert opted == {f"torch:sim{i}:29500:sim-{i}" for i in (0, 4, 8)} and not opted & set(keys)
    for p in pilots:
        p.close()


def test_limits_fleet_wide_and_per_host(fleet: SimFleet, tmp_path: Path) -> None:
    pilot = _pilot(fleet, str(tmp_path / "c.db"), "p", replace(POLICY, max_in_flight=5))
    report = CycleReport()
    pilot.plan(report, set(pilot.discover(report).failed))
    assert len(report.started) == 5
    again = CycleReport()
    assert pilot.plan(again, set()) == []  # fleet-wide limit reached: nothing more in flight
    pilot.close()


def test_a_daemon_that_is_down_is_marked_and_retried_with_backoff(fleet: SimFleet, tmp_path: Path) -> None:
    down = fleet.hosts[1]
    down.server.stop()
    pilot = _pilot(fleet, str(tmp_path / "c.db"), "p")
    first = CycleReport()
    pilot.discover(first)
    assert list(first.hosts_failed) == [down.address]
    hosts = {h["address"]: h for h in FleetStore(pilot.catalog).hosts()}
    assert hosts[down.address]["status"] == "down" and hosts[down.address]["failures"] == 1
    assert hosts[down.address]["next_retry"] is not None
    assert hosts[fleet.hosts[0].address]["status"] == "up"
    second = CycleReport()
    result = pilot.discover(second)
    assert result.skipped == [down.address] and second.hosts_failed == {}  # in back-off: not asked
    pilot.close()


def test_a_sample_whose_trace_never_comes_fails_with_the_trigger_s_reason(
    fleet: SimFleet, tmp_path: Path
) -> None:
    pilot = _pilot(fleet, str(tmp_path / "c.db"), "p", replace(POLICY, max_in_flight=2))
    report = pilot.run_cycle()
    assert len(report.finished) == 2
    samples = FleetStore(pilot.catalog).samples()
    # the invented processes never poll, so nothing is written: a timeout, recorded as a failure
    assert {(s.state, s.reason) for s in samples} == {("failed", "timeout")}
    assert all(s.request.get("files") for s in samples)
    with Catalog.open(str(tmp_path / "c.db")) as cat:
        assert cat.analyses(limit=None) == []
    pilot.close()


@pytest.mark.parametrize(
    ("changes", "per_cycle"),
    [
        ({"interval_s": 3600}, [9, 0]),  # once after the warm-up, then not before the interval
        ({"interval_s": 0}, [9, 9]),  # every cycle
        ({"warmup_s": 3600}, [0, 0]),  # still warming up
        ({"min_age_s": 3600}, [0, 0]),  # too young
        ({"max_in_flight": 4, "interval_s": 0}, [4, 4]),  # the fleet-wide limit
    ],
)
def test_schedule_over_cycles(fleet: SimFleet, tmp_path: Path, changes: dict, per_cycle: list[int]) -> None:
    pilot = _pilot(fleet, str(tmp_path / "c.db"), "p", replace(POLICY, **changes))
    try:
        started = [len(pilot.run_cycle().started) for _ in per_cycle]
        assert started == per_cycle
        by_job: dict[str, int] = {}
        for s in FleetStore(pilot.catalog).samples():
            by_job[s.job_key] = by_job.get(s.job_key, 0) + 1
        assert all(
            not k.startswith(("torch:sim0:", "torch:sim4:", "torch:sim8:")) for k in by_job
        )  # opted out
    finally:
        pilot.close()
