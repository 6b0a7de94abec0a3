"""Diagnosis of real 4-rank DDP jobs (torchrun, gloo, CPU) traced through the kscope daemon, with
an injected straggler (conftest / daemon_runs.py): clean, persistent, intermittent.

Tolerance (docs/diagnosis.md, Validation): the verdict is checked against what happened, from
the raw JSON with the standard library (``benchmarks/diag_scenarios/truth.py``), not against what
was injected alone: on a loaded 2-core box the host itself holds a rank back 100-250 ms now and
then (as long as the injected 150 ms sleeps; seen in CI: rank 3 late in 4 steps it never slept
in). In the intermittent run, in the steps where no rank but the sleepers arrived late, every
injected (step, rank) is found except at most one and at most one other is reported; in the
steps where the host made another rank late, every rank reported was really late there.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import orjson
import polars as pl
import pytest

from benchmarks.diag_scenarios import truth
from kinetoscope.diagnosis import diagnose
from kinetoscope.diagnosis.stragglers.kinds import job_kind
from kinetoscope.protocol.manifest import read_manifest
from kinetoscope.trace import load_trace

pytestmark = [pytest.mark.slow, pytest.mark.torch]

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _found(diag) -> set[tuple[int, int]]:
    s = diag.stragglers
    return {
        (st, r)
        for st, lr in zip(s.per_step["step"].to_list(), s.per_step["late_ranks"].to_list(), strict=True)
        for r in lr
    }


def _truth_shares(trace_dir) -> dict[int, float]:
    """Each rank's imposed wait per step as a share of a step, from arrival order (the k-th
    ``c10d::allreduce_`` of every rank is one instance; the last rank imposes last − second-to-last),
    computed from the raw JSON by the accuracy benchmark's standard-library truth."""
    gt, step, n_steps = truth.cpu_ground_truth(sorted(trace_dir.glob("rank-*.pt.trace.json")))
    assert gt.n_instances >= 16 and step > 0 and n_steps >= 16
    return {r: w / n_steps / step for r, w in gt.imposed_us.items()}


def test_traces_are_on_demand_traces_from_the_daemon(ddp_runs):
    run = ddp_runs("none")
    manifest = read_manifest(run.trace_dir)
    assert sorted((f.rank, f.world_size, f.complete) for f in manifest.files) == [
        (r, 4, True) for r in range(4)
    ]
    assert (
        "ACTIVITIES_ITERATIONS=16" in manifest.config
        and f"PROFILE_START_ITERATION_ROUNDUP={run.roundup}" in manifest.config
    )
    assert len({f.job_id for f in manifest.files}) == 1
    files = sorted(run.trace_dir.glob("rank-*.pt.trace.json"))
    assert len(files) == 4
    for f in files:
        doc = orjson.loads(f.read_bytes())
        assert "distributedInfo" not in doc  # on-demand traces have none: ranks come from the manifest
        assert doc.get("trace_id") == manifest.trace_id
        names = {e.get("name", "") for e in doc["traceEvents"]}
        assert not any(n.startswith("ProfilerStep#") for n in names)
        assert "Optimizer.step#SGD.step" in names
        assert "gloo:all_reduce" in names and "c10d::allreduce_" in names
        assert any(n.startswith("enumerate(DataLoader)") for n in names)  # the emulated data loading
        t = load_trace(f)
        assert t.meta.rank_source == "manifest" and t.meta.world_size == 4 and t.meta.job_id
    # the ranks traced the same iterations: the first traced step of every rank is the same job step
    assert len(run.job_steps) >= 16 and run.job_steps[0] == run.roundup + 1


