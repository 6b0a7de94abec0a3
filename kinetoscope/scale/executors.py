"""Where the map step runs: a local process pool (default) or Ray tasks.

Both take the same module-level function and picklable tasks and yield results as they finish
(the driver puts them back in input order), so the reduce does not care which ran them.

* ``LocalExecutor(workers)``: ``concurrent.futures.ProcessPoolExecutor`` on a ``forkserver``
  (else ``spawn``) context: no fork of a driver holding threads and Polars state.
  ``workers=1`` runs in this process (no pool, easiest to debug).
* ``RayExecutor(address)``: one Ray task per rank. ``address`` (``--ray-address``, else
  ``$RAY_ADDRESS``) joins an existing cluster; without one a local Ray is started with
  ``num_cpus=workers`` and stopped at the end. Ray is imported only here.
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from typing import Any, Protocol, TypeVar

from kinetoscope.errors import KinetoscopeError, UsageError

T = TypeVar("T")
R = TypeVar("R")
BACKENDS = ("local", "ray")
# One trace per worker process: chunk-level parse workers inside a worker would oversubscribe.
_WORKER_ENV = {"KSCOPE_LOAD_WORKERS": "0"}


class Executor(Protocol):
    def map_unordered(self, fn: Callable[[T], R], items: Sequence[T]) -> Iterator[R]: ...
    def close(self) -> None: ...


def default_workers() -> int:
    return max(1, os.cpu_count() or 1)


def _init_worker() -> None:
    os.environ.update(_WORKER_ENV)


class LocalExecutor:
    """A process pool on this machine (``workers=1``: this process)."""

    def __init__(self, workers: int | None = None) -> None:
        self.workers = workers or default_workers()
        self._pool: ProcessPoolExecutor | None = None

    def map_unordered(self, fn: Callable[[T], R], items: Sequence[T]) -> Iterator[R]:
        if self.workers <= 1 or len(items) <= 1:
            yield from map(fn, items)
            return
        method = "forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else "spawn"
        self._pool = ProcessPoolExecutor(
            max_workers=min(self.workers, len(items)),
            mp_context=multiprocessing.get_context(method),
            initializer=_init_worker,
        )
        futures = [self._pool.submit(fn, it) for it in items]
        for fut in as_completed(futures):
            yield fut.result()

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


class RayExecutor:
    """One Ray task per rank, on a cluster (``address``) or a local Ray started for the run."""

    def __init__(self, address: str | None = None, workers: int | None = None) -> None:
        self.ray = _import_ray()
        self._started = False
        if not self.ray.is_initialized():
            address = address or os.environ.get("RAY_ADDRESS") or None
            try:
                if address:
                    self.ray.init(address=address, runtime_env={"env_vars": dict(_WORKER_ENV)}, log_to_driver=False)
                else:
                    self.ray.init(**local_ray_options(workers))
            except Exception as exc:  # noqa: BLE001 - Ray raises many types; the user needs the reason
                self.ray.shutdown()
                where = f"the Ray cluster at {address}" if address else "a local Ray"
                raise KinetoscopeError(f"--backend ray: could not start {where}: {type(exc).__name__}: {exc}") from exc
            self._started = True

    def map_unordered(self, fn: Callable[[T], R], items: Sequence[T]) -> Iterator[R]:
        remote = self.ray.remote(num_cpus=1, max_retries=1)(fn)
        pending = [remote.remote(it) for it in items]
        while pending:
            done, pending = self.ray.wait(pending, num_returns=1)
            for ref in done:
                try:
                    yield self.ray.get(ref)
                except self.ray.exceptions.RayError as exc:  # a worker died or the task failed outside map_rank
                    raise KinetoscopeError(f"--backend ray: a map task failed: {type(exc).__name__}: {exc}") from exc

    def close(self) -> None:
        if self._started:
            self.ray.shutdown()
            self._started = False


def make_executor(backend: str, *, workers: int | None = None, ray_address: str | None = None) -> Executor:
    if backend == "local":
        return LocalExecutor(workers)
    if backend == "ray":
        return RayExecutor(ray_address, workers)
    raise UsageError(f"--backend: {backend!r} is not one of {', '.join(BACKENDS)}")
