"""Where the map step runs: this process, a local process pool, or Ray tasks.

All take the same module-level function and picklable tasks and yield ``Outcome``s as they
finish (the driver puts them back in input order), so the reduce does not care which ran them.
A task that fails outside the function (a worker killed, a Ray node lost after its retries) is
an ``Outcome`` with ``error`` set: one failed rank, not a failed job.

* ``choose_backend``: what ``--backend auto`` picks (``AUTO_SINGLE_MAX``) and why.
* ``InProcessExecutor``: this process, one task after the other (easiest to debug).
* ``LocalExecutor(workers)``: ``concurrent.futures.ProcessPoolExecutor`` on a ``forkserver``
  (else ``spawn``) context: no fork of a driver holding threads and Polars state.
  ``workers=1`` runs in this process (no pool, easiest to debug).
* ``RayExecutor(address)``: one Ray task per rank. ``address`` (``--ray-address``, else
  ``$RAY_ADDRESS``) joins an existing cluster; without one a local Ray is started with
  ``num_cpus=workers`` and stopped at the end. Ray is imported only here. On two or more nodes
  the tasks are placed round-robin over the nodes' CPUs; a task lost with its node is rerun
  elsewhere (``RayExecutor``).

``describe(n_tasks)`` says where the tasks will run (Ray: which nodes); ``notes`` what happened
worth saying (Ray: tasks resubmitted after their node was lost).
"""

from __future__ import annotations

import multiprocessing
import os
import re
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar, cast

from kinetoscope.errors import KinetoscopeError, UsageError
from kinetoscope.scale.request import BACKENDS
from kinetoscope.scale.stealing import Board, StealStats, init_worker, map_stealing, preload_modules

T = TypeVar("T")
R = TypeVar("R")
# --backend auto: up to this many rank files run in this process (a pool costs ~1 s per worker
# to start and pickles every result; below this the pool's parallelism does not pay for it).
AUTO_SINGLE_MAX = 4
# ... and so does any number of files holding at most this much JSON in all: each worker is a
# fresh interpreter importing Polars and the loader (~0.5-1 s), more than this process takes to
# parse that much (~0.6 s at the native decoder's ~200 MB/s; issue 14: the 8-rank DLRM job, 7 MB,
# took 1.3 s with a pool of 2 vs 0.7 s here; docs/performance.md).
AUTO_SINGLE_JSON_BYTES = 128 << 20
RAY_TASK_RETRIES = 3  # Ray reruns a task whose worker or node died this many times (max_retries)
RAY_RESUBMITS = 2  # then the driver resubmits a lost task on another alive node this many times


@dataclass
class Outcome(Generic[T, R]):
    """One task's end: its item and either its value or why it failed (one line)."""

    item: T
    value: R | None = None
    error: str | None = None


# One trace per worker process: chunk-level parse workers inside a worker would oversubscribe.
_WORKER_ENV = {"KSCOPE_LOAD_WORKERS": "0"}


class Executor(Protocol):
    notes: list[str]  # what happened worth saying (e.g. tasks resubmitted), filled by map_unordered

    def map_unordered(self, fn: Callable[[T], R], items: Sequence[T]) -> Iterator[Outcome[T, R]]: ...
    def describe(self, n_tasks: int) -> str: ...  # where the tasks will run; "" when nothing to add
    def close(self) -> None: ...


def default_workers() -> int:
    return max(1, os.cpu_count() or 1)


