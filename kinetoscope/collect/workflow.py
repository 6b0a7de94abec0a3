"""One trace workflow: trigger -> record the request -> wait -> store -> record the result.

Why one module: ``kscope trace``, the web app's trigger task, the fleet autopilot and the demo all
run this sequence; written once here, a step added (or a catalog rule changed) reaches every one
of them. Callers choose the steps with a :class:`Delivery` and watch progress through typed
events (:data:`TraceEvent`), given to ``on_event`` as they happen; they render them (a Rich bar,
a task's state, the demo's spinner) but do not re-implement a step.

:meth:`TraceWorkflow.run` does the whole sequence; :meth:`~TraceWorkflow.trigger`,
:meth:`~TraceWorkflow.wait`, :meth:`~TraceWorkflow.store` and :meth:`~TraceWorkflow.record` are
its steps, for a caller that shows them apart (the demo) or starts from a trace it found again
(the autopilot passes a :class:`TraceResult` to ``run``, which then skips the trigger).
Nothing here raises for a per-host, store or catalog problem (they are ``result.errors`` and
``result.notes``) unless ``Delivery.raise_errors`` asks the catalog step to.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kinetoscope.collect.captured import CapturedCheck
from kinetoscope.collect.client import DEFAULT_TIMEOUT_S
from kinetoscope.collect.trigger import HostReply, TraceRequest, TraceResult, trigger_trace, wait_for_trace

if TYPE_CHECKING:
    from kinetoscope.store.catalog import Catalog, TraceRequestRecord
    from kinetoscope.store.storage import TraceStore

DEFAULT_WAIT_TIMEOUT_S = 120.0


# ---------------------------------------------------------------------------------------
# Events
# ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Triggering:
    """The daemons of ``request`` are about to be asked."""

    request: TraceRequest


@dataclass(frozen=True)
class HostAnswered:
    """One daemon answered or failed; ``phase``: ``list`` (the alignment listing) or ``trace``.
    Sent from the fan-out's worker threads: keep the handler cheap."""

    phase: str
    reply: HostReply


@dataclass(frozen=True)
class Triggered:
    """Every daemon answered: ``result`` holds the matched processes and their files."""

    result: TraceResult


@dataclass(frozen=True)
class Noted:
    """A line for the person: ``level`` ``note`` (information) or ``warning`` (a catalog
    recording failed: the trace itself is fine)."""

    level: str
    text: str


@dataclass(frozen=True)
class Waiting:
    """One status round of the wait: ``picked`` processes took the config, ``done`` files are
    complete, of ``total``."""

    result: TraceResult
    picked: int
    done: int
    total: int


@dataclass(frozen=True)
class Waited:
    """The wait ended (every file complete, settled, or the timeout)."""

    result: TraceResult


@dataclass(frozen=True)
class Storing:
    """The complete files are being uploaded to ``url``."""

    url: str


@dataclass(frozen=True)
class Recorded:
    """The request was recorded in the catalog (``record`` None: nothing to record, or it failed
    and a warning said why); ``final``: after the wait (else as soon as it was triggered)."""

    record: TraceRequestRecord | None
    final: bool


TraceEvent = Triggering | HostAnswered | Triggered | Noted | Waiting | Waited | Storing | Recorded
OnEvent = Callable[[TraceEvent], None]


# ---------------------------------------------------------------------------------------
# What to do after the trigger
# ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Delivery:
    """The steps after the trigger, and how each runs.

    * ``wait`` for the files, up to ``timeout_s`` (status polled every ``poll_interval_s``);
      ``write_manifest``: write ``manifest.json`` after the wait, ``manifest_on_trigger``: after
      the trigger too;
    * ``store``: upload the complete files here (URL, or ``trace_store`` already opened), with
      ``storage_options``; ``captured``: read back what the files hold (``collect.captured``);
    * ``catalog`` (URL or open :class:`~kinetoscope.store.catalog.Catalog`; None: the default
      catalog) and ``record``: record the request there; ``record_requested``: as soon as it is
      triggered too (status ``requested``); ``waiter``: this process waits (its identity goes
      with the ``requested`` row, and earlier requests whose waiter was killed are marked
      ``abandoned``); ``hash_local_files``: import the request folder with sizes and sha256 (a
      function of the waited result, or a fixed answer); ``raise_errors``: a catalog failure
      raises instead of becoming a warning;
    * ``strict``: store and record only a usable result (some file complete, no process exited,
      the upload whole) - the autopilot's rule; otherwise everything is delivered.
    """

    wait: bool = False
    timeout_s: float = DEFAULT_WAIT_TIMEOUT_S
    poll_interval_s: float = 0.5
    token: str | None = None
    rpc_timeout_s: float = DEFAULT_TIMEOUT_S
    write_manifest: bool = True
    manifest_on_trigger: bool = True
    store: str | None = None
    trace_store: TraceStore | None = None
    storage_options: Mapping[str, Any] | None = None
    captured: CapturedCheck | None = None
    record: bool = False
    record_requested: bool = False
    catalog: str | os.PathLike[str] | Catalog | None = None
    waiter: bool = False
    hash_local_files: bool | Callable[[TraceResult], bool] = False
    raise_errors: bool = False
    strict: bool = False


def usable(result: TraceResult) -> bool:
    """Some file complete and no traced process exited (what ``Delivery.strict`` delivers)."""
    return any(f.complete for f in result.files) and not any(e.kind == "exited" for e in result.errors)


