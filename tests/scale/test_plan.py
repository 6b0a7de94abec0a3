"""Decomposability is declared and checked; --backend ray without Ray is a one-line error."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

import kinetoscope
from kinetoscope.analysis import registry
from kinetoscope.errors import UsageError
from kinetoscope.scale import REDUCERS, make_plan
from kinetoscope.scale.executors import make_executor

PKG = Path(kinetoscope.__file__).parent


def test_every_builtin_declares_a_scalable_strategy() -> None:
    plan = make_plan(registry.names())
    assert plan.driver == [], "a built-in analysis would ship whole traces to the driver"
    assert sorted(plan.reduce) == sorted(REDUCERS)
    assert set(plan.names) == set(registry.names())


def test_reduce_without_reducer_is_refused() -> None:
    spec = registry.get("temporal_breakdown")
    fake = registry.AnalysisSpec(
        name="_no_reducer", func=spec.func, description="x", combine="reduce", default=False
    )
    registry.register(fake)
    try:
        with pytest.raises(ValueError, match="no reducer"):
            make_plan(["_no_reducer"])
    finally:
        registry._REGISTRY.pop("_no_reducer")


def test_unknown_strategy_is_refused() -> None:
    spec = registry.get("temporal_breakdown")
    with pytest.raises(ValueError, match="combine"):
        registry.register(registry.AnalysisSpec(name="_bad", func=spec.func, description="x", combine="sum"))


def test_ray_backend_without_ray_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # what `import ray` sees when it is not installed
    with pytest.raises(UsageError, match=r"pip install 'kinetoscope\[scale\]'"):
        make_executor("ray")


def test_unknown_backend_is_a_usage_error() -> None:
    with pytest.raises(UsageError, match="single, local, ray"):
        make_executor("spark")
