"""Recompilation (seed 003) on real torch.compile'd CPU loops fed distinct shapes: the compiles
found in the trace (which step, how long) match what torch._dynamo counted in the job."""

from __future__ import annotations

import json
import shutil

import pytest
from digests import assert_digests_diagnose_alike
from seed_jobs import run_python

from kinetoscope.diagnosis import diagnose

pytest.importorskip("torch")


def _run(tmp_path_factory, name: str, *args: str):
    out = tmp_path_factory.mktemp(name)
    run_python("recompile_job.py", out, *args)
    truth = json.loads((out / "truth.json").read_text())
    return diagnose(out / "train.pt.trace.json"), truth


@pytest.fixture(scope="module")
def static_aot(tmp_path_factory):
    return _run(
        tmp_path_factory, "rc_static", "--backend", "aot_eager", "--static", "--shapes", "8,8,16,16,24,8,24"
    )


@pytest.fixture(scope="module")
def auto_dynamic_inductor(tmp_path_factory):
    if shutil.which("cc") is None and shutil.which("gcc") is None:
        pytest.skip("inductor needs a C compiler")
    return _run(tmp_path_factory, "rc_inductor", "--backend", "inductor", "--shapes", "8,16,16,24")


def _check_against_dynamo(d, truth):
    rc = d.to_dict()["recompilation"]
    assert rc["compiles"] == truth["frames_total"]  # every compilation Dynamo counted is found
    assert rc["recompiles"] == truth["frames_total"] - 1  # one frame: the rest are recompiles
    assert [e["step"] for e in rc["events"]] == truth["compiled_at_iterations"]
    assert all(e["duration_ms"] > 0 for e in rc["events"])
    return rc


def test_static_shapes_recompile_at_each_new_shape(static_aot):
    d, truth = static_aot
    assert truth["compiled_at_iterations"] == [0, 2, 4]  # 8, 16, 24: the repeats hit the cache
    rc = _check_against_dynamo(d, truth)
    assert rc["recompile_steps"] == [2, 4]
    rec = next(r for r in d.recommendations if r["id"] == "recompilation")
    assert rec["evidence"]["recompile_steps"] == [2, 4] and rec["evidence"]["recompiles"] == 2
    assert "mark_dynamic" in rec["action"] and "step(s) [2, 4]" in rec["action"]


def test_inductor_automatic_dynamic_recompiles_once(auto_dynamic_inductor):
    d, truth = auto_dynamic_inductor
    # the first shape change recompiles into a shape-generic graph; 24 reuses it
    assert truth["compiled_at_iterations"] == [0, 1]
    rc = _check_against_dynamo(d, truth)
    assert rc["recompile_steps"] == [1]


def test_no_compile_gives_null():
    from diag_synth import make_job

    assert diagnose(make_job(world=2, steps=4)).to_dict()["recompilation"] is None


def test_digests_give_the_compilations(static_aot):
    """``kscope analyze`` diagnoses digests: the compilations come from the rank's figures."""
    d, _truth = static_aot
    assert_digests_diagnose_alike(d, "recompilation")