def choose_backend(
    backend: str,
    n_files: int,
    *,
    workers: int | None = None,
    ray_address: str | None = None,
    json_bytes: int | None = None,
) -> tuple[str, str]:
    """``(backend, why)``: ``auto`` is Ray when a cluster address is given (``--ray-address``
    or ``$RAY_ADDRESS``), this process for up to ``AUTO_SINGLE_MAX`` files, for files holding at
    most ``AUTO_SINGLE_JSON_BYTES`` of JSON in all (``json_bytes``, when known) or for one
    worker, else the local pool."""
    if backend != "auto":
        return backend, f"--backend {backend}"
    address = ray_address or os.environ.get("RAY_ADDRESS")
    if address:
        src = "--ray-address" if ray_address else "$RAY_ADDRESS"
        return "ray", f"a Ray cluster is given ({src} {address})"
    n = workers or default_workers()
    if n_files <= AUTO_SINGLE_MAX:
        return "single", f"{n_files} rank file(s) (<= {AUTO_SINGLE_MAX}): one process is quickest"
    if json_bytes is not None and json_bytes <= AUTO_SINGLE_JSON_BYTES:
        mb, cap = json_bytes / 1e6, AUTO_SINGLE_JSON_BYTES >> 20
        return "single", f"{n_files} rank files, {mb:.1f} MB of JSON (<= {cap} MiB): one process is quickest"
    if n <= 1:
        return "single", "one worker: one process is quickest"
    return "local", f"{n_files} rank files: a pool of {min(n, n_files)} worker processes"


def _failure(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}".strip()


class InProcessExecutor:
    """This process, one task after the other."""

    def __init__(self) -> None:
        self.notes: list[str] = []

    def describe(self, n_tasks: int) -> str:
        return ""

    def map_unordered(self, fn: Callable[[T], R], items: Sequence[T]) -> Iterator[Outcome[T, R]]:
        for it in items:
            yield Outcome(it, fn(it))

    def close(self) -> None:
        return None


def _init_worker() -> None:
    os.environ.update(_WORKER_ENV)


def _context() -> Any:
    """The pool's start method: ``forkserver`` (no fork of a driver holding threads), else
    ``spawn``."""
    method = "forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else "spawn"
    return multiprocessing.get_context(method)


class LocalExecutor:
    """A process pool on this machine (``workers=1``: this process).

    ``preload``: modules the fork server imports once for all the workers (not once per
    worker). ``steal``: the driver runs tasks itself while the workers start and in the last
    round (``kinetoscope.scale.stealing``); ``stolen`` says how many tasks the driver ran. Off
    by default: a task the driver runs cannot kill its worker without killing the driver
    (``kscope analyze``'s map task never raises, and checks memory before it loads)."""

    def __init__(
        self, workers: int | None = None, *, steal: bool = False, preload: Sequence[str] = ()
    ) -> None:
        self.workers = workers or default_workers()
        self._pool: ProcessPoolExecutor | None = None
        self.notes: list[str] = []
        self.steal = steal
        self.preload = tuple(preload)
        self.stolen = StealStats()

    def describe(self, n_tasks: int) -> str:
        return ""

    def map_unordered(self, fn: Callable[[T], R], items: Sequence[T]) -> Iterator[Outcome[T, R]]:
        """Tasks on the pool as they finish. A worker that dies (OOM kill, crash) breaks the
        whole pool and fails every task in flight: those are rerun one at a time, each in a
        fresh one-worker pool, so only the task that kills its worker fails."""
        if self.workers <= 1 or len(items) <= 1:
            yield from InProcessExecutor().map_unordered(fn, items)
            return
        if self.preload and _context().get_start_method() == "forkserver":
            preload_modules(self.preload)
        if self.steal:
            yield from self._map_stealing(fn, items)
            return
        self._pool = self._new_pool(min(self.workers, len(items)))
        futures = {self._pool.submit(fn, it): it for it in items}
        suspects: list[T] = []
        for fut in as_completed(futures):
            try:
                yield Outcome(futures[fut], fut.result())
            except BrokenProcessPool:
                suspects.append(futures[fut])
            except Exception as exc:  # noqa: BLE001 - the task could not be sent or returned (pickling)
                yield Outcome(futures[fut], error=f"worker process failed: {_failure(exc)}")
        self.close()
        for it in suspects:
            yield self._alone(fn, it)

    def _map_stealing(self, fn: Callable[[T], R], items: Sequence[T]) -> Iterator[Outcome[T, R]]:
        """``map_unordered`` with the driver taking tasks while the workers start
        (``stealing.map_stealing``); a worker that dies is handled as without stealing."""
        n = min(self.workers, len(items))
        ctx = _context()
        board = Board(ctx.Array("b", len(items)), ctx.Value("i", 0), ctx.Value("i", 0))
        self._pool = ProcessPoolExecutor(
            max_workers=n, mp_context=ctx, initializer=init_worker, initargs=(board, _WORKER_ENV)
        )
        self.stolen = StealStats()
        suspects: list[T] = []
        for done in map_stealing(self._pool, board, n, fn, items, self.stolen):
            if done.broken:
                suspects.append(done.item)
            elif done.exc is not None:
                yield Outcome(done.item, error=f"worker process failed: {_failure(done.exc)}")
            else:
                yield Outcome(done.item, cast(R, done.value))
        self.close()
        for it in suspects:
            yield self._alone(fn, it)

    def _new_pool(self, workers: int) -> ProcessPoolExecutor:
        return ProcessPoolExecutor(max_workers=workers, mp_context=_context(), initializer=_init_worker)

    def _alone(self, fn: Callable[[T], R], item: T) -> Outcome[T, R]:
        self._pool = self._new_pool(1)
        try:
            return Outcome(item, self._pool.submit(fn, item).result())
        except Exception as exc:  # noqa: BLE001 - it killed its worker again: this task fails, not the job
            why = (
                "the worker process died (killed, e.g. out of memory)"
                if isinstance(exc, BrokenProcessPool)
                else _failure(exc)
            )
            return Outcome(item, error=f"worker process failed: {why}")
        finally:
            self.close()

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None


