"""One stage number on every line (issue 27), on the real gloo DP 2 x PP 4 jobs of tests/data.

The pipeline analysis (``diagnosis.pipeline``) and the replay (``whatif.kineto``) number the
stages by one definition (``diagnosis.stage_order``: stage 0 opens its steps with a send, each
further stage one transfer hop further), and the replica the replay names gets its kind from its
own per-step cost by the taxonomy of ``stragglers.kinds``. Truth from each job's own log
(``truth_by_group.json``)."""

from __future__ import annotations

import json
import re
from pathlib import Path

from kinetoscope.diagnosis import diagnose
from kinetoscope.diagnosis.stage_order import hop_stages
from kinetoscope.diagnosis.stragglers.kinds import rank_kind
from kinetoscope.diagnosis.stragglers.replay_report import LATE_COST

JOBS = Path(__file__).resolve().parents[1] / "data" / "cpu_jobs"


def _diagnose(name: str) -> tuple[dict, object]:
    folder = JOBS / name
    truth = json.loads((folder / "truth_by_group.json").read_text())
    return truth, diagnose(sorted(str(f) for f in folder.glob("*.pt.trace.json*")))


def test_hop_stages_counts_hops_from_the_first_stage() -> None:
    """Two replicas 0-1-2 and 3-4-5 (chains of transfers): stages by hops, not by node ids."""
    near = {0: [2], 2: [0, 1], 1: [2], 3: [5], 5: [3, 4], 4: [5]}
    assert hop_stages([0, 3], near) == {0: 0, 3: 0, 2: 1, 5: 1, 1: 2, 4: 2}
    assert hop_stages([], near) == {}


def test_heavy_stage_has_one_number_on_every_line() -> None:
    """Stage 2 (ranks 2, 6) has 3x the layers. It receives its first activation before stage 3
    does but after stage 1: ordered by time, it was once called stage 1 on the pipeline line while
    the verdict said stage 2. Every line now says stage 2."""
    truth, d = _diagnose("mesh_dp_pp_heavy_stage2")
    heavy = truth["heavy_stage"]
    pipe = d.pipeline
    wi = d.stragglers.whatif or {}
    assert pipe is not None and wi["stage"] is not None
    assert (
        [s["ranks"] for s in pipe["stages"]] == wi["stage"]["stage_ranks"] == [[0, 4], [1, 5], [2, 6], [3, 7]]
    )
    assert pipe["imbalance"]["slowest_stage"] == wi["stage"]["stage"] == heavy == 2
    assert pipe["imbalance"]["slowest_ranks"] == wi["stage"]["ranks"] == [2, 6]
    text = d.render_text()
    named = {int(s) for s in re.findall(r"[Ss]tage (\d+)(?: \(ranks| is the slowest|'s work)", text)}
    assert named == {heavy}, text


def test_slowed_replica_stages_agree_and_its_kind_follows_the_taxonomy() -> None:
    """Replica 1 (ranks 4-7) sleeps 40 ms every step. The stages of the pipeline analysis are the
    replay's; the verdict names the replica with the kind its own per-step cost gives by the
    taxonomy (late in more than half of the steps: persistent; else intermittent)."""
    truth, d = _diagnose("mesh_dp_pp_slow_replica")
    wi = d.stragglers.whatif or {}
    rep = wi["replica"]
    assert rep["ranks"] == truth["slowed"] == [4, 5, 6, 7] and rep["explains"]
    if wi.get("stage") is not None:
        assert [s["ranks"] for s in d.pipeline["stages"]] == wi["stage"]["stage_ranks"]
    assert [s["ranks"] for s in d.pipeline["stages"]] == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert len(rep["step_cost"]) == wi["steps"]
    # a late step costs LATE_COST of the observed step, so at least that much of the ideal one
    assert len(rep["late_steps"]) <= sum(c >= LATE_COST for c in rep["step_cost"])
    assert sorted(d.stragglers.ranks) == [4, 5, 6, 7]
    assert d.stragglers.kind == rank_kind(len(rep["late_steps"]), wi["steps"])
