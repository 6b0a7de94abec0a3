"""Rank discovery (distributedInfo -> manifest beside the file -> file name) and load_traces:
directories, manifests skipped, unknown and colliding ranks reported, never overwritten."""

from __future__ import annotations

import shutil

import orjson
import pytest

from kinetoscope.trace import TraceError, expand_paths, load_trace, load_traces
from kinetoscope.trace.metadata import rank_from_filename
from tests.trace.conftest import write_doc

NO_RANK = "distributed_info_unavailable/distributed_info_not_found.json.gz"
RANK_1 = "trace_filter/sampled_rank-1.json.gz"  # distributedInfo rank 1


def manifest(files, **top):
    return {"kinetoscope_manifest": 1, "trace_id": "kst-1", **top, "files": files}


@pytest.mark.parametrize(
    "name, rank",
    [
        ("rank-3.json", 3),
        ("rank_3.pt.trace.json.gz", 3),
        ("rank3.json", 3),
        ("worker12.json", 12),
        ("job-worker_7_1234.json", 7),
        ("Rank-0.Apr_03.pt.trace.json.gz", 0),
        ("trace.json", None),
        ("frank-3.json", None),
        ("ranked.json", None),
        ("rank-3x.json", None),
    ],
)
def test_rank_from_filename(name, rank):
    assert rank_from_filename(name) == rank


def test_manifest_gives_rank_job_and_host(tmp_path, hta_traces):
    f = tmp_path / "node07_4242.pt.trace.json.gz"
    shutil.copyfile(hta_traces / NO_RANK, f)
    m = manifest(
        [
            {
                "file": f.name,
                "host": "node07",
                "pid": 4242,
                "rank": 5,
                "local_rank": 1,
                "world_size": 8,
                "job_id": "123",
                "cmdline": "python train.py",
            }
        ],
    )
    (tmp_path / "manifest.json").write_bytes(orjson.dumps(m))
    t = load_trace(f, cache=False)
    assert (t.meta.rank, t.meta.world_size, t.meta.rank_source) == (5, 8, "manifest")
    assert (t.meta.hostname, t.meta.job_id, t.meta.pid, t.meta.cmdline) == (
        "node07",
        "123",
        4242,
        "python train.py",
    )
    assert t.meta.trace_id == "kst-1"


def test_per_host_manifest(tmp_path, hta_traces):
    f = tmp_path / "node08.pt.trace.json.gz"
    shutil.copyfile(hta_traces / NO_RANK, f)
    (tmp_path / "manifest.node07.json").write_bytes(
        orjson.dumps(manifest([{"file": "other.json", "rank": 1}]))
    )
    (tmp_path / "manifest.node08.json").write_bytes(
        orjson.dumps(manifest([{"path": f"/remote/dir/{f.name}", "rank": 6, "world_size": 8}]))
    )
    t = load_trace(f, cache=False)
    assert (t.meta.rank, t.meta.rank_source) == (6, "manifest")


def test_distributed_info_wins_over_manifest_and_name(tmp_path, hta_traces):
    f = tmp_path / "rank-9.json.gz"
    shutil.copyfile(hta_traces / RANK_1, f)
    (tmp_path / "manifest.json").write_bytes(orjson.dumps(manifest([{"file": f.name, "rank": 4}])))
    t = load_trace(f, cache=False)
    assert (t.meta.rank, t.meta.rank_source) == (1, "distributedInfo")
    assert any("disagrees" in w for w in t.meta.warnings)


def test_unreadable_manifest_is_ignored(tmp_path, hta_traces):
    f = tmp_path / "rank-2.json.gz"
    shutil.copyfile(hta_traces / NO_RANK, f)
    (tmp_path / "manifest.json").write_text("{broken")
    t = load_trace(f, cache=False)
    assert (t.meta.rank, t.meta.rank_source) == (2, "filename")


def test_unknown_rank_is_none_not_zero(tmp_path, hta_traces):
    f = tmp_path / "trace.json.gz"
    shutil.copyfile(hta_traces / NO_RANK, f)
    t = load_trace(f, cache=False)
    assert t.meta.rank is None and t.meta.rank_source == "unknown"
    assert any("rank unknown" in w for w in t.meta.warnings)


def test_directory_expansion_skips_manifests_and_others(tmp_path, hta_traces):
    for name in ("rank-0.json.gz", "rank-1.json"):
        shutil.copyfile(hta_traces / "call_stack" / "backward_thread.json", tmp_path / name)
    (tmp_path / "manifest.json").write_text("{}")
    (tmp_path / "manifest.node1.json").write_text("{}")
    (tmp_path / "notes.txt").write_text("x")
    (tmp_path / ".hidden.json").write_text("{}")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "rank-5.json").write_text("{}")
    files = expand_paths(tmp_path)
    assert [f.split("/")[-1] for f in files] == ["rank-0.json.gz", "rank-1.json"]
    assert expand_paths([tmp_path, tmp_path / "rank-1.json"]) == files  # no duplicates


