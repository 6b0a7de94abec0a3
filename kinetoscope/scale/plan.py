"""Which analyses run where in the map/reduce path, checked before any work starts."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from kinetoscope.analysis import registry
from kinetoscope.analysis.runner import resolve_names


@dataclass(frozen=True)
class Plan:
    """Analysis names by ``AnalysisSpec.combine`` (display order kept)."""

    names: list[str] = field(default_factory=list)  # all of them, in run order
    concat: list[str] = field(default_factory=list)
    concat_by_rank: list[str] = field(default_factory=list)
    reduce: list[str] = field(default_factory=list)
    driver: list[str] = field(default_factory=list)


def make_plan(names: Sequence[str] | None) -> Plan:
    """Split the requested analyses (default ones when ``names`` is empty) by strategy.

    Raises ``ValueError`` for an analysis declared ``reduce`` without a reducer in
    ``kinetoscope.scale.reducers.REDUCERS`` (a registration mistake, not a user error)."""
    from kinetoscope.scale.reducers import REDUCERS

    plan = Plan()
    for name in resolve_names(names):
        spec = registry.get(name)
        if spec.combine == "reduce" and name not in REDUCERS:
            raise ValueError(
                f"analysis {name!r} is declared combine='reduce' but kinetoscope.scale.reduce has no reducer for it"
            )
        plan.names.append(name)
        getattr(plan, spec.combine).append(name)
    return plan