# A loaded machine can take longer than Ray's defaults (30 s) to start a node's processes.
_RAY_START_ENV = {"RAY_agent_register_timeout_ms": "180000", "RAY_raylet_start_wait_time_s": "180"}


def local_ray_options(workers: int | None = None) -> dict[str, Any]:
    """``ray.init`` keywords for a local Ray on this machine: small (``num_cpus=workers``, no
    dashboard) and with workers that import kinetoscope from where this driver does."""
    import kinetoscope

    for k, v in _RAY_START_ENV.items():
        os.environ.setdefault(k, v)  # read by the Ray processes ray.init starts
    root = os.path.dirname(os.path.dirname(os.path.abspath(kinetoscope.__file__)))
    path = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)
    return {
        "num_cpus": workers or default_workers(),
        "include_dashboard": False,
        "log_to_driver": False,
        "runtime_env": {"env_vars": {**_WORKER_ENV, "PYTHONPATH": path}},
    }


def _import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise UsageError(
            "--backend ray needs Ray, which is not installed: pip install 'kinetoscope[scale]'"
        ) from None
    return ray


@dataclass
class _Attempt(Generic[T]):
    """One Ray task in flight: its item, the node it was placed on (``None``: Ray's choice) and
    the nodes it was already lost on (kinetoscope resubmits it elsewhere, ``RAY_RESUBMITS`` times)."""

    item: T
    node: str | None
    lost_on: list[str] = field(default_factory=list)


