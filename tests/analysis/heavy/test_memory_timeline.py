"""Memory timeline: [memory] events (known by construction, real trace) and HTA's raw
export_memory_timeline format (identical to HTA's processing)."""

from __future__ import annotations

import gzip
import json

import numpy as np
import polars as pl
import pytest

from kinetoscope.analysis.memory_timeline import (
    MEMORY_CATEGORIES,
    allocation_sites,
    memory_allocation_sites,
    memory_categories_summary,
    memory_summary,
    memory_timeline,
    memory_timeline_from_raw,
)

from ._build import TraceBuilder
from .conftest import DF_INDEX, HTA_DIR, MEMORY_RAW, needs_hta, real

US = 1000


def test_summary_and_sites_known_by_construction(tmp_path):
    b = TraceBuilder(rank=2)
    b.op(0, 100 * US, "aten::linear")
    b.op(10 * US, 20 * US, "aten::empty")
    b.memory(12 * US, 4096, 4096, total_reserved=1 << 20)  # in aten::empty
    b.memory(40 * US, 1024, 5120, total_reserved=1 << 20)  # in aten::linear only
    b.memory(50 * US, -4096, 1024, total_reserved=1 << 20)  # free
    b.memory(150 * US, 512, 1536, total_reserved=2 << 20)  # outside every op
    b.memory(160 * US, 64, 64, device_type=0, device_id=-1)  # CPU
    tr = b.load(tmp_path)
    tl = memory_timeline([tr])
    assert tl.height == 5 and tl["rank"].to_list() == [2] * 5
    assert tl["ts(us)"].to_list() == [12.0, 40.0, 50.0, 150.0, 160.0]
    s = {r["device"]: r for r in memory_summary(tr).iter_rows(named=True)}
    assert set(s) == {"cpu", "cuda:0"}
    g = s["cuda:0"]
    assert (g["num_allocs"], g["num_frees"], g["bytes_allocated"], g["bytes_freed"]) == (3, 1, 5632, 4096)
    assert g["peak_allocated"] == 5120 and g["peak_allocated_ts(us)"] == 40.0
    assert g["peak_reserved"] == 2 << 20 and g["start_allocated"] == 4096 and g["end_allocated"] == 1536
    sites = allocation_sites(tr).sort("ts")
    assert sites["op"].to_list() == ["aten::empty", "aten::linear", None, None]
    top = memory_allocation_sites(tr)
    row = top.filter((pl.col("device") == "cuda:0") & (pl.col("op") == "aten::empty")).row(0, named=True)
    assert row["num_allocs"] == 1 and row["bytes_allocated"] == 4096
    assert "(no op)" in top["op"].to_list()


def test_no_memory_events_gives_empty_frames(tmp_path):
    b = TraceBuilder()
    b.op(0, 10 * US, "aten::add")
    tr = b.load(tmp_path)
    for df in (memory_timeline(tr), memory_summary(tr), memory_allocation_sites(tr)):
        assert df.is_empty() and "rank" in df.columns


def test_real_trace_memory_events():
    tr = real(DF_INDEX)
    s = memory_summary(tr)
    gpu = s.filter(pl.col("device") == "cuda:1").row(0, named=True)
    mem = tr.memory_events().filter(pl.col("device_type") == 1)
    assert gpu["num_allocs"] + gpu["num_frees"] == mem.height
    assert gpu["peak_allocated"] == mem["total_allocated"].max()
    sites = memory_allocation_sites(tr, top_k=5)
    assert sites.filter(pl.col("device") == "cuda:1").height == 5
    # every CUDA allocation is attributed to exactly one row of the full table
    full = allocation_sites(tr)
    assert (
        full.height
        == mem.filter(pl.col("bytes") > 0).height
        + tr.memory_events().filter((pl.col("device_type") == 0) & (pl.col("bytes") > 0)).height
    )


def test_raw_timeline_known_by_construction(tmp_path):
    rows = [
        [-1, 1, 100, 0],
        [-1, 1, 50, 7],
        [10, 2, 30, 3],
        [10, 2, 5, 4],
        [20, 4, -30, 3],
        [30, 3, -50, 7],
        [30, 3, 50, 4],
    ]
    p = tmp_path / "m.raw.gz"
    with gzip.open(p, "wt") as fh:
        json.dump(rows, fh)
    tl = memory_timeline_from_raw(p)
    assert tl["time_ns"].to_list() == [10, 10, 20, 30]  # the pre-existing run moved to the first t > 0
    assert tl["Parameter"].to_list() == [100, 100, 100, 100]
    assert tl["Temporary"].to_list() == [0, 30, 0, 0]
    assert tl["Activation"].to_list() == [0, 5, 5, 55]
    assert tl["Unknown"].to_list() == [50, 50, 50, 0]
    s = {r["category"]: r for r in memory_categories_summary(p).iter_rows(named=True)}
    assert s["Temporary"]["peak_bytes"] == 30 and s["Temporary"]["final_bytes"] == 0
    assert s["Total"]["peak_bytes"] == 185 and s["Total"]["peak_time_ns"] == 10


@needs_hta
@pytest.mark.hta
def test_raw_timeline_identical_to_hta():
    from hta.memory_analysis import MemoryAnalysis

    times, sizes = MemoryAnalysis(str(HTA_DIR / MEMORY_RAW))._process_raw_events()
    tl = memory_timeline_from_raw(HTA_DIR / MEMORY_RAW)
    assert tl["time_ns"].to_list() == times
    assert np.array_equal(tl.select(list(MEMORY_CATEGORIES)).to_numpy(), np.array(sizes))


def test_raw_rejects_a_trace(tmp_path):
    with pytest.raises(ValueError):
        memory_timeline_from_raw(HTA_DIR / "trace_compare/base/base.json.gz")