def test_clean_run_says_none(ddp_runs):
    run = ddp_runs("none")
    assert run.injected == {}
    diag = diagnose(run.trace_dir)
    job = diag.to_dict()["job"]
    assert job["ranks_found"] == [0, 1, 2, 3] and job["missing_ranks"] == [] and job["world_size"] == 4
    assert job["step_source"] == "optimizer" and job["steps_found"] >= 16
    assert job["collective_signal"] == ["backend_annotation"]
    # 4 ranks on a 2-core box: the host alone can make a rank late — a few ms in many steps (seen
    # in clean CI runs: rank 1 late in 5 of 16 steps, 2 % of step time), or descheduled 85 ms in
    # two steps (seen at load average 7: 15 % of step time, which every peer really waited). So
    # the verdict is checked against what happened, computed from arrival order with the
    # standard library (benchmarks/diag_scenarios/truth.py), not against "nothing was injected".
    s = diag.stragglers
    found = _found(diag)
    share = _truth_shares(run.trace_dir)  # rank -> wait it imposed per step, as a share of a step
    host_made = {r for r, v in share.items() if v >= 0.05}
    if s.kind != "none":
        # never a rank the truth says made nobody wait; a cost of 10 % or more only when the
        # host made a straggler, and then the verdict names it
        assert all(share[r] >= 0.01 for r in s.ranks), (share, diag.render_text())
        if (s.lost_fraction or 0.0) >= 0.10:
            assert host_made & set(s.ranks), (share, diag.render_text())
        assert len([r for _, r in found if r not in s.ranks]) <= 1, diag.render_text()
    else:
        assert diag.summary()[0].startswith("NO STRAGGLER")
        assert max(share.values()) < 0.15, (share, diag.render_text())  # no big straggler hidden
        # every rank the per-step evidence marks late is named in the reason, with a cost under the floor
        evidence_ranks = {r for _, r in found}
        # or one stall of one rank (descheduled once), shown per step and called isolated
        isolated = re.match(
            r"one isolated late arrival \(rank (\d+), step (\d+)\) is not a pattern", s.reason
        )
        if isolated:
            assert found == {(int(isolated.group(2)), int(isolated.group(1)))}, diag.render_text()
        elif evidence_ranks:
            listed = re.match(r"rank\(s\) \[([\d, ]+)\]", s.reason)
            assert listed, s.reason
            assert evidence_ranks <= {int(r) for r in listed.group(1).split(",")}, diag.render_text()
            cost = re.search(r"(?:costing|save only) ([\d.]+)% of step time \(< ([\d.]+)%\)", s.reason)
            # or frequency-only ranks late in no more steps than chance gives, whatever they cost
            # (docs/diagnosis-stragglers.md: arrival jitter); the 15 % bound above still holds
            jitter = "late in no more steps than chance gives and never beyond the noise" in s.reason
            assert jitter or (cost and float(cost.group(1)) < float(cost.group(2))), s.reason
    # 16 traced steps: the first is analysed when every rank's window began at its start (after
    # an optimizer step); on a loaded host a rank's window can begin inside it, and it is left out
    assert diag.stragglers.steps_analysed >= 15
    # one host, one clock: the offsets measured from collective ends stay within the jitter
    t = diag.clock.table
    assert set(t["method"].to_list()) == {"reference", "same_host"}
    for row in t.filter(pl.col("method") == "same_host").iter_rows(named=True):
        assert row["lower_bound_us"] <= 0.0 <= row["upper_bound_us"]
        assert abs(row["measured_us"]) < 5_000


def test_persistent_straggler_named(ddp_runs):
    run = ddp_runs("persistent")
    delay_us = run.scenario["straggler_ms"][0] * 1000
    assert {r for ranks in run.injected.values() for r in ranks} == {2} and len(run.injected) >= 16
    diag = diagnose(run.trace_dir)
    s = diag.stragglers
    assert s.kind == "persistent", diag.render_text()
    assert s.ranks == [2]
    assert s.hosts[2]  # the host to inspect is named
    row = s.per_rank.filter(pl.col("rank") == 2).row(0, named=True)
    assert row["late_share"] >= 0.9
    # the injected sleep is a floor; a loaded host can only add to it (CPU preemption of the
    # sleeper after it wakes), so the upper bound is loose: the lateness is about the sleep,
    # not a multiple of it
    assert 0.8 * delay_us < row["mean_lateness(us)"] < 1.5 * delay_us
    assert s.lost_fraction > 0.3 and s.est_step_time_us < s.mean_step_time_us
    # the traced steps are analysed and rank 2 is late in (nearly) all of them
    # (the first step is left out when a rank's window began inside it: 15 of 16 in one clean CI run)
    assert s.steps_analysed >= 15 and row["late_steps"] >= s.steps_analysed - 1
    # DDP's all-reduce equalises the ranks' wall step times: they differ far less than the
    # injected delay, so only arrivals (lateness / self time) single out rank 2.
    spread = diag.steps.group_by("step").agg(
        (pl.col("step_time(us)").max() - pl.col("step_time(us)").min()).alias("d")
    )
    assert float(spread["d"].median()) < 0.3 * delay_us
    self_time = dict(
        zip(s.per_rank["rank"].to_list(), s.per_rank["mean_self_time(us)"].to_list(), strict=True)
    )
    assert max(self_time, key=self_time.get) == 2
    # same host: no clock offset, and rank 2's collectives are paired with the same step's
    assert all(v == 0 for v in diag.clock.offsets.values())
    assert abs(diag.clock.table.filter(pl.col("rank") == 2)["measured_us"][0]) < 5_000
    rec = next(r for r in diag.recommendations if r["id"] == "straggler-persistent")
    assert rec["severity"] == "high" and rec["evidence"]["ranks"] == [2] and "rank 2" in rec["action"]
    assert "Hierarchical SGD does NOT help" in rec["action"]


