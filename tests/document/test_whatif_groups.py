"""The typed ``stragglers.whatif`` reads the replay's process-group fields (``process_groups``,
``transfers``) of a real multi-group job: the DP 2 x TP 4 gloo mesh job of ``tests/data``."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from kinetoscope.document import decode

JOB = Path(__file__).resolve().parents[1] / "data" / "cpu_jobs" / "mesh_dp_tp_slow_rank5"


@pytest.fixture(scope="module")
def doc() -> dict:
    from kinetoscope.orchestration import analyze_paths

    return analyze_paths(sorted(JOB.glob("rank-*.json.gz")), cache=False)


def test_the_group_fields_decode_typed_from_the_json_form(doc):
    raw = doc["stragglers"]["whatif"]
    assert raw["process_groups"] is True  # the replay joined the job's DP and TP groups
    d = decode(json.loads(json.dumps(doc)))
    assert d.problems == []
    w = d.stragglers.whatif if d.stragglers else None
    assert w is not None
    assert w.process_groups is True and w.transfers == raw["transfers"] == 0


def test_a_document_without_them_reads_the_defaults(doc):
    old = copy.deepcopy(doc)
    del old["stragglers"]["whatif"]["process_groups"], old["stragglers"]["whatif"]["transfers"]
    w = decode(old).stragglers.whatif  # type: ignore[union-attr]
    assert w is not None and w.process_groups is False and w.transfers == 0


def test_transfers_of_a_pipeline_job_read_as_a_count(doc):
    piped = copy.deepcopy(doc)
    piped["stragglers"]["whatif"]["transfers"] = 33792  # the AR job's paired transfers
    w = decode(piped).stragglers.whatif  # type: ignore[union-attr]
    assert w is not None and w.transfers == 33792


def test_excess_work_decodes_typed_per_rank(doc):
    raw = doc["stragglers"]["whatif"]["excess_work"]
    assert sorted(raw, key=int) == [str(r) for r in range(8)]  # every rank is in two groups
    w = decode(json.loads(json.dumps(doc))).stragglers.whatif  # type: ignore[union-attr]
    assert w is not None and w.excess_work == raw
    old = copy.deepcopy(doc)
    del old["stragglers"]["whatif"]["excess_work"]
    assert decode(old).stragglers.whatif.excess_work == {}  # type: ignore[union-attr]
