"""Diagnosis on the vendored real traces (HTA's test corpus)."""

from __future__ import annotations

import polars as pl
import pytest

from kinetoscope.diagnosis import diagnose

SAMPLED = ["timeline_analysis/sampled_rank-0.json.gz", "trace_filter/sampled_rank-1.json.gz"]


@pytest.fixture(scope="module")
def sampled(hta_traces):
    return diagnose([hta_traces / p for p in SAMPLED])


def test_two_of_128_ranks_assembled(sampled):
    job = sampled.to_dict()["job"]
    assert job["world_size"] == 128 and job["world_size_source"] == "distributedInfo"
    assert job["ranks_found"] == [0, 1]
    assert job["num_missing_ranks"] == 126 and job["missing_ranks"] == list(range(2, 128))
    assert job["rank_sources"] == {"0": "distributedInfo", "1": "distributedInfo"}
    assert job["step_source"] == "ProfilerStep" and job["steps_found"] == 2
    assert any(line.startswith("Job: 2/128 ranks, 126 missing") for line in sampled.summary())


def test_clock_alignment_on_nccl_kernels(sampled):
    # Every collective of this job runs as ncclKernel_SendRecv_*; the collective type comes from
    # the host op that launched it (nccl:all_to_all, nccl:all_reduce, nccl:_all_gather_base).
    assert set(sampled.collectives["coll"].to_list()) == {"alltoall", "allreduce", "allgather"}
    assert sampled.job_dict()["collective_signal"] == ["kernel"]
    row = sampled.clock.table.filter(pl.col("rank") == 1).row(0, named=True)
    assert sampled.clock.reference == 0 and sampled.clock.match_method == "end_time"
    assert row["method"] == "collectives"
    # the "sampled" traces lack some collectives; the ones that match end within ~0.3 ms
    assert row["matched"] >= 4
    assert abs(row["offset_us"]) < 200 and row["residual_us"] < 500
    assert row["lower_bound_us"] <= row["offset_us"] <= row["upper_bound_us"]


def test_stragglers_sensible_for_2_of_128(sampled):
    s = sampled.stragglers
    assert s.steps_analysed == 2 and s.confidence == "low"
    assert s.kind == "none"
    assert set(s.per_step["step"].to_list()) == {551, 552}
    # a rank is "late" against the earlier of two ranks; here by at most tens of ms on ~0.6 s steps
    assert float(s.per_step["max_lateness(us)"].max()) < 0.1 * float(s.per_step["step_time(us)"].min())
    d = sampled.to_dict()["stragglers"]
    assert d["kind"] == "none" and d["lost_fraction"] == 0.0 and len(d["per_rank"]) == 2


def test_gpu_breakdown_and_recommendations(sampled):
    bd = sampled.steps
    assert bd.height == 4 and bd["n_kernels"].min() > 400
    assert (bd["compute(us)"] > 0).all() and (bd["comm(us)"] > 0).all()
    assert bd["launch_gap(us)"].null_count() == 0
    ids = {r["id"] for r in sampled.recommendations}
    assert "attention-math-path" not in ids  # bmm/softmax of a recommender model, not attention
    for r in sampled.recommendations:
        assert r["evidence"], r
    comm = next(r for r in sampled.recommendations if r["id"] == "exposed-comm")
    assert "alltoall" in comm["action"]  # all-to-all dominates this job's communication


def test_mfu_needs_a_peak_when_the_device_is_unknown(hta_traces):
    d = diagnose([hta_traces / p for p in SAMPLED])
    assert d.mfu.mfu is None and "--peak-flops" in d.mfu.reason
    d = diagnose([hta_traces / p for p in SAMPLED], peak_flops=125e12)
    assert d.mfu.flops_source == "shapes" and 0 < d.mfu.mfu < 1
    assert any("2 of 128 ranks" in a for a in d.mfu.assumptions)


def test_single_rank_traces(hta_traces):
    d = diagnose(hta_traces / "ns_resolution_trace")
    assert d.stragglers.kind == "none" and "single rank" in d.stragglers.reason
    assert d.mfu.device_key == "V100 SXM2" and d.mfu.precision == "fp32"
    d = diagnose(hta_traces / "cpu_only_v2024_full")
    job = d.to_dict()["job"]
    assert job["world_size"] == 300 and job["num_missing_ranks"] == 299 and job["ranks_found"] == [34]
    assert d.mfu.mfu is None and "CPU-only" in d.mfu.reason
    d2 = diagnose(hta_traces / "cpu_only_v2024_full", model_flops=3e12, peak_flops=1e12)
    assert d2.mfu.mfu == pytest.approx(3e12 / d2.mfu.step_time_s / 300 / 1e12)


def test_duplicate_ranks_reported(hta_traces, tmp_path):
    import shutil

    paths = []
    for sub in ("a", "b"):
        (tmp_path / sub).mkdir()
        paths.append(tmp_path / sub / "sampled_rank-0.json.gz")
        shutil.copyfile(hta_traces / SAMPLED[0], paths[-1])
    paths.append(hta_traces / SAMPLED[1])
    d = diagnose(paths)
    job = d.to_dict()["job"]
    assert job["ranks_found"] == [0, 1]
    assert list(job["duplicate_ranks"]) == ["0"] and len(job["duplicate_ranks"]["0"]) == 1
    assert any("duplicate ranks" in n for n in job["notes"])


def test_gloo_pipeline_ranks_compute_outside_their_send_and_recv() -> None:
    """A real DP 2 x PP 4 gloo job whose stage 2 (ranks 2, 6) has 3x the layers: gloo records a
    pipeline's send and receive on the main thread, beside the model's ops. Only the time inside
    those annotations is communication; every rank computes, and the heavy stage more than
    stage 1 (ranks 1, 5)."""
    from pathlib import Path

    job = Path(__file__).resolve().parents[1] / "data" / "cpu_jobs" / "mesh_dp_pp_heavy_stage2"
    bd = diagnose(job).steps
    med = dict(bd.group_by("rank").agg(pl.col("compute(us)").median()).iter_rows())
    assert all(v > 0 for v in med.values()), med
    assert min(med[2], med[6]) > max(med[1], med[5]), med
