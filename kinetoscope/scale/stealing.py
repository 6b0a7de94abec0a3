"""The local pool's start-up, not wasted: the driver takes tasks itself until the workers run.

Why: a pool worker is a fresh interpreter that imports Polars, the loader, the analyses and the
diagnosis (~0.6 s of CPU) before its first rank, and the driver used to sit idle meanwhile. At
8 x 35 MB ranks on 2 cores that start-up was a quarter of the run (issue 12: wall 1.32x of
single ÷ workers). Two changes, both here:

* **Work stealing while the workers start.** Every task goes to the pool in input order, and
  the driver takes tasks from the other end, one at a time, for as long as some worker has not
  begun its first task. A task is done once: whoever claims it first on a shared board
  (``Board``, one byte per task, under its lock) runs it; a worker that finds its task taken
  skips it (``Taken``). Once every worker runs, the driver collects, and at the end, when fewer
  ranks are left unclaimed than there are workers, takes one of those too (``_tail``: the last
  round is then shared instead of run by one worker while the others idle). A result the driver
  computed goes through pickle, as a worker's does, so it shares no buffer with the rank's
  tables (the driver keeps only small things).
* **One import for all workers.** The modules the task needs (``preload``) are imported once by
  the ``forkserver`` process that forks the workers (``set_forkserver_preload``), not once per
  worker; that import is the one the driver overlaps. Importing Polars starts no thread, so
  forking after it is safe (as ``kinetoscope.trace.parallel``'s zygote). The pool's processes
  are started from a helper thread: starting one waits for the fork server to be ready.

A task the driver runs is run in the driver's process: one that kills its process (a crash, not
an exception) kills the run there, as with ``--backend single``; only the few tasks taken during
the start-up and the last round run there (``StealStats``), and memory is checked before a rank loads
(``scale.memory.check_fits``).
"""

from __future__ import annotations

import multiprocessing
import os
import pickle
import threading
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from typing import Any, Generic, TypeVar, cast

T = TypeVar("T")
R = TypeVar("R")

FREE, POOL, DRIVER = 0, 1, 2  # who claimed a task on the board


@dataclass
class Board:
    """Shared between the driver and the pool's workers (passed at process creation)."""

    claims: Any  # multiprocessing Array of bytes: FREE / POOL / DRIVER per task
    started: Any  # multiprocessing Value: workers that have begun a task
    claimed: Any  # multiprocessing Value: tasks claimed so far (by anyone)


class Taken:
    """What a worker returns for a task the driver claimed first."""


def claim(board: Board, index: int, who: int) -> bool:
    """Claim task ``index`` for ``who``; False when someone claimed it first."""
    with board.claims.get_lock():
        if board.claims[index] != FREE:
            return False
        board.claims[index] = who
        board.claimed.value += 1  # under the claims' lock: the one lock every claim takes
        return True


_BOARD: Board | None = None  # in a worker: the run's board (set by ``init_worker``)
_STARTED = False  # in a worker: it has counted itself on the board


def init_worker(board: Board, env: dict[str, str]) -> None:
    """Pool initializer: the worker's environment and the board."""
    global _BOARD, _STARTED
    os.environ.update(env)
    _BOARD, _STARTED = board, False


def run_claimed(fn: Callable[[T], R], index: int, item: T) -> R | Taken:
    """In a worker: count this worker as started (first call), then run the task unless the
    driver claimed it first."""
    global _STARTED
    board = _BOARD
    if board is None:  # not started by ``map_stealing`` (cannot happen): just run it
        return fn(item)
    if not _STARTED:
        _STARTED = True
        with board.started.get_lock():
            board.started.value += 1
    if not claim(board, index, POOL):
        return Taken()
    return fn(item)


def preload_modules(modules: Sequence[str]) -> None:
    """Have the fork server import ``modules`` once for every worker it forks (with
    ``__main__``, its default). No effect when the fork server already runs."""
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(list(dict.fromkeys(["__main__", *modules])))


@dataclass
class StealStats:
    """What the driver did in the last run (``LocalExecutor.stolen``)."""

    by_driver: int = 0  # tasks the driver ran itself
    in_tail: int = 0  # of those, taken at the end, while every worker was busy


