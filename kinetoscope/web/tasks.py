"""Background work of ``kscope serve``: analysing a recorded trace request, and triggering a trace
on daemons (then waiting for the files, recording the request, optionally analysing it).

Tasks run in a few daemon worker threads (the analysis engine spends its time in Polars, which
releases the GIL); their state is a plain JSON object polled by the browser (``GET /api/tasks/{id}``).
"""

from __future__ import annotations

import itertools
import queue
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any
from urllib.parse import quote

from kinetoscope.errors import KinetoscopeError

MAX_TASKS = 200  # finished tasks kept in memory
MAX_LOG = 200


def _now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class Task:
    id: str
    kind: str  # analyze | trigger
    title: str
    state: str = "queued"  # queued | running | done | failed
    phase: str = "queued"
    message: str = ""
    created: str = field(default_factory=_now)
    updated: str = field(default_factory=_now)
    trace_id: str | None = None
    analysis_id: int | None = None
    log: list[str] = field(default_factory=list)
    files: list[dict[str, Any]] = field(default_factory=list)
    matched: list[dict[str, Any]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    params: dict[str, Any] = field(default_factory=dict)

    @property
    def finished(self) -> bool:
        return self.state in ("done", "failed")

    def to_json(self) -> dict[str, Any]:
        links: dict[str, str] = {"task": f"/tasks/{quote(self.id, safe='')}"}
        if self.trace_id:
            links["trace"] = f"/traces/{quote(self.trace_id, safe='')}"
        if self.analysis_id is not None:
            links["analysis"] = f"/analyses/{self.analysis_id}"
            links["report"] = f"/analyses/{self.analysis_id}/report"
        return {
            "id": self.id,
            "kind": self.kind,
            "title": self.title,
            "state": self.state,
            "phase": self.phase,
            "message": self.message,
            "finished": self.finished,
            "created": self.created,
            "updated": self.updated,
            "trace_id": self.trace_id,
            "analysis_id": self.analysis_id,
            "log": list(self.log),
            "files": list(self.files),
            "matched": list(self.matched),
            "errors": list(self.errors),
            "notes": list(self.notes),
            "params": dict(self.params),
            "links": links,
        }


class TaskManager:
    """A queue served by ``max_workers`` daemon threads: stopping the server (Ctrl-C) never waits
    for a running analysis or a trigger's wait; the work is abandoned (catalog writes are
    transactions, so nothing half-written is left)."""

    def __init__(self, max_workers: int = 2) -> None:
        self._queue: queue.Queue[tuple[Task, Callable[[Task], None]] | None] = queue.Queue()
        self._tasks: dict[str, Task] = {}
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._closed = False
        self._workers = [
            threading.Thread(target=self._worker, name=f"kscope-web-{i}", daemon=True)
            for i in range(max_workers)
        ]
        for w in self._workers:
            w.start()

    def _worker(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            self._run(*item)

    # -- state -------------------------------------------------------------------------------
    def get(self, task_id: str) -> Task | None:
        with self._lock:
            return self._tasks.get(task_id)

    def snapshot(self, task_id: str) -> dict[str, Any] | None:
        with self._lock:
            t = self._tasks.get(task_id)
            return t.to_json() if t else None

    def list(self) -> list[dict[str, Any]]:
        with self._lock:
            return [
                t.to_json()
                for t in sorted(self._tasks.values(), key=lambda t: int(t.id.split("-")[-1]), reverse=True)
            ]

    def update(
        self,
        task: Task,
        *,
        phase: str | None = None,
        message: str | None = None,
        log: str | None = None,
        **fields: Any,
    ) -> None:
        with self._lock:
            if phase is not None:
                task.phase = phase
            if message is not None:
                task.message = message
            if log:
                task.log.append(f"{_now()} {log}")
                del task.log[:-MAX_LOG]
            for k, v in fields.items():
                setattr(task, k, v)
            task.updated = _now()

    def running_for(self, kind: str, trace_id: str) -> Task | None:
        with self._lock:
            for t in self._tasks.values():
                if t.kind == kind and t.trace_id == trace_id and not t.finished:
                    return t
        return None

    # -- running -----------------------------------------------------------------------------
    def submit(
        self,
        kind: str,
        title: str,
        work: Callable[[Task], None],
        *,
        trace_id: str | None = None,
        params: dict[str, Any] | None = None,
    ) -> Task:
        if self._closed:
            raise KinetoscopeError("the server is shutting down")
        task = Task(
            id=f"{kind}-{next(self._ids)}",
            kind=kind,
            title=title,
            trace_id=trace_id,
            params=dict(params or {}),
        )
        with self._lock:
            self._tasks[task.id] = task
            done = [t for t in self._tasks.values() if t.finished]
            for old in sorted(done, key=lambda t: t.updated)[: max(0, len(self._tasks) - MAX_TASKS)]:
                self._tasks.pop(old.id, None)
        self._queue.put((task, work))
        return task

    def _run(self, task: Task, work: Callable[[Task], None]) -> None:
        t0 = time.monotonic()
        self.update(task, state="running", phase="starting", log="started")
        try:
            work(task)
        except KinetoscopeError as exc:
            self.update(task, state="failed", phase="failed", message=str(exc), log=f"failed: {exc}")
            return
        except Exception as exc:  # noqa: BLE001 - shown to the user, never kills the server
            self.update(
                task,
                state="failed",
                phase="failed",
                message=f"{type(exc).__name__}: {exc}",
                log="failed:\n" + traceback.format_exc(limit=8),
            )
            return
        if task.state != "failed":
            self.update(task, state="done", phase="done", log=f"done in {time.monotonic() - t0:.1f} s")

    def wait(self, task_id: str, timeout: float) -> Task | None:
        """For tests and the CLI: until the task finished (or ``timeout``)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            t = self.get(task_id)
            if t is None or t.finished:
                return t
            time.sleep(0.05)
        return self.get(task_id)

    def shutdown(self) -> None:
        self._closed = True
        for _ in self._workers:
            self._queue.put(None)