def _truly_late(trace_dir, bar_us: float) -> set[tuple[int, int]]:
    """(step, rank) pairs where, by the standard-library truth, the rank arrived at one of the
    step's collectives at least ``bar_us`` behind the earliest rank: for whatever reason."""
    lateness = truth.cpu_step_lateness(sorted(trace_dir.glob("rank-*.pt.trace.json")))
    return {(k, r) for (r, k), v in lateness.items() if v >= bar_us}


def test_intermittent_stragglers_named(ddp_runs):
    run = ddp_runs("intermittent")
    injected = run.injected_pairs()
    assert len(injected) >= 4 and len({r for _s, r in injected}) >= 2
    diag = diagnose(run.trace_dir)
    s = diag.stragglers
    # the kind follows the one taxonomy (stragglers/kinds.py) applied to the injection log:
    # random ranks stalling in steps of their own read `rotating`, a few ranks `intermittent`
    stalls: dict[int, list[int]] = {}
    for st, r in injected:
        stalls.setdefault(r, []).append(st)
    assert s.kind == job_kind(stalls, s.steps_analysed), diag.render_text()
    found = _found(diag)
    # a fifth of the injected sleep: far above the OS jitter of a quiet step (1-3 ms)
    late = _truly_late(run.trace_dir, 0.2 * run.scenario["straggler_ms"][0] * 1000)
    # steps where the host made another rank late (or held the others back as long as the sleep)
    noisy = {st for st, _r in late ^ injected}
    evidence = (sorted(injected), sorted(found), sorted(late - injected))
    quiet_injected = {p for p in injected if p[0] not in noisy}
    quiet_found = {p for p in found if p[0] not in noisy}
    missed, extra = quiet_injected - quiet_found, quiet_found - quiet_injected
    assert len(quiet_injected) >= 3 and len(missed) <= 1 and len(extra) <= 1, evidence
    assert {p for p in found if p[0] in noisy} <= late, evidence  # never a rank that was on time
    # the ranks named are the ones that slept (every one, unless its only event was the miss),
    # or ones the host really held back
    assert {r for _s, r in quiet_injected - missed} <= set(s.ranks), evidence
    assert set(s.ranks) <= {r for _s, r in injected | late} | {r for _s, r in extra}, evidence
    rec = next(r for r in diag.recommendations if r["id"] == "straggler-intermittent")
    assert "hierarchical SGD" in rec["action"] and "non-persistent" in rec["action"]


def _kscope(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": REPO}
    return subprocess.run(
        [sys.executable, "-m", "kinetoscope.cli.main", "analyze", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_kscope_analyze_prints_the_verdict_first(ddp_runs):
    d = ddp_runs("persistent").trace_dir
    cp = _kscope(str(d))
    assert cp.returncode == 0, cp.stderr
    lines = [ln.strip() for ln in cp.stdout.splitlines() if ln.strip()]
    assert lines[0] == "Diagnosis"
    assert lines[1].startswith("PERSISTENT STRAGGLER: rank 2")
    assert any(ln.startswith("Recommendation (high): Persistent straggler") for ln in lines[2:16])  # wrapped
    cp = _kscope("--json", "--peak-flops", "1e11", str(d))
    assert cp.returncode == 0, cp.stderr
    doc = json.loads(cp.stdout)
    for key in ("diagnosis_summary", "job", "steps", "stragglers", "mfu", "recommendations"):
        assert key in doc
    assert doc["diagnosis_summary"][0].startswith("PERSISTENT STRAGGLER: rank 2")
    assert doc["stragglers"]["kind"] == "persistent" and doc["stragglers"]["ranks"] == [2]
    assert 0 < doc["stragglers"]["lost_fraction"] < 1
    assert {"rank", "late_steps", "score"} <= set(doc["stragglers"]["per_rank"][0])
    assert doc["job"]["world_size"] == 4 and doc["job"]["missing_ranks"] == []
    assert doc["job"]["rank_sources"] == {str(r): "manifest" for r in range(4)}
    assert len(doc["job"]["clock"]["offsets"]) == 4
    assert {"rank", "step", "step_time(us)", "sync_wait(us)", "lateness(us)"} <= set(doc["steps"][0])
    for r in doc["recommendations"]:
        assert set(r) == {"id", "severity", "title", "evidence", "action"} and r["evidence"]
