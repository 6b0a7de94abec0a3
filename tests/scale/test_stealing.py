"""The driver runs tasks while the local pool's workers start (``kinetoscope.scale.stealing``):
every task runs exactly once, by the driver or by a worker, and the document is the single
process's. The workers are held at their start until the driver ran a task
(``tests/scale/steal_tasks.py``), so the driver's share is certain, not a race."""

from __future__ import annotations

import os
from pathlib import Path

from kinetoscope.scale.executors import LocalExecutor
from kinetoscope.scale.mapper import RankTask
from kinetoscope.scale.plan import make_plan
from kinetoscope.scale.reduce import reduce_document
from kinetoscope.scale.request import AnalyzeRequest
from kinetoscope.scale.stealing import DRIVER, POOL, StealStats, map_stealing
from tests.scale.steal_tasks import gated_pool, map_rank_where, square_where
from tests.scale.test_equivalence import analyze_paths, assert_same_document


def test_every_task_runs_once_and_the_driver_takes_some(tmp_path: Path) -> None:
    marker = tmp_path / "gate"
    items = [(str(marker), os.getpid(), x) for x in range(12)]
    pool, board = gated_pool(marker, 2, len(items))
    stats = StealStats()
    try:
        done = list(map_stealing(pool, board, 2, square_where, items, stats))
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
    assert sorted(d.item[2] for d in done) == list(range(12)), "each task exactly once"
    assert all(d.exc is None and not d.broken and d.value is not None for d in done)
    assert {d.item[2]: d.value[0] for d in done if d.value} == {x: x * x for x in range(12)}
    here = [d.item[2] for d in done if d.value and d.value[1] == os.getpid()]
    assert here and stats.by_driver == len(here)
    assert here[0] == 11, "the driver takes tasks from the end of the list"
    claims = list(board.claims)
    assert all(claims[x] == DRIVER for x in here)
    assert all(claims[x] == POOL for x in set(range(12)) - set(here))


def test_the_driver_s_ranks_give_the_single_process_document(mixed8: list[Path], tmp_path: Path) -> None:
    """Ranks analysed partly in the driver, partly in the workers: the same document."""
    request = AnalyzeRequest(cache=False, backend="local", workers=2)
    plan = make_plan(None)
    marker = tmp_path / "gate"
    tasks = [RankTask(i, str(f), tuple(plan.names), request, 0) for i, f in enumerate(mixed8)]
    items = [(str(marker), os.getpid(), t) for t in tasks]
    pool, board = gated_pool(marker, 2, len(items))
    stats = StealStats()
    try:
        ranks = [d.value for d in map_stealing(pool, board, 2, map_rank_where, items, stats)]
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
    assert stats.by_driver >= 1 and all(r is not None and r.error is None for r in ranks)
    pids = {r.worker.split(":")[1] for r in ranks if r is not None}
    assert str(os.getpid()) in pids
    run = reduce_document([r for r in ranks if r is not None], request, plan.names)
    assert_same_document(analyze_paths(mixed8), run.document)


def test_local_executor_with_stealing_runs_every_task() -> None:
    """Without a gate: whoever is free runs each task, once; a task's error is its outcome's."""
    ex = LocalExecutor(2, steal=True, preload=["kinetoscope.scale.stealing"])
    try:
        outs = list(ex.map_unordered(_inverse, [4, 0, 2, 1, 5]))
    finally:
        ex.close()
    assert sorted(o.item for o in outs) == [0, 1, 2, 4, 5]
    assert {o.item: o.value for o in outs if o.error is None} == {4: 0.25, 2: 0.5, 1: 1.0, 5: 0.2}
    (bad,) = [o for o in outs if o.error is not None]
    assert bad.item == 0 and "ZeroDivisionError" in str(bad.error)
    assert 0 <= ex.stolen.by_driver <= 5


def _inverse(x: int) -> float:
    return 1 / x
