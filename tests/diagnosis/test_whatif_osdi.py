"""The what-if replay against the OSDI '25 artifact's published results (three real jobs).

``../shared/traces/osdi25_whatif/`` (beside the repository; ``KSCOPE_SHARED`` overrides the
``shared`` folder): op-level Parquet traces and the artifact's own figures (``mw-X.json``,
``ms-X.json``, ``result-X.json``). Our importer and replay are independent code; the figures must
land within 0.1 of the published ones and name the same worker / stage.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from kinetoscope.diagnosis.whatif import osdi
from kinetoscope.diagnosis.whatif.replay import build_schedule, observed_replay

REPO_ROOT = Path(__file__).resolve().parents[2]
SHARED = Path(os.environ.get("KSCOPE_SHARED", REPO_ROOT.parent / "shared"))
ART = SHARED / "traces" / "osdi25_whatif"

pytestmark = pytest.mark.skipif(
    not (ART / "trace-ST.parquet").is_file(), reason=f"OSDI '25 artifact not found at {ART}"
)


def _published(job: str, kind: str) -> dict:
    return json.loads((ART / f"{kind}-{job}.json").read_text())


@pytest.fixture(scope="module", params=["AR", "ST", "SE"])
def job(request):
    name = request.param
    return name, osdi.figures(osdi.load(ART / f"trace-{name}.parquet"))


def test_m_w_and_m_s_within_0_1_of_published(job):
    name, fig = job
    assert abs(fig.m_w - _published(name, "mw")["Mw"]) < 0.1
    assert abs(fig.m_s - _published(name, "ms")["Ms"]) < 0.1
    assert fig.slowdown == pytest.approx(_published(name, "result")["blocking_slowdown"], abs=0.05)


def test_named_worker_and_stage_match_the_paper(job):
    name, fig = job
    stage_pub = _published(name, "result")["blocking_decompose_by_stage"]
    assert fig.worst_stage == int(max(stage_pub, key=stage_pub.get))
    if name == "AR":  # one slowed worker: M_W ~ 1, it is dp 0 of stage 0
        assert fig.worst_workers == ("dp0/stage0",) and fig.m_w > 0.9
    else:  # no single worker explains the slowdown
        assert fig.m_w < 0.1
    if name == "ST":  # stage imbalance: the last stage
        assert fig.worst_stage == 3 and fig.m_s > 1.1


@pytest.mark.parametrize("name", ["AR", "ST", "SE"])
def test_replay_reproduces_the_traces_step_times(name):
    m = osdi.load(ART / f"trace-{name}.parquet", with_gaps=True).model
    got = observed_replay(m, build_schedule(m))
    assert np.abs(got / m.observed_step_time - 1.0).max() < 0.01


def test_bad_file_is_a_one_line_error(tmp_path):
    bad = tmp_path / "trace.parquet"
    bad.write_text("not parquet")
    with pytest.raises(osdi.ArtifactError, match="trace.parquet: not a readable Parquet file"):
        osdi.load(bad)