class RayExecutor:
    """One Ray task per rank, on a cluster (``address``) or a local Ray started for the run.

    **Placement.** With two or more alive nodes that have a CPU, task ``i`` goes to CPU slot
    ``i mod slots`` (``cpu_slots``: the nodes, the driver's first, each once per CPU, interleaved)
    with a *soft* node affinity: it waits for that node while the node is alive, and only a dead
    node sends it elsewhere. Ray's ``SPREAD`` is best effort (every task of a clean two-node run
    once landed on the head); this is deterministic. One node: Ray's own scheduling, as before.

    **Lost tasks.** Ray reruns a task whose worker or node died (``max_retries``); a task lost
    in a way Ray does not rerun, or still lost after those retries (``lost``: its node, worker
    or result object, never an error of the function itself) is resubmitted by the driver on
    another alive node, ``RAY_RESUBMITS`` times; only then is it that task's error. The driver
    submits every task, so it owns every result (no result is owned by a worker of a node that
    can die), and fetches each to its own node as it finishes (``ray.wait``'s ``fetch_local``),
    then drops the reference so the object stores stay small.
    """

    def __init__(self, address: str | None = None, workers: int | None = None) -> None:
        self.ray = _import_ray()
        self._started = False
        self.notes: list[str] = []  # tasks resubmitted after they were lost (ScaleRun.notes)
        self._slots: list[str] | None = None
        if not self.ray.is_initialized():
            address = address or os.environ.get("RAY_ADDRESS") or None
            try:
                if address:
                    self.ray.init(
                        address=address, runtime_env={"env_vars": dict(_WORKER_ENV)}, log_to_driver=False
                    )
                else:
                    self.ray.init(**local_ray_options(workers))
            except Exception as exc:
                self.ray.shutdown()
                where = f"the Ray cluster at {address}" if address else "a local Ray"
                raise KinetoscopeError(
                    f"--backend ray: could not start {where}: {type(exc).__name__}: {exc}"
                ) from exc
            self._started = True

    def _cpu_nodes(self) -> list[dict[str, Any]]:
        """The alive nodes with at least one CPU (a map task needs one), the driver's first."""
        here = self.ray.get_runtime_context().get_node_id()
        nodes = [n for n in self.ray.nodes() if n.get("Alive") and n.get("Resources", {}).get("CPU", 0) >= 1]
        return sorted(nodes, key=lambda n: (n["NodeID"] != here, n["NodeID"]))

    def slots(self) -> list[str]:
        """The placement (``cpu_slots`` of the alive CPU nodes), fixed at the first call."""
        if self._slots is None:
            self._slots = cpu_slots(self._cpu_nodes())
        return self._slots

    def describe(self, n_tasks: int) -> str:
        """Which nodes the tasks go to, e.g. ``12 tasks round-robin over 2 Ray nodes: 2c828a09
        (this node) 6, 7f3e01bc 6``; one node: ``on 1 Ray node: 2c828a09``."""
        slots = self.slots()
        here = self.ray.get_runtime_context().get_node_id()
        names = {nid: nid[:8] + (" (this node)" if nid == here else "") for nid in slots}
        if not slots:
            return "no alive Ray node has a CPU yet: Ray places the tasks"
        if len(names) == 1:
            return f"on 1 Ray node: {next(iter(names.values()))}"
        count = Counter(slots[i % len(slots)] for i in range(n_tasks))
        placed = ", ".join(f"{names[nid]} {count[nid]}" for nid in dict.fromkeys(slots))
        return f"{n_tasks} tasks round-robin over {len(names)} Ray nodes: {placed}"

    def _submit(self, remote: Any, attempt: _Attempt[T]) -> Any:
        if attempt.node is None:  # one node: Ray's scheduling, as before placement existed
            return remote.options(scheduling_strategy="SPREAD").remote(attempt.item)
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        strategy = NodeAffinitySchedulingStrategy(attempt.node, soft=True)
        return remote.options(scheduling_strategy=strategy).remote(attempt.item)

    def map_unordered(self, fn: Callable[[T], R], items: Sequence[T]) -> Iterator[Outcome[T, R]]:
        remote = self.ray.remote(num_cpus=1, max_retries=RAY_TASK_RETRIES, retry_exceptions=False)(fn)
        slots = self.slots()
        placed = len(set(slots)) > 1
        pending = {}
        for i, it in enumerate(items):
            attempt = _Attempt(it, slots[i % len(slots)] if placed else None)
            pending[self._submit(remote, attempt)] = attempt
        resubmitted: list[str] = []
        while pending:
            done, _ = self.ray.wait(list(pending), num_returns=1)
            for ref in done:
                attempt = pending.pop(ref)  # the driver's copy is all that is kept: free the store's
                try:
                    yield Outcome(attempt.item, self.ray.get(ref))
                except self.ray.exceptions.RayError as exc:
                    retry = self._resubmit(remote, attempt, exc, placed)
                    if retry is None:
                        yield Outcome(attempt.item, error=f"Ray task failed: {ray_failure(self.ray, exc)}")
                    else:
                        pending[retry] = attempt
                        resubmitted.append(type(exc).__name__)
        if resubmitted:
            why = ", ".join(f"{k} x{v}" for k, v in Counter(resubmitted).items())
            where = " on another alive node" if placed else ""
            self.notes.append(f"{len(resubmitted)} Ray task(s) lost ({why}) and resubmitted{where}")

    def _resubmit(self, remote: Any, attempt: _Attempt[T], exc: BaseException, placed: bool) -> Any:
        """Resubmit a lost task on an alive node it was not lost on (any alive node when it was
        lost on all), or ``None`` when it is not lost (its function failed), was resubmitted
        ``RAY_RESUBMITS`` times already, or no node with a CPU is left."""
        if not lost(self.ray, exc) or len(attempt.lost_on) >= RAY_RESUBMITS:
            return None
        attempt.lost_on.append(attempt.node or "?")
        if placed:
            try:
                alive = list(dict.fromkeys(cpu_slots(self._cpu_nodes())))
            except Exception:  # noqa: BLE001 - the cluster is gone: this task's error is the loss itself
                return None
            if not alive:
                return None
            others = [nid for nid in alive if nid not in attempt.lost_on] or alive
            attempt.node = others[len(attempt.lost_on) % len(others)]
        return self._submit(remote, attempt)

    def close(self) -> None:
        if self._started:
            self.ray.shutdown()
            self._started = False