@dataclass
class Done(Generic[T, R]):
    """A finished task: its item and value, or the exception it raised, or ``broken`` when its
    worker died (the pool broke under it: rerun it alone)."""

    item: T
    value: R | None = None
    exc: BaseException | None = None
    broken: bool = False


def _detached(value: R) -> R:
    """The value as a worker would have sent it (pickled), sharing no buffer with this process."""
    return cast(R, pickle.loads(pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)))


class _Submitter:
    """Submits every task to the pool from a helper thread (starting a worker can wait for the
    fork server's imports); ``futures`` is complete once ``thread`` has ended."""

    def __init__(self, pool: ProcessPoolExecutor, fn: Callable[[T], R], items: Sequence[T]) -> None:
        self.futures: dict[Future[Any], int] = {}
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, args=(pool, fn, items), daemon=True)
        self.thread.start()

    def _run(self, pool: ProcessPoolExecutor, fn: Callable[[T], R], items: Sequence[T]) -> None:
        try:
            for i, it in enumerate(items):
                self.futures[pool.submit(run_claimed, fn, i, it)] = i
        except BaseException as exc:  # noqa: BLE001 - the pool could not start: the driver runs the rest
            self.error = exc

    def finished(self) -> bool:
        return not self.thread.is_alive()


def map_stealing(
    pool: ProcessPoolExecutor,
    board: Board,
    workers: int,
    fn: Callable[[T], R],
    items: Sequence[T],
    stats: StealStats,
) -> Iterator[Done[T, R]]:
    """Every task once, as it finishes: on ``pool`` (its workers initialised with ``board``),
    and in this process from the end of ``items`` while fewer than ``workers`` workers have
    begun (module docstring). A pool that could not start leaves every task to this process."""
    sub = _Submitter(pool, fn, items)
    steal = deque(reversed(range(len(items))))
    seen: set[int] = set()
    while steal and board.started.value < workers:
        i = steal.popleft()
        if claim(board, i, DRIVER):
            stats.by_driver += 1
            yield _here(fn, items[i])
        if sub.finished():
            yield from _collect(sub.futures, items, board, seen, block=False)
    sub.thread.join()
    if sub.error is not None:  # no pool: whatever no worker claimed is done here
        for i in steal:
            if claim(board, i, DRIVER):
                stats.by_driver += 1
                yield _here(fn, items[i])
    finished: Iterator[Done[T, R]] = _collect(sub.futures, items, board, seen, block=True)
    for done in finished:
        yield done
        yield from _tail(board, workers, fn, items, steal, stats)


def _tail(
    board: Board, workers: int, fn: Callable[[T], R], items: Sequence[T], steal: deque[int], stats: StealStats
) -> Iterator[Done[T, R]]:
    """At the end, fewer unclaimed tasks than workers: every worker is busy or about to be, and
    the driver would only wait. It takes one (from the end) rather than leave the last round to
    one worker while the others idle."""
    while steal and 0 < len(items) - board.claimed.value < workers:
        i = steal.popleft()
        if claim(board, i, DRIVER):
            stats.by_driver += 1
            stats.in_tail += 1
            yield _here(fn, items[i])


def _here(fn: Callable[[T], R], item: T) -> Done[T, R]:
    try:
        return Done(item, _detached(fn(item)))
    except Exception as exc:  # noqa: BLE001 - that task's error, as from a worker
        return Done(item, exc=exc)


def _collect(
    futures: dict[Future[Any], int], items: Sequence[T], board: Board, seen: set[int], *, block: bool
) -> Iterator[Done[T, R]]:
    """The pool's finished tasks not yet seen (all of them when ``block``); a task the driver
    claimed comes back ``Taken`` (or broken, when the pool broke) and is skipped."""
    pending = [f for f in futures if futures[f] not in seen]
    for f in as_completed(pending) if block else [f for f in pending if f.done()]:
        i = futures[f]
        seen.add(i)
        out = None if board.claims[i] == DRIVER else _outcome(f, items[i])
        if out is not None:
            yield out


def _outcome(fut: Future[Any], item: T) -> Done[T, Any] | None:
    try:
        value = fut.result()
    except BrokenProcessPool:
        return Done(item, broken=True)
    except Exception as exc:  # noqa: BLE001 - the task could not be sent or returned (pickling)
        return Done(item, exc=exc)
    return None if isinstance(value, Taken) else Done(item, value)
