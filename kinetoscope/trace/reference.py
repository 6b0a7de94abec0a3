"""Reference loader: whole-file orjson decode, one Python pass per event. Correct and slow.

This is the behavioural specification of trace loading. The fast streaming loader
(``kinetoscope.trace.loader``) must produce identical tables; the tests use this module as the
oracle. Its per-event code (:class:`kinetoscope.trace.rules.RowBuilder`, with the value rules
this docstring states) lives in :mod:`kinetoscope.trace.rules`, below both loaders, because it is
also the fast loader's per-chunk fallback for events the typed decoder rejects (odd types such
as float pids or string timestamps).

Rules (documented for users in ``docs/trace-loading.md``):

* ``ts``/``dur`` are microseconds in the file, converted to integer nanoseconds **exactly from
  the decimal text**: an integer is multiplied by 1000; a fractional or exponent number
  (``1712171498123456.789``, ``1.5e3``) is its exact decimal value times 1000, rounded half to
  even at the nanosecond when it has more than 3 decimals (``0.0005`` -> 0, ``0.0015`` -> 2);
  never through a float64 (which cannot hold epoch-based ns timestamps exactly). A numeric string
  is read as a number by the same rule. Anything else, or a result outside int64, is a
  :class:`TraceError`. The document is decoded with :data:`EXACT_DECODER`, which keeps the text
  of every float literal (:class:`ExactFloat`).
* pid/tid: integers (and integer strings) are kept; other strings become stable negative ids
  (``TraceMeta.labels``), numbered in order of first appearance over the pid then tid of every
  ``X``/``s``/``f``/``t``/``i``/``I``/``C``/``M`` event. Integers outside int64 become null.
* ``cuda_profiler_range`` complete events (CUPTI profiler range mode) also give one
  ``counters`` row per numeric ``args`` value (the counter name is ``key``; booleans are 0/1;
  other values are skipped), in file order with the ``C`` events' rows.
* ``args`` values are coerced to the column dtype (``coerce_int``/``coerce_float``/
  ``coerce_str``); a value that cannot be coerced is null; integers outside int64 are null and
  counted in a warning (never wrapped). When two keys feed one column ("External id" and
  "external id"), the first key in ``ARG_COLUMNS`` order with a usable value wins.
"""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path
from typing import Any

import msgspec
import orjson
import polars as pl
from isal import igzip

from kinetoscope.trace.errors import TraceError
from kinetoscope.trace.model import Trace
from kinetoscope.trace.reader import open_trace_file
from kinetoscope.trace.rules import (
    EXACT_DECODER,
    PROCESS_META_NAMES,
    THREAD_META_NAMES,
    IdMap,
    RowBuilder,
    json_type_name,
    nesting_error,
    not_a_trace_hint,
    plain,
)
from kinetoscope.trace.schema import (
    COUNTERS_SCHEMA,
    EVENTS_SCHEMA,
    FLOWS_SCHEMA,
    INSTANTS_SCHEMA,
    PROCESSES_SCHEMA,
    THREADS_SCHEMA,
)
from kinetoscope.trace.tables import assemble_trace


# ---------------------------------------------------------------------------------------------
# reading
# ---------------------------------------------------------------------------------------------
def read_bytes(path: str | os.PathLike[str]) -> bytes:
    """Raw JSON bytes of a ``.json`` or ``.json.gz`` file (gzip detected by magic bytes)."""
    p = Path(path)
    try:
        with open_trace_file(str(p)) as fh:  # regular files only, never blocks on a FIFO
            head = fh.read(2)
            fh.seek(0)
            if head == b"\x1f\x8b":
                try:
                    with igzip.open(fh) as gz:  # type: ignore[no-untyped-call]  # isal ships no types
                        data: bytes = gz.read()
                except (OSError, EOFError, ValueError) as exc:
                    raise TraceError(str(p), f"corrupt or truncated gzip data: {exc}") from None
            else:
                data = fh.read()
    except FileNotFoundError:
        raise TraceError(str(p), "no such file") from None
    except IsADirectoryError:
        raise TraceError(str(p), "is a directory, not a trace file") from None
    except PermissionError:
        raise TraceError(str(p), "permission denied") from None
    if data.startswith(b"\xef\xbb\xbf"):  # UTF-8 byte order mark (Windows editors)
        data = data[3:]
    return data


