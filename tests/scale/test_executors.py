"""Executors fail with a clear, one-line reason (no Ray traceback reaches a CLI user)."""

from __future__ import annotations

import os

import pytest

from kinetoscope.errors import KinetoscopeError, UsageError
from kinetoscope.scale.executors import (
    AUTO_SINGLE_JSON_BYTES,
    LocalExecutor,
    choose_backend,
    cpu_slots,
    lost,
    make_executor,
    ray_failure,
)


def test_unknown_backend_is_a_usage_error() -> None:
    with pytest.raises(UsageError, match="'spark' is not one of auto, single, local, ray"):
        make_executor("spark")


def test_local_executor_runs_every_task() -> None:
    ex = LocalExecutor(2)
    try:
        assert sorted(o.value for o in ex.map_unordered(abs, [-3, 1, -2])) == [1, 2, 3]
    finally:
        ex.close()


def test_a_ray_that_cannot_be_joined_is_a_clear_error() -> None:
    ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'kinetoscope[scale]')")
    with pytest.raises(KinetoscopeError, match=r"--backend ray: could not start the Ray cluster at ray://: "):
        make_executor("ray", ray_address="ray://")
    assert not ray.is_initialized()


def _die(x: int) -> int:
    if x == 2:
        os._exit(3)  # a worker killed mid-task (as the kernel's OOM killer would)
    return x


def test_a_worker_that_dies_fails_its_task_only() -> None:
    """The dying task breaks the pool (and fails the other task in flight with it): the others
    are rerun, and only the task that kills its worker comes back as an error."""
    ex = LocalExecutor(2)
    try:
        outs = list(ex.map_unordered(_die, [1, 2, 3, 4]))
    finally:
        ex.close()
    assert sorted(o.item for o in outs) == [1, 2, 3, 4]
    assert {o.item: o.value for o in outs if o.error is None} == {1: 1, 3: 3, 4: 4}
    (failed,) = [o for o in outs if o.error is not None]
    assert failed.item == 2 and "worker process died" in str(failed.error)


@pytest.mark.parametrize(
    ("n", "env", "want"),
    [(1, {}, "single"), (4, {}, "single"), (5, {}, "local"), (5, {"RAY_ADDRESS": "10.0.0.1:6379"}, "ray")],
)
def test_auto_backend_says_which_and_why(
    n: int, env: dict[str, str], want: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    backend, why = choose_backend("auto", n, workers=2)
    assert backend == want and why
    assert choose_backend("local", n) == ("local", "--backend local")


def test_cpu_slots_interleave_the_nodes_by_their_cpus() -> None:
    """Round-robin over the slots is round-robin over the nodes, weighted by CPUs; a node
    without a CPU (a head started with --num-cpus 0) gets no task."""
    nodes = [
        {"NodeID": "a", "Resources": {"CPU": 2.0}},
        {"NodeID": "b", "Resources": {"CPU": 1.0}},
        {"NodeID": "c", "Resources": {}},
    ]
    assert cpu_slots(nodes) == ["a", "b", "a"]
    assert cpu_slots([]) == []


def test_only_a_lost_ray_task_is_resubmitted() -> None:
    """A task lost with its worker, node or result is rerun elsewhere; an error of the function
    itself is not (it would fail again) and says the function's error, not Ray's task line."""
    ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'kinetoscope[scale]')")
    exc = ray.exceptions
    for lost_one in (
        exc.WorkerCrashedError(),
        exc.NodeDiedError("node 1fad... died"),
        exc.OwnerDiedError("ab" * 14, None, "map_unordered"),
        exc.ObjectReconstructionFailedError("ab" * 14, None, "map_unordered"),
        exc.RayTaskError("map_rank", "tb", exc.ObjectLostError("ab" * 14, None, "map_rank")),
    ):
        assert lost(ray, lost_one), lost_one
    own = exc.RayTaskError("map_rank", "\x1b[36mray::map_rank()\x1b[39m (pid=1)", ValueError("bad rank"))
    assert not lost(ray, own) and not lost(ray, exc.TaskCancelledError())
    assert ray_failure(ray, own) == "ValueError: bad rank"
    assert ray_failure(ray, exc.NodeDiedError("node gone")) == "NodeDiedError: node gone"


@pytest.mark.parametrize(
    ("json_bytes", "want"),
    [(7 << 20, "single"), (AUTO_SINGLE_JSON_BYTES, "single"), (AUTO_SINGLE_JSON_BYTES + 1, "local")],
)
def test_auto_backend_keeps_small_sets_of_files_in_this_process(
    json_bytes: int, want: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Eight small rank files (the DLRM job: 7 MB of JSON) parse here faster than a pool's workers
    start; a larger set still goes to the pool, and so do explicit backends."""
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    backend, why = choose_backend("auto", 8, workers=2, json_bytes=json_bytes)
    assert backend == want
    assert ("MB of JSON" in why) == (want == "single")
    assert choose_backend("local", 8, json_bytes=json_bytes)[0] == "local"
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")
    assert choose_backend("auto", 8, json_bytes=json_bytes)[0] == "ray"