def cpu_slots(nodes: Sequence[dict[str, Any]]) -> list[str]:
    """Node ids, each once per CPU it has, interleaved (``[a, b, a]`` for ``a`` with 2 CPUs and
    ``b`` with 1): round-robin over these slots is round-robin over the nodes, weighted by CPUs."""
    cpus = {n["NodeID"]: int(n.get("Resources", {}).get("CPU", 0)) for n in nodes}
    return [nid for k in range(max(cpus.values(), default=0)) for nid, c in cpus.items() if c > k]


def ray_failure(ray: Any, exc: BaseException) -> str:
    """One line for a failed Ray task: the function's own error when it raised one (a
    ``RayTaskError``'s first line is only the task's name and pid), else Ray's."""
    cause = exc.cause if isinstance(exc, ray.exceptions.RayTaskError) else None
    line = _failure(cause if isinstance(cause, BaseException) else exc).splitlines()[0]
    return re.sub(r"\x1b\[[0-9;]*m", "", line)  # Ray colours the task name


def lost(ray: Any, exc: BaseException) -> bool:
    """Whether a Ray task failed with its worker, node or result object (worth rerunning
    elsewhere), not with an error of its own function (``RayTaskError`` of an ordinary exception,
    which would fail again)."""
    ex = ray.exceptions
    infra = (
        ex.WorkerCrashedError,
        ex.NodeDiedError,
        ex.ObjectLostError,  # OwnerDiedError, ObjectReconstructionFailedError, ObjectFetchTimedOutError
        ex.LocalRayletDiedError,
        ex.RaySystemError,
        ex.TaskUnschedulableError,
        ex.OutOfMemoryError,
        ex.RpcError,
    )
    if isinstance(exc, ex.RayTaskError):
        return isinstance(exc.cause, infra)
    return isinstance(exc, infra)


def make_executor(
    backend: str,
    *,
    workers: int | None = None,
    ray_address: str | None = None,
    steal: bool = False,
    preload: Sequence[str] = (),
) -> Executor:
    """The executor for a chosen backend (``choose_backend`` first for ``auto``); ``steal`` and
    ``preload``: ``LocalExecutor``'s."""
    if backend == "single":
        return InProcessExecutor()
    if backend == "local":
        return LocalExecutor(workers, steal=steal, preload=preload)
    if backend == "ray":
        return RayExecutor(ray_address, workers)
    raise UsageError(f"--backend: {backend!r} is not one of {', '.join(BACKENDS)}")
