"""The fast loader produces exactly the reference loader's tables on the whole vendored corpus,
and the metadata MANIFEST.tsv documents (rank, world size, rank source, device type)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kinetoscope.trace import TraceError, load_trace, load_trace_reference, parse_trace
from tests.trace.conftest import assert_same_trace, parsed, trace_digest
from tests.trace.corpus import BIG_TRACES, NOT_TRACES, SMALL_TRACES, TRACE_FILES

DIGESTS = json.loads((Path(__file__).parent / "data" / "reference_digests.json").read_text())


@pytest.mark.parametrize("c", SMALL_TRACES, ids=lambda c: c.id)
def test_small_trace_matches_reference(c):
    assert_same_trace(parse_trace(c.path), load_trace_reference(c.path))


@pytest.mark.parametrize("c", BIG_TRACES, ids=lambda c: c.id)
def test_big_trace_matches_reference_digest(c):
    """Digests of the reference loader's output (regenerate with
    ``python -m tests.trace.make_reference_digests``; the slow test below checks them)."""
    got = trace_digest(parsed(c.path))
    want = DIGESTS[c.rel]
    for name, d in want["tables"].items():
        assert got["tables"][name] == d, name
    assert got["meta"] == want["meta"]


@pytest.mark.slow
@pytest.mark.parametrize("c", BIG_TRACES, ids=lambda c: c.id)
def test_reference_digests_are_current(c):
    assert trace_digest(load_trace_reference(c.path)) == DIGESTS[c.rel]


@pytest.mark.slow
@pytest.mark.parametrize("c", BIG_TRACES, ids=lambda c: c.id)
def test_big_trace_matches_reference(c):
    assert_same_trace(parse_trace(c.path), load_trace_reference(c.path))


def test_digests_cover_every_big_trace():
    assert sorted(DIGESTS) == sorted(c.rel for c in BIG_TRACES)


def _expected_rank(c) -> tuple[int | None, int | None, str]:
    """(rank, world_size, rank_source) from the MANIFEST rank column and the file name."""
    label = c.rank_label.split()[0] if c.rank_label else ""
    if label and label.split("/")[0] != "?":
        r, w = label.split("/")
        return int(r), (None if w == "?" else int(w)), "distributedInfo"
    world = None
    if label:
        w = label.split("/")[1]
        world = None if w == "?" else int(w)
    name = c.path.name
    import re

    m = re.search(r"(?:^|[^a-z0-9])(?:rank|worker)[-_]?(\d+)(?![0-9a-z])", name, re.IGNORECASE)
    if m:
        return int(m.group(1)), world, "filename"
    return None, world, "unknown"


EXPECTED_DEVICE = {
    "amd_trace": "AMD GPU",
    "mtia_inference_trace": "MTIA",
    "mtia_trace_single_rank": "MTIA",
    "cpu_only": "CPU",
    "cpu_only_v2024_full": "CPU",
    "distributed_info_unavailable": "CPU",
    "rank_unavailable": "CPU",
    "mixed_files": "CPU",
    "large_integer_trace": "UNKNOWN GPU",  # a kernel but no launch call
}


@pytest.mark.parametrize("c", TRACE_FILES, ids=lambda c: c.id)
def test_metadata_as_manifest_says(c):
    t = parsed(c.path)
    rank, world, source = _expected_rank(c)
    assert (t.meta.rank, t.meta.world_size, t.meta.rank_source) == (rank, world, source)
    assert t.meta.num_trace_events == c.events
    top = c.rel.split("/")[1]
    if top in EXPECTED_DEVICE:
        assert t.meta.device_type == EXPECTED_DEVICE[top]
    elif int(c.events) and len(t.kernels()):
        assert t.meta.device_type == "NVIDIA GPU"
    if source == "unknown":
        assert any("rank unknown" in w for w in t.meta.warnings)


def test_backend_and_world_size_from_distributed_info(hta_traces):
    t = parsed(hta_traces / "mtia_trace_single_rank" / "mtia_rank_0.json.gz")
    assert t.meta.distributed_info["backend"] == "mtia:hccl,cpu:gloo"
    assert t.meta.base_time_ns == 1727743122000000000
    assert t.meta.trace_id == "D84EEAE1F7B4478F9F2D86023BDD9BA9"
    assert t.meta.hostname == "devgpu109.atn2.facebook.com"
    assert "INFO" in t.meta.extra and "traceName" in t.meta.extra


def test_ns_resolution_timestamps_are_exact_nanoseconds(hta_traces):
    t = parsed(hta_traces / "mtia_trace_single_rank" / "mtia_rank_0.json.gz")
    first = t.events.row(0, named=True)
    # "ts": 3605057436108.407, "dur": 43.365 in the file
    assert first["ts"] == 3605057436108407 and first["dur"] == 43365


def test_old_2021_categories_are_normalised(hta_traces):
    t = load_trace(hta_traces / "trace_file_list" / "inference_rank_1.json.gz", cache=False)
    kinds = dict(zip(t.events["cat"], t.events["kind"]))
    assert kinds["Kernel"] == "kernel" and kinds["Runtime"] == "cuda_runtime"
    assert t.events.filter(t.events["cat"] == "Kernel")["stream"].to_list()[0] == 7


def test_string_pids_become_labels(hta_traces):
    t = load_trace(hta_traces / "amd_trace" / "mi250_minitoy_train_ROCm6_2_kineto.json.gz", cache=False)
    assert set(t.meta.labels) >= {"Traces", ""}
    assert all(v < 0 for v in t.meta.labels.values())
    assert t.instants.filter(t.instants["pid"] == t.meta.labels["Traces"]).height >= 1


def test_u64_ids_above_int64_do_not_crash_or_wrap(tmp_path, hta_traces):
    t = load_trace(
        hta_traces / "large_integer_trace" / "rank-70.Mar_25_20_48_12.2861.pt.trace.json.gz", cache=False
    )
    assert len(t.events) == 2  # "Comms Id": 10159970886766084423 is not a table column
    doc = {
        "traceEvents": [
            {
                "ph": "X",
                "cat": "kernel",
                "name": "k",
                "pid": 0,
                "tid": 7,
                "ts": 1,
                "dur": 2,
                "args": {"correlation": 10159970886766084423, "External id": 5, "stream": 7},
            },
        ]
    }
    from tests.trace.conftest import write_doc

    p = write_doc(tmp_path / "big.json", doc)
    t = load_trace(p, cache=False)
    assert t.events["correlation"].to_list() == [None]  # stored as null, never wrapped
    assert t.events["external_id"].to_list() == [5]
    assert any("correlation" in w and "int64" in w for w in t.meta.warnings)
    assert_same_trace(t, load_trace_reference(p))


@pytest.mark.parametrize("c", NOT_TRACES, ids=lambda c: c.id)
def test_not_a_trace(c):
    with pytest.raises(TraceError) as info:
        load_trace(c.path, cache=False)
    err = info.value
    assert err.path == str(c.path)
    assert "not a trace" in err.problem
