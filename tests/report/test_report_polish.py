"""Report polish from a new user's screenshots (issue 10): labelled evidence with units, an MFU card
that is not cut off, the median step-time card beside the mean the headline quotes, singular and
plural rank counts, and a chart legend clear of a two-row axis."""

from __future__ import annotations

import copy
import re
from typing import Any

import pytest

from kinetoscope.report import render_report
from kinetoscope.report.sections import (
    _kpis,
    _stacked,
    evidence_label,
    evidence_value,
    plural,
    recommendations_section,
)

MFU_REASON = (
    "no FLOPs: pass --model-flops (e.g. 6 * tokens_per_batch * num_params per step), or record the "
    "trace with with_flops=True / record_shapes=True"
)


@pytest.mark.parametrize(
    ("key", "label", "unit"),
    [
        ("mean_step_time_ms", "Mean step time", "ms"),
        ("est_step_time_without_stragglers_ms", "Estimated step time without stragglers", "ms"),
        ("exposed_transfer_fraction", "Exposed transfer", "pct"),
        ("steps_analysed", "Steps analysed", ""),
        ("overlap_fraction_of_comm", "Overlap fraction of communication", "pct"),
        ("mean_lateness(us)", "Mean lateness", "us"),
    ],
)
def test_evidence_keys_become_labels(key: str, label: str, unit: str) -> None:
    assert evidence_label(key) == (label, unit)


@pytest.mark.parametrize(
    ("value", "unit", "text"),
    [
        (89.685, "ms", "89.69 ms"),
        (0.132, "pct", "13.2 %"),
        (1500.0, "us", "1.50 ms"),
        (3 * 1024 * 1024, "bytes", "3.0 MiB"),
        (False, "", "no"),
        (9, "", "9"),
    ],
)
def test_evidence_values_carry_units(value: Any, unit: str, text: str) -> None:
    assert evidence_value(value, unit) == text


def _doc_with(hostile_doc: dict[str, Any], **changes: Any) -> dict[str, Any]:
    doc = copy.deepcopy(hostile_doc)
    doc.update(changes)
    return doc


def test_recommendation_evidence_is_labelled_not_raw(hostile_doc: dict[str, Any]) -> None:
    rec = {
        "id": "straggler-intermittent",
        "severity": "medium",
        "title": "Intermittent straggler",
        "action": "do x",
        "evidence": {"mean_step_time_ms": 89.685, "lost_fraction": 0.61, "frequent": False},
    }
    sec = recommendations_section({"recommendations": [rec]})
    assert sec.items[0]["evidence"] == [
        ("Mean step time", "89.69 ms", "mean_step_time_ms"),
        ("Lost", "61.0 %", "lost_fraction"),
        ("Frequent", "no", "frequent"),
    ]
    html = render_report(_doc_with(hostile_doc, recommendations=[rec]))
    assert '<td class="k" title="mean_step_time_ms">Mean step time</td><td>89.69 ms</td>' in html
    assert ">mean_step_time_ms<" not in html and "mean_step_time_ms=" not in html


def test_mfu_card_is_short_and_whole(hostile_doc: dict[str, Any]) -> None:
    doc = _doc_with(hostile_doc, mfu={"mfu": None, "reason": MFU_REASON})
    (card,) = [k for k in _kpis(doc) if k.label == "MFU"]
    assert card.value == "n/a"
    assert card.hint == "no FLOPs — see the MFU section"
    assert MFU_REASON in render_report(doc)  # the whole reason, in the MFU section


def test_step_time_card_says_median_and_shows_the_mean(hostile_doc: dict[str, Any]) -> None:
    doc = _doc_with(hostile_doc)
    doc["stragglers"] = {
        **doc["stragglers"],
        "what_if": {**(doc["stragglers"].get("what_if") or {}), "mean_step_time_us": 89_685.0},
    }
    (card,) = [k for k in _kpis(doc) if k.label == "Step time (median)"]
    assert card.hint is not None and card.hint.startswith("mean 89.7 ms")
    doc["stragglers"]["what_if"]["mean_step_time_us"] = float(card.value.split()[0].replace(",", "")) * 1000
    (card,) = [k for k in _kpis(doc) if k.label == "Step time (median)"]
    assert card.hint is None  # one number when mean and median agree


@pytest.mark.parametrize(
    ("ranks", "text"), [([3], "intermittent: rank 3"), ([1, 3], "intermittent: ranks 1, 3")]
)
def test_straggler_card_counts_ranks_in_words(
    hostile_doc: dict[str, Any], ranks: list[int], text: str
) -> None:
    doc = _doc_with(hostile_doc)
    doc["stragglers"] = {**doc["stragglers"], "kind": "intermittent", "ranks": ranks}
    (card,) = [k for k in _kpis(doc) if k.label == "Stragglers"]
    assert card.value == text


def test_plural() -> None:
    assert [plural(1, "rank"), plural(4, "rank"), plural(1, "step"), plural(0, "step")] == [
        "1 rank",
        "4 ranks",
        "1 step",
        "0 steps",
    ]


def test_chart_captions_count_in_words(hostile_doc: dict[str, Any]) -> None:
    """The report's own captions (the diagnosis' sentences are the diagnosis' to word)."""
    html = render_report(hostile_doc)
    assert "Per step, mean over 2 ranks." in html
    assert re.search(r"Per rank, mean over \d+ steps ", html)
    assert not re.search(r"mean over \d+ (rank|step)\(s\)", html)


def test_legend_clear_of_a_two_row_axis() -> None:
    fig = _stacked(
        [["rank 0", "rank 0"], ["0", "1"]], {"compute": [1.0, 2.0]}, xtitle="rank / step", multicategory=True
    )
    layout = fig["layout"]
    assert layout["legend"]["y"] > 1 and layout["legend"]["yanchor"] == "bottom"  # above the plot
    assert layout["margin"]["b"] >= 90  # two rows of ticks and the axis title below it