def _decode(path: str, data: bytes) -> Any:
    """Validate with orjson (its error messages and offsets), then decode the values with
    :data:`EXACT_DECODER` (floats keep their text, for exact nanoseconds)."""
    if not data.strip():
        raise TraceError(path, "empty file")
    try:
        orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        if "recursion" in exc.msg:
            raise nesting_error(path, data) from None
        raise TraceError(path, f"invalid JSON: {exc.msg}", offset=exc.pos) from None
    try:
        return EXACT_DECODER.decode(data)
    except RecursionError:
        raise nesting_error(path, data) from None
    except msgspec.ValidationError as exc:
        raise TraceError(path, f"invalid value: {exc}") from None
    except msgspec.DecodeError as exc:  # pragma: no cover - orjson accepted it
        raise TraceError(path, f"invalid JSON: {exc}") from None


def parse_document(path: str, doc: Any) -> tuple[list[Any], dict[str, Any]]:
    """Split a decoded document into (traceEvents, top-level metadata)."""
    if isinstance(doc, list):  # legacy format: the file is the event array
        if doc and not isinstance(doc[0], dict):
            raise TraceError(
                path, "not a trace: a JSON array whose items are not event objects", event_index=0
            )
        return doc, {}
    if not isinstance(doc, dict):
        raise TraceError(path, f"not a trace: top-level JSON is {json_type_name(doc)}")
    if "traceEvents" not in doc:
        raise TraceError(path, "not a trace: no 'traceEvents' key" + not_a_trace_hint(doc.keys()))
    events = doc["traceEvents"]
    if not isinstance(events, list):
        raise TraceError(path, "'traceEvents' is not an array", field="traceEvents")
    meta = {k: plain(v) for k, v in doc.items() if k != "traceEvents"}
    return events, meta


def processes_and_threads(meta_rows: dict[str, list[Any]]) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Dict-based (reference) fold of "M" rows: last value wins per field; first appearance order."""
    processes: dict[Any, dict[str, Any]] = {}
    threads: dict[tuple[Any, Any], dict[str, Any]] = {}
    for mname, pid, tid, a_name, a_labels, a_sort in zip(
        meta_rows["mname"],
        meta_rows["pid"],
        meta_rows["tid"],
        meta_rows["a_name"],
        meta_rows["a_labels"],
        meta_rows["a_sort_index"],
    ):
        if mname in PROCESS_META_NAMES:
            p = processes.setdefault(pid, {"pid": pid, "name": None, "labels": None, "sort_index": None})
            if mname == "process_name":
                p["name"] = a_name
            elif mname == "process_labels":
                p["labels"] = a_labels
            else:
                p["sort_index"] = a_sort
        elif mname in THREAD_META_NAMES:
            t = threads.setdefault((pid, tid), {"pid": pid, "tid": tid, "name": None, "sort_index": None})
            if mname == "thread_name":
                t["name"] = a_name
            else:
                t["sort_index"] = a_sort
    procs = (
        pl.DataFrame(list(processes.values()), schema=PROCESSES_SCHEMA, orient="row")
        if processes
        else pl.DataFrame(schema=PROCESSES_SCHEMA)
    )
    thrs = (
        pl.DataFrame(list(threads.values()), schema=THREADS_SCHEMA, orient="row")
        if threads
        else pl.DataFrame(schema=THREADS_SCHEMA)
    )
    return procs, thrs


def load_trace_reference(path: str | os.PathLike[str]) -> Trace:
    """Load one trace file with the simple whole-file reference path (no cache, no salvage)."""
    spath = str(path)
    data = read_bytes(spath)
    doc = _decode(spath, data)
    try:
        events, top = parse_document(spath, doc)
    except RecursionError:
        raise nesting_error(spath, data) from None
    ids = IdMap()
    warn: Counter[str] = Counter()
    rb = RowBuilder(spath, ids, warn)
    for i, ev in enumerate(events):
        rb.add(ev, i)
    ev_cols = dict(rb.events)
    events_df = pl.DataFrame(
        ev_cols, schema={c: t for c, t in EVENTS_SCHEMA.items() if c != "kind"}, strict=True
    )
    procs, thrs = processes_and_threads(rb.meta_rows)
    return assemble_trace(
        spath,
        top,
        num_events=len(events),
        events=events_df,
        flows=pl.DataFrame(rb.flows, schema=FLOWS_SCHEMA, strict=True),
        counters=pl.DataFrame(rb.counters, schema=COUNTERS_SCHEMA, strict=True),
        instants=pl.DataFrame(rb.instants, schema=INSTANTS_SCHEMA, strict=True),
        processes=procs,
        threads=thrs,
        ids=ids,
        warn=warn,
    )
