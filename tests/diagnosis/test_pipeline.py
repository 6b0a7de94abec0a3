"""Pipeline parallelism (seed 001) on real ``torch.distributed.pipelining`` jobs (gloo, CPU):
stages, schedule, bubble and stage imbalance; plus the rules on their own numbers."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys

import pytest
from diag_synth import make_job
from digests import assert_digests_diagnose_alike
from seed_jobs import run_torchrun

from kinetoscope.diagnosis import diagnose
from kinetoscope.diagnosis.extract import figures_of
from kinetoscope.diagnosis.pipeline import expected_bubble
from kinetoscope.diagnosis.pipeline_cuts import _cut, _rank_pipe, placed
from kinetoscope.diagnosis.recommendations import pipeline_bubble, pipeline_imbalance
from kinetoscope.trace import load_traces

pytest.importorskip("torch.distributed.pipelining")


@pytest.fixture(scope="module")
def gpipe_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("pp_gpipe")
    run_torchrun(
        "pipeline_job.py",
        2,
        out,
        "--schedule",
        "gpipe",
        "--microbatches",
        "4",
        "--width",
        "512",
        "--batch",
        "64",
    )
    return out


@pytest.fixture(scope="module")
def gpipe_balanced(gpipe_dir):
    return diagnose(gpipe_dir)


@pytest.fixture(scope="module")
def onef1b_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("pp_1f1b")
    run_torchrun(
        "pipeline_job.py",
        3,
        out,
        "--schedule",
        "1f1b",
        "--microbatches",
        "6",
        "--width",
        "512",
        "--batch",
        "64",
        "--heavy-stage",
        "1",
        "--heavy-factor",
        "3",
    )
    return out


@pytest.fixture(scope="module")
def onef1b_heavy(onef1b_dir):
    return diagnose(onef1b_dir)


def test_expected_bubble_formula():
    assert expected_bubble(4, 4) == pytest.approx(3 / 7)
    assert expected_bubble(4, 8, chunks=2) == pytest.approx(3 / 19)
    assert expected_bubble(1, 8) == 0.0


def test_gpipe_recognised_with_its_bubble(gpipe_balanced):
    pp = gpipe_balanced.to_dict()["pipeline"]
    assert pp["schedule"] == "GPipe" and pp["microbatches"] == 4
    assert [s["ranks"] for s in pp["stages"]] == [[0], [1]]
    assert pp["expected_bubble_fraction"] == pytest.approx(0.2)
    # the schedule's fill and drain are there; a loaded CPU box adds idle on top, never removes it
    assert pp["bubble_fraction"] >= 0.5 * pp["expected_bubble_fraction"]
    for s in pp["stages"]:
        assert s["fwd_ms_per_microbatch"] > 0 and s["bwd_ms_per_microbatch"] > 0
    ids = {r["id"] for r in gpipe_balanced.recommendations}
    # send/recv waits of a pipeline are its bubble, not stragglers, jitter or exposed comm
    assert not ids & {"straggler-persistent", "straggler-intermittent", "sync-jitter", "exposed-comm"}
    assert pp["imbalance"]["excess_fraction"] < 0.5  # balanced: host noise only (0.02-0.13 on a loaded box)
    # stages send and receive different numbers of messages by design: not uneven inputs
    assert gpipe_balanced.to_dict()["uneven_inputs"] is None


def _matmul_per_step(trace_dir) -> list[float]:
    """Each rank's time (µs) in dense matrix products (``aten::addmm``, ``aten::mm``: the Linear
    layers, forward and backward) per step, the median over its ``ProfilerStep`` spans less the
    first (as the analysis reads stages: the first step holds one-off work), from the raw JSON:
    the imbalance the job was built with, as this run's host executed it."""
    per_rank = []
    for r in range(3):
        events = [
            e
            for e in json.loads((trace_dir / f"rank-{r}.pt.trace.json").read_text())["traceEvents"]
            if e.get("ph") == "X"
        ]
        spans = sorted((e["ts"], e["ts"] + e["dur"]) for e in events if e["name"].startswith("ProfilerStep"))
        mm = [e for e in events if e["name"] in ("aten::addmm", "aten::mm")]
        per_step = [sum(e["dur"] for e in mm if a <= e["ts"] < b) for a, b in spans[1:]]
        per_rank.append(statistics.median(per_step))
    return per_rank


def test_1f1b_heavy_stage_named_with_its_excess(onef1b_dir, onef1b_heavy):
    pp = onef1b_heavy.to_dict()["pipeline"]
    assert pp["schedule"] == "1F1B" and pp["microbatches"] == 6
    assert [s["ranks"] for s in pp["stages"]] == [[0], [1], [2]]
    im = pp["imbalance"]
    # stage 1 has 3x the layers: (3 / mean(1, 3, 1)) - 1 = 0.8 of pure compute. What the trace
    # shows depends on the host: on a loaded 2-core box the ranks' matrix products stretch
    # unevenly (0.42-0.77 in five runs), and host work dilutes the excess. So the figure is held
    # to the trace's own matmul time per step, read with the standard library (0.77-1.01 of it).
    mm = _matmul_per_step(onef1b_dir)
    if mm[1] < 1.2 * max(mm[0], mm[2]):
        # a host loaded enough to undo the built imbalance (two benchmark runs beside the suite
        # on 2 cores: rank 1's products took 283 ms in one step, 90 ms in another, and their
        # median was under rank 0's) leaves none to measure the analysis against
        pytest.skip(f"the host undid the job's built imbalance: matmul us per step by rank {mm}")
    truth = max(mm) / statistics.mean(mm) - 1.0
    assert im["slowest_stage"] == 1 and 0.5 * truth < im["excess_fraction"] < 1.25 * truth, (im, truth)
    assert im["est_step_time_balanced_ms"] < pp["step_time_ms"]
    rec = next(r for r in onef1b_heavy.recommendations if r["id"] == "pipeline-imbalance")
    assert rec["evidence"]["slowest_stage"] == 1 and "stage 1" in rec["action"]


