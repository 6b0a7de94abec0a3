"""Executors fail with a clear, one-line reason (no Ray traceback reaches a CLI user)."""

from __future__ import annotations

import pytest

from kinetoscope.errors import KinetoscopeError, UsageError
from kinetoscope.scale.executors import LocalExecutor, make_executor


def test_unknown_backend_is_a_usage_error() -> None:
    with pytest.raises(UsageError, match="'spark' is not one of local, ray"):
        make_executor("spark")


def test_local_executor_runs_every_task() -> None:
    ex = LocalExecutor(2)
    try:
        assert sorted(ex.map_unordered(abs, [-3, 1, -2])) == [1, 2, 3]
    finally:
        ex.close()


def test_a_ray_that_cannot_be_joined_is_a_clear_error() -> None:
    ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'kinetoscope[scale]')")
    with pytest.raises(KinetoscopeError, match=r"--backend ray: could not start the Ray cluster at ray://: "):
        make_executor("ray", ray_address="ray://")
    assert not ray.is_initialized()
