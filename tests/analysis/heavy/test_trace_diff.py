"""Trace diff: properties known by construction, HTA parity, per-step selection, and
``kscope diff``."""

from __future__ import annotations

import dataclasses
import json

import polars as pl
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from kinetoscope.analysis.trace_diff import diff_document, ops_diff, trace_diff, trace_diff_by_step

from .conftest import COMPARE_BASE, COMPARE_TEST, CONTROL, HTA_DIR, TEST, needs_hta, real, scratch_copy

US = 1000


def _without(trace, name):
    return dataclasses.replace(trace, events=trace.events.filter(pl.col("name") != name))


@pytest.mark.parametrize("rel", [COMPARE_BASE, CONTROL])
def test_diff_with_itself_is_empty(rel):
    t = real(rel)
    d = trace_diff(t, t)
    assert d.height > 0
    assert (d["diff_counts"] == 0).all() and (d["diff_duration"] == 0).all()
    assert set(d["count_change"]) == {"unchanged"} and set(d["counts_change_categories"]) == {"="}
    od = ops_diff(d)
    assert od["added"] == od["deleted"] == od["increased"] == od["decreased"] == []


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_removing_a_name_lists_it_as_deleted_or_added(data):
    t = real(COMPARE_BASE)
    names = sorted(t.events.filter(pl.col("kind") != "trace")["name"].unique().to_list())
    name = data.draw(st.sampled_from(names))
    cut = _without(t, name)
    d = trace_diff(t, cut)
    row = d.filter(pl.col("name") == name).row(0, named=True)
    n = t.events.filter(pl.col("name") == name).height
    assert row["count_change"] == "deleted" and row["Test_counts"] == 0 and row["Control_counts"] == n
    assert row["diff_counts"] == -n and row["counts_change_categories"] == "-"
    assert ops_diff(d)["deleted"] == [name]
    assert d.filter(pl.col("name") != name)["count_change"].unique().to_list() == ["unchanged"]
    back = trace_diff(cut, t)
    assert ops_diff(back)["added"] == [name]


def test_device_and_short_names():
    a, b = real(COMPARE_BASE), real(COMPARE_TEST)
    gpu = trace_diff(a, b, device="gpu")
    cpu = trace_diff(a, b, device="cpu")
    assert set(gpu["device"]) == {"gpu"} and set(cpu["device"]) == {"cpu"}
    assert gpu.height + cpu.height == trace_diff(a, b).height
    short = trace_diff(a, b, use_short_name=True)
    assert not any(
        "(" in n for n in short.filter(pl.col("device") == "gpu")["name"].to_list() if not n.startswith("Mem")
    )
    with pytest.raises(ValueError):
        trace_diff(a, b, device="tpu")


def test_steps():
    a, b = real(COMPARE_BASE), real(COMPARE_TEST)
    first = trace_diff(a, b, step="first")
    assert first.height > 0
    assert trace_diff(a, b, step=1009).equals(first)
    with pytest.raises(ValueError, match="no step 7"):
        trace_diff(a, b, step=7)
    each = trace_diff_by_step(a, b)
    assert each["step"].unique().sort().to_list() == [1009, 1010]
    assert each.filter(pl.col("step") == 1009).drop("step").equals(first)


def _launched_only(trace):
    """Device events whose launch is in the trace (HTA gives the others iteration -1)."""
    ev = trace.events
    corr = (
        ev.filter(pl.col("kind").is_in(["cuda_runtime", "cuda_driver"]))["correlation"].drop_nulls().implode()
    )
    dev = pl.col("kind").is_in(["kernel", "gpu_memcpy", "gpu_memset"])
    return dataclasses.replace(trace, events=ev.filter(~dev | pl.col("correlation").is_in(corr)))


@needs_hta
@pytest.mark.hta
@pytest.mark.parametrize(
    "pair",
    [(COMPARE_BASE, COMPARE_TEST), pytest.param((CONTROL, TEST), marks=pytest.mark.slow, id="control-test")],
)
def test_matches_hta_compare_traces(tmp_path, pair):
    """HTA's default comparison (first iteration of each) equals ours with step='first' once the
    device events without a launch in the trace are left out (HTA cannot place them in a step)."""
    from hta.trace_diff import TraceDiff

    dirs = []
    for i, rel in enumerate(pair):
        d = tmp_path / f"t{i}"
        d.mkdir()
        (d / "trace.json.gz").write_bytes(open(scratch_copy(rel), "rb").read())
        dirs.append(str(d))
    h = TraceDiff.compare_traces(dirs[0], dirs[1])
    ours = trace_diff(_launched_only(real(pair[0])), _launched_only(real(pair[1])), step="first")
    assert sorted(ours["name"].to_list()) == sorted(h.index.tolist())
    for r in ours.iter_rows(named=True):
        x = h.loc[r["name"]]
        assert (x["Control_counts"], x["Test_counts"]) == (r["Control_counts"], r["Test_counts"])
        assert abs(x["Control_total_duration"] - r["Control_total_duration"]) <= 1
        assert abs(x["Test_total_duration"] - r["Test_total_duration"]) <= 1
        assert x["counts_change_categories"] == r["counts_change_categories"]


def test_document():
    a, b = real(COMPARE_BASE), real(COMPARE_TEST)
    d = trace_diff(a, b)
    doc = diff_document(a, b, d, options={"step": None})
    assert set(doc) == {"control", "test", "options", "totals", "trace_diff", "ops_diff"}
    assert len(doc["trace_diff"]) == d.height
    assert sum(doc["totals"].values()) == d.height
    json.dumps(doc)


def _cli(*args):
    from kinetoscope.cli.main import app

    return CliRunner().invoke(app, list(args))


def test_kscope_diff_cli_control_test():
    res = _cli("diff", str(HTA_DIR / CONTROL), str(HTA_DIR / TEST), "--json")
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    assert doc["control"]["rank"] == 3 and doc["test"]["rank"] == 1
    rows = doc["trace_diff"]
    assert rows and {
        "name",
        "device",
        "Control_counts",
        "Test_counts",
        "diff_duration",
        "count_change",
    } <= set(rows[0])
    human = _cli(
        "diff", str(HTA_DIR / COMPARE_BASE), str(HTA_DIR / COMPARE_TEST), "--top", "5", "--step", "first"
    )
    assert human.exit_code == 0, human.output
    assert "Largest changes" in human.output and "added" in human.output


def test_kscope_diff_cli_errors(tmp_path):
    res = _cli("diff", str(HTA_DIR / COMPARE_BASE), str(tmp_path / "missing.json"))
    assert res.exit_code != 0
    res = _cli("diff", str(HTA_DIR / COMPARE_BASE), str(HTA_DIR / COMPARE_TEST), "--step", "x")
    assert res.exit_code != 0
