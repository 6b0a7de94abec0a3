"""Fixtures for the report tests: one analysed synthetic job with hostile kernel names (module
scope: the analysis runs once), and the analysis of a real vendored CPU-only trace."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.report.kscope_testkit import write_job


@pytest.fixture(scope="session")
def hostile_job(tmp_path_factory) -> Path:
    """A 2-rank GPU-shaped job (rank 1 straggles in steps 2, 5, 6) with hostile names."""
    d = tmp_path_factory.mktemp("hostile") / "kst-20261121-000000-test"
    write_job(d)
    return d


@pytest.fixture(scope="session")
def hostile_doc(hostile_job) -> dict:
    from kinetoscope.orchestration import analyze_paths

    return analyze_paths(sorted(hostile_job.glob("rank-*.json")), cache=False)


@pytest.fixture(scope="session")
def cpu_doc(hta_traces) -> dict:
    from kinetoscope.orchestration import analyze_paths

    return analyze_paths([hta_traces / "cpu_only_v2024_full"], cache=False)
