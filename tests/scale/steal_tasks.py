"""Task functions and a pool initializer for the work-stealing tests, importable by pool workers:
the workers are held at their start until the driver has run a task, so the driver's part of a
run is certain rather than a race with the workers' start-up."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from kinetoscope.scale.mapper import RankResult, RankTask, map_rank
from kinetoscope.scale.stealing import Board, init_worker

GATE_TIMEOUT_S = 300.0  # generous: a loaded CI box; the test never waits this long when it passes


def gated_init(marker: str, board: Board, env: dict[str, str]) -> None:
    """A worker's initializer that waits until ``marker`` exists (the driver ran a task)."""
    deadline = time.monotonic() + GATE_TIMEOUT_S
    while not os.path.exists(marker) and time.monotonic() < deadline:
        time.sleep(0.01)
    init_worker(board, env)


def square_where(arg: tuple[str, int, int]) -> tuple[int, int]:
    """``(x * x, pid)``; in the driver (``driver_pid``) it first opens the workers' gate."""
    marker, driver_pid, x = arg
    if os.getpid() == driver_pid:
        Path(marker).touch()
    return x * x, os.getpid()


def map_rank_where(arg: tuple[str, int, RankTask]) -> RankResult:
    """``map_rank``; in the driver it first opens the workers' gate."""
    marker, driver_pid, task = arg
    if os.getpid() == driver_pid:
        Path(marker).touch()
    return map_rank(task)


def gated_pool(marker: Path, workers: int, n_tasks: int) -> tuple[Any, Board]:
    """A forkserver pool whose workers wait for ``marker``, and its board."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    ctx = multiprocessing.get_context("forkserver")
    board = Board(ctx.Array("b", n_tasks), ctx.Value("i", 0), ctx.Value("i", 0))
    pool = ProcessPoolExecutor(
        max_workers=workers,
        mp_context=ctx,
        initializer=gated_init,
        initargs=(str(marker), board, {"KSCOPE_LOAD_WORKERS": "0"}),
    )
    return pool, board
