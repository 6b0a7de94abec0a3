"""Scoring a straggler verdict against a scenario's label.

Per scenario: expected ``(kind, ranks)`` from what was injected, got ``(kind, ranks)`` from
``diagnose(paths).to_dict()["stragglers"]``. Rank counts: true positives = named ranks that
were injected, false positives = named ranks that were not (every named rank of a clean job),
false negatives = injected ranks not named. Precision and recall are micro-averaged over the
scenarios of a type (and over all scenarios for ``overall``); a type with nothing named has no
precision (``None``), a type with nothing injected (clean) no recall. ``kind`` accuracy is the
share of scenarios whose kind equals the expected one; for clean jobs it is the "clean -> none"
rate.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class Outcome:
    sid: str
    generator: str  # gpu | cpu
    type: str
    expected_kind: str
    expected_ranks: list[int]
    kind: str
    ranks: list[int]
    params: dict[str, Any] = field(default_factory=dict)
    truth_ok: bool | None = None  # arrival-order ground truth agrees with the label
    seconds: float = 0.0
    error: str | None = None
    reason: str | None = None

    @property
    def tp(self) -> int:
        return len(set(self.ranks) & set(self.expected_ranks))

    @property
    def fp(self) -> int:
        return len(set(self.ranks) - set(self.expected_ranks))

    @property
    def fn(self) -> int:
        return len(set(self.expected_ranks) - set(self.ranks))

    @property
    def kind_ok(self) -> bool:
        return self.kind == self.expected_kind

    @property
    def exact(self) -> bool:
        return self.kind_ok and sorted(set(self.ranks)) == sorted(set(self.expected_ranks))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self) | {"kind_ok": self.kind_ok, "exact": self.exact}


def _ratio(num: int, den: int) -> float | None:
    return num / den if den else None


def summarize(outcomes: Iterable[Outcome]) -> dict[str, Any]:
    """Counts and rates of a set of outcomes."""
    out = list(outcomes)
    tp, fp, fn = (sum(getattr(o, a) for o in out) for a in ("tp", "fp", "fn"))
    truth = [o.truth_ok for o in out if o.truth_ok is not None]
    return {
        "n": len(out),
        "precision": _ratio(tp, tp + fp),
        "recall": _ratio(tp, tp + fn),
        "kind_accuracy": _ratio(sum(o.kind_ok for o in out), len(out)),
        "exact": _ratio(sum(o.exact for o in out), len(out)),
        "errors": sum(o.error is not None for o in out),
        "truth_agrees": _ratio(sum(truth), len(truth)),
        "tp": tp,
        "fp": fp,
        "fn": fn,
    }


def summary_by_type(outcomes: list[Outcome], types: Iterable[str]) -> dict[str, dict[str, Any]]:
    """``summarize`` per scenario type (in ``types`` order, present ones only) plus ``overall``."""
    res = {
        t: summarize(o for o in outcomes if o.type == t) for t in types if any(o.type == t for o in outcomes)
    }
    res["overall"] = summarize(outcomes)
    return res


def fmt(x: float | None) -> str:
    return "—" if x is None else f"{x:.2f}"


def table(summary: dict[str, dict[str, Any]]) -> str:
    """A Markdown table of ``summary_by_type``."""
    rows = [
        "| type | n | rank precision | rank recall | kind accuracy | exact | truth agrees |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for t, s in summary.items():
        name = f"**{t}**" if t == "overall" else t
        rows.append(
            f"| {name} | {s['n']} | {fmt(s['precision'])} | {fmt(s['recall'])} | {fmt(s['kind_accuracy'])} "
            f"| {fmt(s['exact'])} | {fmt(s['truth_agrees'])} |"
        )
    return "\n".join(rows)


TARGETS = {"precision": 0.95, "recall": 0.95, "type_min": 0.9, "clean_none": 0.95, "kind": 0.90}


def misses(summary: dict[str, dict[str, Any]]) -> list[str]:
    """Which of issue 9's targets a summary misses, one line each."""
    out = []
    ov = summary.get("overall", {})
    for key in ("precision", "recall"):
        v = ov.get(key)
        if v is not None and v < TARGETS[key]:
            out.append(f"overall rank {key} {v:.3f} < {TARGETS[key]}")
    if ov.get("kind_accuracy") is not None and ov["kind_accuracy"] < TARGETS["kind"]:
        out.append(f"overall kind accuracy {ov['kind_accuracy']:.3f} < {TARGETS['kind']}")
    clean = summary.get("clean")
    if clean and clean["kind_accuracy"] is not None and clean["kind_accuracy"] < TARGETS["clean_none"]:
        out.append(f"clean -> none {clean['kind_accuracy']:.3f} < {TARGETS['clean_none']}")
    for t, s in summary.items():
        if t == "overall":
            continue
        for key in ("precision", "recall"):
            v = s.get(key)
            if v is not None and v < TARGETS["type_min"]:
                out.append(f"{t}: rank {key} {v:.2f} < {TARGETS['type_min']}")
    return out