def test_missing_path_and_empty_dir(tmp_path):
    with pytest.raises(TraceError, match="no such file"):
        expand_paths(tmp_path / "nope")
    with pytest.raises(TraceError, match="no .*trace files"):
        expand_paths(tmp_path)


def test_load_traces_reports_collisions_and_unknown(tmp_path, hta_traces):
    d = tmp_path / "job"
    d.mkdir()
    shutil.copyfile(hta_traces / RANK_1, d / "a.json.gz")  # rank 1 (distributedInfo)
    shutil.copyfile(hta_traces / NO_RANK, d / "rank-1.json.gz")  # rank 1 (file name)
    shutil.copyfile(hta_traces / NO_RANK, d / "b.json.gz")  # unknown
    shutil.copyfile(hta_traces / "trace_compare" / "base" / "base.json.gz", d / "c.json.gz")  # rank 1 too
    traces = load_traces(d, cache=False)
    assert isinstance(traces, list) and len(traces) == 4  # nothing overwritten
    kinds = sorted((p.kind, p.rank, len(p.paths)) for p in traces.problems)
    assert kinds == [("duplicate", 1, 3), ("unknown", None, 1)]
    dup = [p for p in traces.problems if p.kind == "duplicate"][0]
    assert "3 traces claim rank 1" in dup.message and dup.to_dict()["rank"] == 1
    for t in traces:
        if t.meta.rank == 1:
            assert any("also claimed by" in w for w in t.meta.warnings)


def test_load_traces_clean_set(tmp_path, hta_traces):
    shutil.copyfile(hta_traces / "timeline_analysis" / "sampled_rank-0.json.gz", tmp_path / "r0.json.gz")
    shutil.copyfile(hta_traces / RANK_1, tmp_path / "r1.json.gz")
    traces = load_traces([tmp_path / "r1.json.gz", tmp_path / "r0.json.gz"])
    assert [t.meta.rank for t in traces] == [1, 0]
    assert traces.problems == []
    assert all(t.meta.world_size == 128 for t in traces)


def test_manifest_rank_for_on_demand_traces(tmp_path):
    """On-demand kscope traces have no distributedInfo: the manifest names each file's rank."""
    files = []
    for r in range(3):
        name = f"node{r // 2}_{1000 + r}.pt.trace.json"
        write_doc(
            tmp_path / name, {"traceEvents": [{"ph": "X", "name": "a", "ts": 1, "dur": 1, "pid": 1000 + r}]}
        )
        files.append({"file": name, "rank": r, "world_size": 3, "host": f"node{r // 2}"})
    (tmp_path / "manifest.json").write_bytes(orjson.dumps(manifest(files)))
    traces = load_traces(tmp_path)
    assert sorted(t.meta.rank for t in traces) == [0, 1, 2]
    assert {t.meta.rank_source for t in traces} == {"manifest"}
    assert traces.problems == []


def _copies(tmp_path, hta_traces):
    srcs = [
        "timeline_analysis/sampled_rank-0.json.gz",
        RANK_1,
        "critical_path/alexnet/benchmark_result_2869224_1695835535_trace.json.gz",
        NO_RANK,
    ]
    out = []
    for i, s in enumerate(srcs):
        dst = tmp_path / f"in{i}.json.gz"
        shutil.copyfile(hta_traces / s, dst)
        out.append(dst)
    return out


@pytest.mark.parametrize("cache", [False, True])
def test_parallel_workers_match_serial(tmp_path, hta_traces, cache):
    files = _copies(tmp_path, hta_traces)
    serial = load_traces(files, cache=False, workers=1)
    par = load_traces(files, cache=cache, workers=2, cache_dir=tmp_path / "c")
    assert [t.meta.path for t in par] == [str(f) for f in files]
    for a, b in zip(serial, par):
        assert a.events.equals(b.events) and a.flows.equals(b.flows)
        assert (a.meta.rank, a.meta.rank_source, a.meta.warnings) == (
            b.meta.rank,
            b.meta.rank_source,
            b.meta.warnings,
        )
    assert [p.to_dict() for p in serial.problems] == [p.to_dict() for p in par.problems]
    assert (tmp_path / "c").exists() == cache


def test_parallel_worker_errors_are_trace_errors(tmp_path, hta_traces):
    files = _copies(tmp_path, hta_traces)
    bad = tmp_path / "in9.json"
    bad.write_bytes(b'{"traceEvents": [{"ph": "X", "name": "a", "ts": 1, "dur": 2}, {"ph": "X", "na')
    with pytest.raises(TraceError) as info:
        load_traces([*files, bad], cache=False, workers=2)
    assert info.value.path == str(bad) and "truncated" in info.value.problem and info.value.event_index == 1
