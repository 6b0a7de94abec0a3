"""Algorithm and bus bandwidth per collective (nccl-tests' definitions) and the
compress / overlap / slow-link decision drawn from them."""

from __future__ import annotations

import polars as pl
import pytest

from kinetoscope.diagnosis.bandwidth import collective_bandwidth
from kinetoscope.diagnosis.collectives import COLLECTIVES_SCHEMA
from kinetoscope.diagnosis.recommendations import comm_decision
from kinetoscope.trace.model import Trace, TraceMeta

MS = 1_000_000


def _colls(
    rank: int, coll: str, nelems: int, arrivals_ms: list[float], end_ms: list[float], name: str
) -> pl.DataFrame:
    rows = [
        {
            "rank": rank,
            "ordinal": k,
            "coll": coll,
            "pg": "0",
            "seq": None,
            "arrival": int(a * MS),
            "end": int(e * MS),
            "nelems": nelems,
            "signal": "kernel",
            "name": name,
        }
        for k, (a, e) in enumerate(zip(arrivals_ms, end_ms, strict=True))
    ]
    return pl.DataFrame(rows, schema=COLLECTIVES_SCHEMA)


@pytest.mark.parametrize(("world", "factor"), [(2, 1.0), (4, 1.5), (8, 1.75)])
def test_allreduce_bus_bandwidth(world, factor):
    # 1 Mi float elements (4 MiB) per all-reduce; the last rank arrives at 10 ms, all end at 11 ms:
    # 1 ms of transfer (the earlier ranks' wait is not transfer)
    n = 1 << 20
    traces = {r: Trace(meta=TraceMeta(path=f"r{r}", rank=r)) for r in range(world)}
    colls = {
        r: _colls(
            r,
            "allreduce",
            n,
            [10.0 - 0.5 * (r != world - 1)] * 3,
            [11.0] * 3,
            "ncclDevKernel_AllReduce_Sum_f32_RING_LL",
        )
        for r in range(world)
    }
    bw = collective_bandwidth(traces, colls, {})["allreduce"]
    alg = 4 * n / MS  # bytes per ns = GB/s
    assert bw["bytes_median"] == 4 * n and bw["dtype_bytes"] == 4 and not bw["dtype_assumed"]
    assert bw["transfer_ms_median"] == pytest.approx(1.0)
    assert bw["algbw_GBps"] == pytest.approx(alg, rel=1e-3)
    assert bw["busbw_GBps"] == pytest.approx(alg * factor, rel=1e-3)  # 2 (n - 1) / n


def test_allgather_size_is_the_gathered_output_and_bf16_from_kernel_name():
    traces = {r: Trace(meta=TraceMeta(path=f"r{r}", rank=r)) for r in range(4)}
    colls = {
        r: _colls(r, "allgather", 1000, [1.0], [2.0], "ncclDevKernel_AllGather_RING_LL_bf16")
        for r in range(4)
    }
    bw = collective_bandwidth(traces, colls, {})["allgather"]
    assert bw["bytes_median"] == 4 * 1000 * 2 and bw["bus_factor"] == pytest.approx(0.75)


def test_decision_from_numbers():
    small = {"bytes_median": 64_000, "busbw_GBps": 1.0, "busbw_GBps_p90": 1.1}
    varied = {"bytes_median": 25 << 20, "busbw_GBps": 5.0, "busbw_GBps_p90": 40.0}
    steady = {"bytes_median": 25 << 20, "busbw_GBps": 38.0, "busbw_GBps_p90": 40.0}
    assert comm_decision(small)[0] == "latency-bound"
    assert comm_decision(varied)[0] == "slow-link"
    assert comm_decision(steady)[0] == "bandwidth-bound"
    assert comm_decision(None) is None


def test_real_ddp_bucket_bytes_from_recorded_shapes(tmp_path):
    """A real 2-rank gloo DDP job (``uneven_job.py``, even batches, ``record_shapes``): the
    all-reduce size is the one gradient bucket, every parameter of its model, 4 bytes each."""
    pytest.importorskip("torch")
    from digests import digests_of
    from seed_jobs import run_torchrun

    from kinetoscope.diagnosis import diagnose

    run_torchrun("uneven_job.py", 2, tmp_path, "--batches", "4", "--short-by", "0", "--record-shapes")
    params = (256 * 512 + 512) + (512 * 256 + 256)  # Linear(256, 512), Linear(512, 256)
    d = diagnose(tmp_path)
    bw = d.collective_bandwidth["allreduce"]
    assert bw["bytes_median"] == 4 * params and bw["dtype_assumed"]
    assert bw["instances"] >= 4 and bw["busbw_GBps"] > 0  # one bucket per step
    # kscope analyze diagnoses digests: the sizes come from the ranks' figures (host_nelems)
    assert diagnose(digests_of(d)).collective_bandwidth == d.collective_bandwidth
