"""A real 8-rank DP x PP job on a 2-D device mesh (gloo, CPU, ``torch.distributed.pipelining``),
traced through the daemon, with one data-parallel replica slowed (issue 27).

The process groups are checked against the job's own log of the collectives it issued
(``mesh.group_truth``), not against the product: on-demand gloo traces name no group, so the
diagnosis infers them. Instances must be matched complete within their groups (before groups,
a DP x PP job's data-parallel all-reduces of different stages were "job-wide" instances that no
rank completed), the pipeline's stages must follow the mesh, and neither uneven inputs nor a
slowed replica's ranks in the wrong stage may be reported.
"""

from __future__ import annotations

import pytest

from benchmarks.diag_scenarios import mesh
from kinetoscope.diagnosis import diagnose

pytestmark = pytest.mark.slow


def test_dp_pp_job_with_a_slowed_replica(tmp_path) -> None:
    sc = next(s for s in mesh.SCENARIOS if s.sid == "dp_pp-slow-replica")
    trace_dir, progress, steps = mesh.run(sc, tmp_path / sc.sid, timeout_s=420.0)
    truth = mesh.group_truth(progress, steps)
    assert truth["groups"] == ["0,4", "1,5", "2,6", "3,7"], truth  # the job's data-parallel groups

    d = diagnose(trace_dir)
    # the send/recv of gloo name no group and stay job-wide ("*"): the collectives' groups
    found = sorted(g for g in d.clock.pairs["group"].unique().to_list() if g and g != "*")
    assert found == truth["groups"], (found, d.notes)
    # every group's all-reduce of every analysed step is complete (the partial instances left
    # are gloo's send/recv, which name no group and stay job-wide)
    s = d.stragglers
    assert s.instances >= len(found) * s.steps_analysed, (s.instances, s.partial_instances, s.steps_analysed)
    doc = d.to_dict()
    assert doc["uneven_inputs"] is None
    pipe = doc["pipeline"]
    assert [s["ranks"] for s in pipe["stages"]] == [[0, 4], [1, 5], [2, 6], [3, 7]]
    issue = pipe.get("replica_issue")
    assert issue is None or set(issue["ranks"]) <= set(sc.slow), issue
    assert not d.summary()[0].startswith("UNEVEN INPUTS")
    # the verdict against the arrival-order truth per process group: when the job's own log
    # charges the slowed replica's ranks most, the verdict names ranks of it. Exactly the replica
    # on a quiet host (docs/validation-diagnosis.md, "pipeline27c"); on a loaded one the rules
    # named [1, 4, 6] once (a known limit, issue 27), so the exact set is the benchmark's check.
    share = {int(r): v for r, v in truth["share"].items()}
    top = sorted(share, key=lambda r: -share[r])[: len(sc.slow)]
    if sorted(top) == sorted(sc.slow):
        assert set(s.ranks) & set(sc.slow), (s.kind, s.ranks, truth["share"], d.summary()[:2])
