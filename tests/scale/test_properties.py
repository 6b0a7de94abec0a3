"""Property: for every analysis declared per-rank (``concat`` / ``concat_by_rank``), the result
over a set of ranks equals the per-rank results combined as the reduce combines them; for
``reduce`` analyses, the reducer equals the analysis. Sets drawn from real traces, any order."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from polars.testing import assert_frame_equal

from kinetoscope.analysis import registry
from kinetoscope.scale.mapper import RankResult
from kinetoscope.scale.reduce import _by_rank, _concat
from kinetoscope.scale.reducers import REDUCERS
from kinetoscope.trace import load_trace
from tests.conftest import HTA_TRACES
from tests.scale.conftest import PAIR

POOL_FILES = [
    *PAIR,
    HTA_TRACES / "with_gpu_user_annotation" / "step_based_trace_2543932.json.gz",
    HTA_TRACES / "trace_compare" / "base" / "base.json.gz",
    HTA_TRACES / "cpu_only" / "rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz",
    HTA_TRACES / "amd_trace" / "mi250_minitoy_train_ROCm6_2_kineto.json.gz",
]
OPTIONS = {"num_kernels": 3}


@pytest.fixture(scope="module")
def pool():
    return [load_trace(p) for p in POOL_FILES]


def _per_rank_specs(kinds: tuple[str, ...]) -> list[registry.AnalysisSpec]:
    return [s for s in registry.all_specs() if s.combine in kinds]


def _equal(full, combined, name: str) -> None:
    if full.height == 0 and combined.height == 0:
        return
    try:
        assert_frame_equal(full, combined, check_dtypes=False)
    except AssertionError as exc:
        raise AssertionError(f"{name}: {exc}") from None


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(order=st.permutations(range(len(POOL_FILES))), k=st.integers(min_value=2, max_value=len(POOL_FILES)))
def test_per_rank_analyses_decompose(pool, order: list[int], k: int) -> None:
    # distinct ranks: with two traces claiming one rank (a loader warning), concat_by_rank keeps
    # them in blocks where the analysis interleaves their rows (a documented limit, docs/scale.md)
    seen: set = set()
    traces = [t for t in (pool[i] for i in order[:k]) if not (t.meta.rank in seen or seen.add(t.meta.rank))]
    results = [RankResult(i, t.path, trace=t) for i, t in enumerate(traces)]
    for spec in _per_rank_specs(("concat", "concat_by_rank")):
        full = spec.call(traces, OPTIONS)
        ordered = _by_rank(results) if spec.combine == "concat_by_rank" else results
        _equal(full, _concat([spec.call([r.trace], OPTIONS) for r in ordered]), spec.name)


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(order=st.permutations(range(len(POOL_FILES))), k=st.integers(min_value=1, max_value=len(POOL_FILES)))
def test_reducers_equal_the_analysis(pool, order: list[int], k: int) -> None:
    traces = [pool[i] for i in order[:k]]
    for spec in _per_rank_specs(("reduce",)):
        opts = spec.resolve_options(OPTIONS)
        red = REDUCERS[spec.name]
        _equal(spec.call(traces, OPTIONS), red.reduce([red.map(t, opts) for t in traces], opts), spec.name)