def test_not_a_pipeline_gives_null():
    d = diagnose(make_job(world=2, steps=6))
    doc = d.to_dict()
    assert "pipeline" in doc and doc["pipeline"] is None
    assert not [r for r in d.recommendations if r["id"].startswith("pipeline")]


def _ri(pp):
    from kinetoscope.diagnosis.recommendations import RuleInput

    d = diagnose(make_job(world=2, steps=4))
    return RuleInput(d.job, d.steps, d.stragglers, d.mfu, {}, {}, None, pipeline=pp)


PP = {
    "schedule": "GPipe",
    "num_stages": 4,
    "microbatches": 4,
    "bubble_fraction": 0.45,
    "expected_bubble_fraction": 3 / 7,
    "step_time_ms": 100.0,
    "stages": [{"stage": s, "bubble_fraction": 0.45} for s in range(4)],
    "imbalance": {
        "slowest_stage": 2,
        "slowest_ranks": [2],
        "excess_fraction": 0.5,
        "stage_compute_ms": [40.0, 40.0, 80.0, 40.0],
        "mean_stage_compute_ms": 50.0,
        "est_step_time_balanced_ms": 77.5,
        "est_speedup_balanced": 1.29,
    },
}


def test_bubble_rule_numbers():
    (rec,) = pipeline_bubble(_ri(PP))
    ev = rec["evidence"]
    assert rec["severity"] == "high"
    assert ev["microbatches_for_10pct_bubble"] == 27  # 9 (p - 1)
    assert ev["expected_bubble_at"]["8"] == pytest.approx(3 / 11, abs=1e-4)
    assert ev["expected_bubble_interleaved_2_chunks"] == pytest.approx(3 / 11, abs=1e-4)
    assert pipeline_bubble(_ri({**PP, "bubble_fraction": 0.1})) == []


def test_imbalance_rule_names_stage_and_share_to_move():
    (rec,) = pipeline_imbalance(_ri(PP))
    assert rec["evidence"]["slowest_stage"] == 2
    assert rec["evidence"]["move_fraction_of_slowest_stage"] == pytest.approx(1 - 50 / 80)
    assert rec["severity"] == "high"
    low = {**PP, "imbalance": {**PP["imbalance"], "excess_fraction": 0.1}}
    assert pipeline_imbalance(_ri(low)) == []


@pytest.fixture(scope="module")
def dp_pp(tmp_path_factory):
    out = tmp_path_factory.mktemp("pp_dp")
    run_torchrun(
        "pipeline_job.py",
        4,
        out,
        "--dp",
        "2",
        "--schedule",
        "1f1b",
        "--microbatches",
        "4",
        "--width",
        "512",
        "--batch",
        "64",
        "--heavy-stage",
        "1",
        "--heavy-factor",
        "3",
    )
    return diagnose(out)


def test_two_pipeline_replicas_group_their_stages(dp_pp):
    # ranks 0-1 and 2-3 are two pipelines; stage s of both is wrapped in DDP across the replicas
    pp = dp_pp.to_dict()["pipeline"]
    assert pp["replicas"] == 2 and [s["ranks"] for s in pp["stages"]] == [[0, 2], [1, 3]]
    assert pp["imbalance"]["slowest_stage"] == 1 and pp["imbalance"]["slowest_ranks"] == [1, 3]
    assert all(s["replica_spread"] is not None for s in pp["stages"])


def test_kscope_analyze_json_has_the_pipeline(gpipe_dir):
    """``kscope analyze`` diagnoses from per-rank digests (no events): the pipeline analysis
    reads the ranks' figures, so the CLI's ``pipeline`` is the one of the full traces."""
    files = sorted(gpipe_dir.glob("rank-*.pt.trace.json"))
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "kinetoscope.cli.main",
            "analyze",
            *map(str, files),
            "--json",
            "--no-cache",
            "--no-record",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = json.loads(proc.stdout)["pipeline"]
    assert got is not None and got["schedule"] == "GPipe"
    assert got == diagnose(load_traces(files, cache=False)).to_dict()["pipeline"]


def test_rank_figures_give_the_cuts_of_the_raw_events(onef1b_dir):
    """The per-rank figure (each own step cut on the own clock) placed at a clock offset is the
    cut that the rank's events read at that offset give for the moved window."""
    traces = load_traces(sorted(onef1b_dir.glob("rank-*.pt.trace.json")), cache=False)
    checked = 0
    for t in traces:
        fig = figures_of(t)
        assert fig.pipe is not None and len(fig.pipe) == fig.steps.height > 2
        for offset in (0, 123_456_789, -987_654):
            raw = _rank_pipe(t, offset)
            for step, start, end in fig.steps.select("step", "start", "end").iter_rows():
                want = _cut(3, step + 10, start + offset, end + offset, raw)
                assert placed(fig.pipe[step], 3, step + 10, offset) == want
                checked += want.sends + want.recvs > 0 and want.idle > 0
    assert checked > 0


def test_digests_diagnose_as_full_traces(onef1b_heavy):
    """Pickled ``DigestTrace``s (what a map task sends) give the whole diagnosis of the traces."""
    assert_digests_diagnose_alike(onef1b_heavy, "pipeline")
