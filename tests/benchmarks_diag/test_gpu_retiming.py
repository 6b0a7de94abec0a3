"""The GPU scenario generator keeps re-timed traces consistent (benchmarks/diag_scenarios/gpu.py).

Checked with the standard-library arrival-order ground truth (truth.py) on the written files:
an injected stall at (rank r, instance i) makes r the last rank at i by the stall; a slow link
makes every rank's collective longer alike, and its rank's own tail makes it last at the next
instance; nothing else imposes a wait;
ranks' kernel ends agree (one clock); every event keeps a non-negative duration and its place.
No timing assertions: the amounts are what was injected, up to the generator's 3 µs end jitter.
"""

from __future__ import annotations

import random

import numpy as np
import pytest

from benchmarks.diag_scenarios import gpu, truth

BASE = "nccl_parser"  # in-repo real trace: 21 NCCL instances on one stream, 3 profiler steps
TOL_US = 5.0


@pytest.fixture(scope="module")
def base() -> gpu.Base:
    return gpu.load_base(BASE)


def _job(base: gpu.Base, plan: gpu.Plan, tmp_path) -> tuple[truth.GroundTruth, list[truth.Instance], list]:
    paths = gpu.write_job(base, plan, random.Random(0), tmp_path)
    docs = {r: truth.load_json(p) for r, p in enumerate(paths)}
    insts = truth.instances({r: truth.comm_kernels(d) for r, d in docs.items()})
    return truth.ground_truth_from_docs(docs), insts, [docs[r] for r in sorted(docs)]


def _waits(insts: list[truth.Instance]) -> list[tuple[int, float]]:
    return [i.last_two() for i in insts]


def test_stall_makes_the_rank_last_by_the_stall(base, tmp_path):
    plan = gpu.Plan.empty(4, base.n, jitter_mean_us=0.0)
    plan.delay[2, 5] = 800.0
    gt, insts, _docs = _job(base, plan, tmp_path)
    assert len(insts) == base.n == 21
    waits = _waits(insts)
    assert waits[5][0] == 2 and waits[5][1] == pytest.approx(800.0, abs=TOL_US)
    assert all(w <= TOL_US for k, (_r, w) in enumerate(waits) if k != 5)
    assert gt.stragglers == [2] and gt.end_spread_us <= TOL_US
    # the stall shifts everything after it on every rank (they all waited for rank 2)
    _gt, clean, _docs = _job(base, gpu.Plan.empty(4, base.n, 0.0), tmp_path / "clean")
    assert insts[6].arrival[0] - clean[6].arrival[0] == pytest.approx(800.0, abs=2 * TOL_US)


def test_slow_link_slows_every_rank_alike_and_its_tail_makes_the_rank_last_next(base, tmp_path):
    """A ring collective runs at its slowest link's pace: rank 1's 4x slower link makes every
    rank's transfer 4x, the ends stay together and nobody waits. Only what completes on rank 1's
    side after its peers (its tail) makes it end later and arrive last at the next instance."""
    plan = gpu.Plan.empty(3, base.n, jitter_mean_us=0.0)
    plan.link[1, 8] = 4.0
    _gt, insts, _docs = _job(base, plan, tmp_path / "ring")
    own = {r: insts[8].end[r] - max(insts[8].arrival.values()) for r in range(3)}
    assert all(v == pytest.approx(4.0 * base.D[8], abs=TOL_US) for v in own.values())
    assert all(w <= TOL_US for _r, w in _waits(insts))
    tail = 1.5 * base.D[8]
    assert plan.tail is not None
    plan.tail[1, 8] = tail
    _gt, insts, _docs = _job(base, plan, tmp_path / "tail")
    own = {r: insts[8].end[r] - max(insts[8].arrival.values()) for r in range(3)}
    assert own[1] - own[0] == pytest.approx(tail, abs=TOL_US)
    r, w = insts[9].last_two()
    assert r == 1 and w == pytest.approx(tail, abs=TOL_US)


def test_ranks_name_their_host_four_per_host(tmp_path):
    """One clock per host, as a kscope-collected job's manifest says: 8 ranks span two hosts."""
    sc = gpu.make_scenario("clean", BASE, 8, 0)
    docs = [truth.load_json(p) for p in gpu.build(sc, tmp_path)]
    assert [d["host_name"] for d in docs] == ["node0"] * 4 + ["node1"] * 4


def test_compute_stretch_and_jitter_keep_every_event_in_order(base, tmp_path):
    plan = gpu.Plan.empty(4, base.n, jitter_mean_us=50.0)
    plan.stretch[3] = 0.2 * (base.A - base.seg0)  # rank 3 computes 20 % slower between collectives
    gt, insts, docs = _job(base, plan, tmp_path)
    assert gt.stragglers == [3] and gt.last_count[3] >= 0.8 * base.n
    for doc in docs:
        ev = [e for e in doc["traceEvents"] if "ts" in e]
        assert len(ev) == int(base.has_ts.sum())
        assert all(e.get("dur", 0) >= 0 for e in ev)
        # events keep their order: the warp is monotone
        ts = np.array([e["ts"] for e in ev])
        order = np.argsort(base.ts[base.has_ts], kind="stable")
        assert np.all(np.diff(ts[order]) >= -1e-3)
    assert all(max(i.end.values()) - min(i.end.values()) <= TOL_US for i in insts)


def test_labels_of_generated_scenarios_match_the_arrival_truth(tmp_path):
    for stype in ("clean", "persistent", "slow_link", "compute", "slow_ring"):
        sc = gpu.make_scenario(stype, BASE, 4, 0)
        gt = truth.ground_truth(gpu.build(sc, tmp_path / sc.sid))
        assert gpu.truth_agrees(sc, gt), (sc.sid, gt.imposed_us)


def test_unknown_scenario_type_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown scenario type 'slow'"):
        gpu.make_scenario("slow", BASE, 4, 0)


def test_two_stragglers_are_the_two_latest(tmp_path):
    sc = gpu.make_scenario("persistent2", BASE, 4, 0)
    gt = truth.ground_truth(gpu.build(sc, tmp_path))
    pair = (min(sc.ranks), max(sc.ranks))
    assert gt.last_pairs[pair] >= 0.8 * gt.n_instances and gpu.truth_agrees(sc, gt)
    assert set(gt.stragglers) <= set(sc.ranks)


def test_a_slow_node_beyond_eight_ranks_is_one_host():
    # up to 8 ranks the upper half (an 8-rank job's second host); beyond, one host of four GPUs
    assert gpu.make_scenario("node", BASE, 8, 0).ranks == [4, 5, 6, 7]
    for seed in range(4):
        ranks = gpu.make_scenario("node", BASE, 64, seed).ranks
        assert len(ranks) == gpu.GPUS_PER_HOST and len({gpu.host_of(r) for r in ranks}) == 1, ranks


def test_worlds_replace_each_base_s_own_world_sizes():
    got = gpu.scenarios(1, [BASE], ["clean", "node"], worlds=[16, 64])
    assert [(sc.type, sc.world) for sc in got] == [("clean", 16), ("node", 16)]
    assert {sc.world for sc in gpu.scenarios(2, [BASE], ["clean"], worlds=[16, 64])} == {16, 64}