# ---------------------------------------------------------------------------------------
# The workflow
# ---------------------------------------------------------------------------------------
class TraceWorkflow:
    """Runs one trace request through ``delivery``'s steps, telling ``on_event`` as it goes."""

    def __init__(self, delivery: Delivery | None = None, on_event: OnEvent | None = None) -> None:
        self.delivery = delivery or Delivery()
        self.on_event = on_event

    def emit(self, event: TraceEvent) -> None:
        if self.on_event is not None:
            self.on_event(event)

    def run(self, start: TraceRequest | TraceResult) -> TraceResult:
        """The whole sequence from a request (or from a trace already triggered)."""
        d = self.delivery
        result = self.trigger(start) if isinstance(start, TraceRequest) else start
        if d.store is not None:
            result.store_url = d.store
        if d.record and d.record_requested:
            self._record_requested(result)
        if not (d.wait and result.files):
            return result
        result = self.wait(result)
        if d.strict and not usable(result):
            return result
        if d.store is not None or d.trace_store is not None:
            self.store(result)
            if d.strict and any(e.kind == "store" for e in result.errors):
                return result
        if d.record:
            self.record(result, final=True)
        return result

    def trigger(self, request: TraceRequest) -> TraceResult:
        """Ask the daemons (``HostAnswered`` per host, then ``Triggered``)."""
        self.emit(Triggering(request))
        result = trigger_trace(
            request,
            token=self.delivery.token,
            rpc_timeout=self.delivery.rpc_timeout_s,
            write_manifest_file=self.delivery.manifest_on_trigger,
            on_answer=(lambda phase, hr: self.emit(HostAnswered(phase, hr))) if self.on_event else None,
        )
        self.emit(Triggered(result))
        return result

    def wait(self, result: TraceResult) -> TraceResult:
        """Wait for the files (``Waiting`` per status round, then ``Waited``)."""
        total = len(result.files)

        def progress(r: TraceResult) -> None:
            picked = sum(1 for f in r.files if f.delivered)
            self.emit(Waiting(r, picked, sum(1 for f in r.files if f.complete), total))

        progress(result)  # before the first status round: the wait has begun
        result = wait_for_trace(
            result,
            timeout=self.delivery.timeout_s,
            token=self.delivery.token,
            rpc_timeout=self.delivery.rpc_timeout_s,
            poll_interval=self.delivery.poll_interval_s,
            on_progress=progress if self.on_event else None,
            write_manifest_file=self.delivery.write_manifest,
        )
        if self.delivery.captured is not None:
            result.captured = self.delivery.captured(result).to_json()
        self.emit(Waited(result))
        return result

    def store(self, result: TraceResult) -> None:
        """Upload the complete files and the manifest (``Storing``); a failure is a ``store`` error."""
        from kinetoscope.collect.deliver import store_trace_result

        d = self.delivery
        target = d.trace_store or d.store
        if target is None or not result.files:
            return
        self.emit(Storing(str(d.store or result.store_url or "")))
        store_trace_result(result, target, storage_options=d.storage_options)

    def record(self, result: TraceResult, *, final: bool) -> TraceRequestRecord | None:
        """Record (upsert) the request in the catalog (``Recorded``); a failure is a ``warning``
        event (and a note in ``result.notes``) unless ``raise_errors``."""
        from kinetoscope.collect.deliver import record_trace_result

        d = self.delivery
        hashed = d.hash_local_files(result) if callable(d.hash_local_files) else d.hash_local_files
        before = len(result.notes)
        rec = record_trace_result(result, d.catalog, raise_errors=d.raise_errors, hash_local_files=hashed)
        for note in result.notes[before:]:
            self.emit(Noted("warning", note))
        self.emit(Recorded(rec, final))
        return rec

    def _record_requested(self, result: TraceResult) -> None:
        """The first record, as soon as the request is made (status ``requested``); a waiter
        first marks the requests whose earlier waiter was killed ``abandoned``."""
        if self.delivery.waiter:
            from kinetoscope.collect.deliver import waiter_info

            if self.delivery.wait:
                result.waiter = waiter_info()
            self._mark_abandoned(result)
        self.record(result, final=False)

    def _mark_abandoned(self, result: TraceResult) -> None:
        from kinetoscope.collect.deliver import mark_abandoned_requests

        if not result.files or not isinstance(self.delivery.catalog, (str, os.PathLike, type(None))):
            return
        marked = mark_abandoned_requests(self.delivery.catalog)
        if marked:
            note = (
                f"catalog: marked {len(marked)} earlier request(s) abandoned ({', '.join(marked)}): the "
                "`kscope trace` that waited for them was killed before it recorded their outcome; "
                "`kscope catalog import <dir>` records what their folders hold"
            )
            result.notes.append(note)
            self.emit(Noted("note", note))


def run_trace(
    start: TraceRequest | TraceResult, delivery: Delivery | None = None, on_event: OnEvent | None = None
) -> TraceResult:
    """:meth:`TraceWorkflow.run` in one call."""
    return TraceWorkflow(delivery, on_event).run(start)


__all__ = [
    "DEFAULT_WAIT_TIMEOUT_S",
    "Delivery",
    "HostAnswered",
    "Noted",
    "OnEvent",
    "Recorded",
    "Storing",
    "TraceEvent",
    "TraceWorkflow",
    "Triggered",
    "Triggering",
    "Waited",
    "Waiting",
    "run_trace",
    "usable",
]
