"""A trace that the free memory cannot hold is a clear error with the figures, before loading
(never an OOM kill); the uncompressed size is read from the gzip trailer."""

from __future__ import annotations

import gzip
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kinetoscope.errors import UsageError
from kinetoscope.scale import AnalyzeRequest, run_analysis
from kinetoscope.scale.memory import LOAD_BASE_BYTES, LOAD_FACTOR, available_bytes, check_fits, json_bytes
from tests.scale.conftest import PAIR


def test_json_bytes_is_the_uncompressed_size(tmp_path: Path) -> None:
    assert json_bytes(str(PAIR[0])) == len(gzip.decompress(PAIR[0].read_bytes()))
    plain = tmp_path / "t.json"
    plain.write_bytes(b'{"traceEvents": []}')
    assert json_bytes(str(plain)) == plain.stat().st_size


def test_available_memory_can_be_capped(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KSCOPE_MEMORY_AVAILABLE", "1.5G")
    assert available_bytes() == int(1.5 * (1 << 30))
    monkeypatch.setenv("KSCOPE_MEMORY_AVAILABLE", "lots")
    with pytest.raises(UsageError, match="KSCOPE_MEMORY_AVAILABLE"):
        available_bytes()
    monkeypatch.delenv("KSCOPE_MEMORY_AVAILABLE")
    assert available_bytes() > 0


def test_a_rank_too_big_for_the_free_memory_is_an_error_with_the_figures(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("KSCOPE_MEMORY_AVAILABLE", "100M")
    why = check_fits(str(PAIR[0]))
    raw = json_bytes(str(PAIR[0]))
    need = LOAD_BASE_BYTES + int(LOAD_FACTOR * raw)
    assert (
        why is not None
        and f"a {raw / (1 << 20):.0f} MiB JSON trace needs about {need / (1 << 20):.0f} MiB" in why
    )
    assert "and 100 MiB is available here" in why
    monkeypatch.setenv("KSCOPE_MEMORY_AVAILABLE", "64G")
    assert check_fits(str(PAIR[0])) is None


def test_cli_says_why_instead_of_being_killed() -> None:
    env = {**os.environ, "KSCOPE_MEMORY_AVAILABLE": "100M"}
    proc = subprocess.run(
        [sys.executable, "-m", "kinetoscope.cli.main", "analyze", str(PAIR[0]), "--no-cache", "--no-record"],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        check=False,
    )
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert "MiB of memory to load and analyse, and 100 MiB is available here" in proc.stderr


def test_the_other_ranks_are_still_analysed(monkeypatch: pytest.MonkeyPatch) -> None:
    """Only the ranks over the limit fail: with the limit between the two files' needs, the
    smaller rank is analysed and the larger one is an error entry."""
    needs = sorted((json_bytes(str(p)), p) for p in PAIR)
    between = LOAD_BASE_BYTES + int(LOAD_FACTOR * (needs[0][0] + needs[1][0]) / 2)
    monkeypatch.setenv("KSCOPE_MEMORY_AVAILABLE", str(between))
    run = run_analysis(AnalyzeRequest(backend="single", cache=False), [str(p) for p in PAIR])
    assert list(run.load_errors) == [str(needs[1][1])]
    assert [t.meta.path for t in run.traces] == [str(needs[0][1])]


def test_a_rank_loaded_whole_needs_the_larger_factor(
    monkeypatch: pytest.MonkeyPatch, undeclared_analysis: str
) -> None:
    """An analysis that does not declare its reads loads every table and column, and a heavy one
    (call graph, critical path, ...) builds structures the smaller factor was not measured with:
    the check uses ``LOAD_FACTOR_WHOLE`` for both; the default document uses ``LOAD_FACTOR``."""
    from kinetoscope.analysis import registry
    from kinetoscope.scale.mapper import RankTask, map_rank
    from kinetoscope.scale.memory import LOAD_FACTOR_WHOLE

    raw = json_bytes(str(PAIR[0]))
    assert LOAD_FACTOR_WHOLE > LOAD_FACTOR
    between = LOAD_BASE_BYTES + int((LOAD_FACTOR + LOAD_FACTOR_WHOLE) / 2 * raw)
    monkeypatch.setenv("KSCOPE_MEMORY_AVAILABLE", str(between))
    assert check_fits(str(PAIR[0])) is None
    why = check_fits(str(PAIR[0]), whole=True)
    assert why is not None and "needs about" in why
    req = AnalyzeRequest(cache=False)
    assert map_rank(RankTask(0, str(PAIR[0]), tuple(registry.default_names()), req)).error is None
    assert map_rank(RankTask(0, str(PAIR[0]), (undeclared_analysis,), req)).error == why
    assert map_rank(RankTask(0, str(PAIR[0]), ("temporal_breakdown", "critical_path"), req)).error == why
