"""The loading rules both trace loaders share: exact timestamps, value coercion, ids, one event.

Why a module of its own: the fast streaming loader (``decode``, ``tables``) and the slow
reference loader (``reference``) must apply the same rules, so the rules sit below both and
each imports them from here (no cycle). The rules themselves are described in
:mod:`kinetoscope.trace.reference` (the behavioural specification) and, for users, in
``docs/trace-loading.md``. :class:`RowBuilder` is the per-event implementation: the reference
loader's only loop body, and the fast loader's per-chunk fallback for events the typed decoder
rejects (odd types such as float pids or string timestamps).
"""

from __future__ import annotations

import math
import re
from collections import Counter
from decimal import Decimal, InvalidOperation
from typing import Any, cast

import msgspec
import polars as pl

from kinetoscope.trace.errors import TraceError
from kinetoscope.trace.schema import (
    ARG_COLUMNS,
    COUNTERS_SCHEMA,
    EVENTS_SCHEMA,
    FLOWS_SCHEMA,
    INSTANTS_SCHEMA,
)

INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1
# |ts| * 1000 must fit in int64
TS_LIMIT_US = INT64_MAX // 1000
TS_LIMIT_NS = TS_LIMIT_US * 1000  # |ns| <= this (the same range for integer and decimal input)

_INT_RE = re.compile(r"\s*[-+]?[0-9]+\s*\Z")


# ---------------------------------------------------------------------------------------------
# exact timestamps
# ---------------------------------------------------------------------------------------------
class ExactFloat(float):
    """A float decoded from JSON that keeps its literal text (``.text``), so that timestamps
    can be converted to nanoseconds exactly. Behaves as the float everywhere else."""

    __slots__ = ("text",)
    text: str

    def __new__(cls, text: str) -> ExactFloat:
        self = float.__new__(cls, text)
        self.text = text
        return self


def exact_float_hook(text: str) -> ExactFloat:
    """msgspec ``float_hook``: keep the text; reject what msgspec itself rejects (``1e400``)."""
    v = ExactFloat(text)
    if v in (math.inf, -math.inf):
        raise ValueError("Number out of range")
    return v


# Generic decoder whose floats remember their text (the reference's values, and the fast
# loader's fallback for odd chunks).
EXACT_DECODER = msgspec.json.Decoder(float_hook=exact_float_hook)
# JSON text of values that may hold ExactFloats (encoded as the plain float)
_JSON_ENCODER = msgspec.json.Encoder(enc_hook=float)


def exact_ns_text(text: str) -> int:
    """Decimal microseconds (JSON number text, or a numeric string) -> integer ns, exactly:
    value x 1000 rounded half to even. Raises ValueError (not a number) or OverflowError (not
    finite, or far outside int64; the caller checks the exact range)."""
    try:
        d = Decimal(text.strip())
    except InvalidOperation:
        raise ValueError(f"not a number: {text!r:.60}") from None
    if not d.is_finite():
        raise OverflowError(text)
    sign, digits, exp = d.as_tuple()
    e = exp + 3  # type: ignore[operator]
    if not any(digits):
        return 0
    if e >= 0:
        if len(digits) + e > 40:  # far beyond int64: do not build a huge integer
            raise OverflowError(text)
        n = int("".join(map(str, digits))) * 10**e
    elif len(digits) < -e:  # |value * 1000| < 0.1
        n = 0
    else:
        q, r = divmod(int("".join(map(str, digits))), 10**-e)
        half = 5 * 10 ** (-e - 1)
        n = q + (1 if r > half or (r == half and q & 1) else 0)
    result: int = -n if sign else n
    return result


CORE_EVENT_COLUMNS = ("idx", "kind", "cat", "name", "pid", "tid", "ts", "dur")
ARG_COLUMN_NAMES: tuple[str, ...] = tuple(c for c in EVENTS_SCHEMA if c not in CORE_EVENT_COLUMNS)
# column -> file keys, in priority order
ARG_KEYS_BY_COLUMN: dict[str, tuple[str, ...]] = {}
for _key, (_col, _dt) in ARG_COLUMNS.items():
    ARG_KEYS_BY_COLUMN[_col] = ARG_KEYS_BY_COLUMN.get(_col, ()) + (_key,)
INT_ARG_COLUMNS = frozenset(c for c in ARG_COLUMN_NAMES if EVENTS_SCHEMA[c] == pl.Int64())
FLOAT_ARG_COLUMNS = frozenset(c for c in ARG_COLUMN_NAMES if EVENTS_SCHEMA[c] == pl.Float64())
STR_ARG_COLUMNS = frozenset(c for c in ARG_COLUMN_NAMES if EVENTS_SCHEMA[c] == pl.String())

# instant-event args key -> column
INSTANT_ARG_KEYS: dict[str, str] = {
    "Device Type": "device_type",
    "Device Id": "device_id",
    "Addr": "addr",
    "Bytes": "bytes",
    "Total Allocated": "total_allocated",
    "Total Reserved": "total_reserved",
}

PROCESS_META_NAMES = ("process_name", "process_labels", "process_sort_index")
THREAD_META_NAMES = ("thread_name", "thread_sort_index")
# "M" events, long form: one row per metadata event (the fast loader's intermediate table)
META_ROWS_SCHEMA: dict[str, pl.DataType] = {
    "idx": pl.Int64(),
    "mname": pl.String(),
    "pid": pl.Int64(),
    "tid": pl.Int64(),
    "a_name": pl.String(),
    "a_labels": pl.String(),
    "a_sort_index": pl.Int64(),
}
PROFILER_RANGE_CAT = "cuda_profiler_range"  # its args are CUPTI counters (-> counters table)
LABELLED_PHASES = frozenset({"X", "s", "f", "t", "i", "I", "C", "M"})
FLOW_PHASES = ("s", "f", "t")


# ---------------------------------------------------------------------------------------------
# reading
# ---------------------------------------------------------------------------------------------
_NEST_TOKEN = re.compile(rb'["\\\[\]{}]')


def deepest_nesting(data: Any) -> tuple[int, int]:
    """(levels, offset): the deepest nesting of arrays/objects in JSON text ``data`` and where
    it is first reached (strings skipped). For errors only: a Python-level scan."""
    depth = best = at = 0
    in_str = False
    escaped = -1  # position of the character a backslash escapes
    for m in _NEST_TOKEN.finditer(data):
        if m.start() == escaped:
            continue
        ch = data[m.start()]
        if in_str:
            if ch == 0x5C:
                escaped = m.start() + 1
            elif ch == 0x22:
                in_str = False
        elif ch == 0x22:
            in_str = True
        elif ch in (0x5B, 0x7B):
            depth += 1
            if depth > best:
                best, at = depth, m.start()
        elif ch in (0x5D, 0x7D):
            depth -= 1
    return best, at


def nesting_error(path: str, data: Any, base: int = 0) -> TraceError:
    """The TraceError for JSON nested deeper than the decoder's recursion limit."""
    levels, at = deepest_nesting(data)
    return TraceError(path, f"JSON nested too deeply ({levels} levels of arrays/objects)", offset=base + at)


def plain(value: Any) -> Any:
    """``value`` with every :class:`ExactFloat` turned into a plain float (metadata)."""
    if type(value) is ExactFloat:
        return float(value)
    if isinstance(value, list):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    return value


def not_a_trace_hint(keys: Any) -> str:
    keys = set(keys)
    if "nodes" in keys or "schema" in keys and "pid" in keys:
        return " (looks like a PyTorch Execution Trace, not a Kineto trace)"
    if keys:
        shown = ", ".join(sorted(repr(k) for k in keys)[:6])
        return f" (top-level keys: {shown})"
    return " (empty object)"


def json_type_name(value: Any) -> str:
    """How an error message names the JSON type of ``value`` ("null", "a number", "an array"...)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "an object"


# ---------------------------------------------------------------------------------------------
# value coercion (shared by the fast loader)
# ---------------------------------------------------------------------------------------------
def ns_value(value: Any, path: str, index: int, fieldname: str) -> int:
    """Microseconds in the file -> integer nanoseconds (see module docstring)."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        got = "null" if value is None else type(value).__name__
        raise TraceError(path, f"{fieldname} must be a number, got {got}", event_index=index, field=fieldname)
    if isinstance(value, int):
        if -TS_LIMIT_US <= value <= TS_LIMIT_US:
            return value * 1000
        raise TraceError(
            path, f"{fieldname} is out of range: {value!r:.40}", event_index=index, field=fieldname
        )
    if isinstance(value, str):
        text = value
        if _INT_RE.match(text):
            return ns_value(int(text), path, index, fieldname)
    else:
        # the literal's text when decoded by EXACT_DECODER; else the float's shortest repr
        text = value.text if type(value) is ExactFloat else repr(float(value))
    try:
        ns = exact_ns_text(text)
    except OverflowError:
        ns = None
    except ValueError:
        raise TraceError(
            path, f"{fieldname} is not a number: {text!r:.60}", event_index=index, field=fieldname
        ) from None
    if ns is not None and -TS_LIMIT_NS <= ns <= TS_LIMIT_NS:
        return ns
    shown = value if isinstance(value, str) else float(value)
    raise TraceError(path, f"{fieldname} is out of range: {shown!r:.40}", event_index=index, field=fieldname)


def coerce_int(value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int):
        return value if INT64_MIN <= value <= INT64_MAX else None
    if isinstance(value, float):
        if math.isfinite(value):
            v = int(value)
            return v if INT64_MIN <= v <= INT64_MAX else None
        return None
    if isinstance(value, str) and _INT_RE.match(value):
        v = int(value)
        return v if INT64_MIN <= v <= INT64_MAX else None
    return None


def int_out_of_range(value: Any) -> bool:
    """True when ``value`` is an integer (or integer string) that int64 cannot hold."""
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return not INT64_MIN <= value <= INT64_MAX
    if isinstance(value, float) and math.isfinite(value):
        return not INT64_MIN <= int(value) <= INT64_MAX
    if isinstance(value, str) and _INT_RE.match(value):
        return not INT64_MIN <= int(value) <= INT64_MAX
    return False


def coerce_float(value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, (int, float)):
        try:
            v = float(value)
        except OverflowError:
            return None
        return v if math.isfinite(v) else None
    if isinstance(value, str):
        try:
            v = float(value)
        except ValueError:
            return None
        return v if math.isfinite(v) else None
    return None


def coerce_str(value: Any) -> str | None:
    """Strings as they are; other JSON values as compact JSON text (as ``msgspec.json.encode``
    writes it); null stays null."""
    if value is None:
        return None
    if isinstance(value, str):
        return value
    return _JSON_ENCODER.encode(value).decode()


class IdMap:
    """Maps pid/tid values (ints or strings) to int64; non-numeric strings get negative ids."""

    def __init__(self) -> None:
        self.labels: dict[str, int] = {}
        self.out_of_range = 0

    def __call__(self, value: Any) -> int | None:
        if value is None:
            return None
        if isinstance(value, bool):
            return int(value)
        if isinstance(value, int):
            if INT64_MIN <= value <= INT64_MAX:
                return value
            self.out_of_range += 1
            return None
        if isinstance(value, float):
            if math.isfinite(value) and INT64_MIN <= int(value) <= INT64_MAX:
                return int(value)
            self.out_of_range += 1
            return None
        text = value if isinstance(value, str) else cast(str, coerce_str(value))  # not None: checked above
        if _INT_RE.match(text):
            v = int(text)
            if INT64_MIN <= v <= INT64_MAX:
                return v
            self.out_of_range += 1
            return None
        got = self.labels.get(text)
        if got is None:
            got = self.labels[text] = -(len(self.labels) + 1)
        return got

    def register(self, value: Any) -> None:
        """Give ``value`` a label id now if it is a non-numeric string (first-appearance order)."""
        if value is None or isinstance(value, (bool, int, float)):
            return
        text = value if isinstance(value, str) else cast(str, coerce_str(value))  # not None: checked above
        if text not in self.labels and not _INT_RE.match(text):
            self.labels[text] = -(len(self.labels) + 1)


# ---------------------------------------------------------------------------------------------
# per-event row building
# ---------------------------------------------------------------------------------------------
class RowBuilder:
    """Turns decoded event objects into column lists, one event at a time (the specification).

    ``ids`` is shared across chunks so that labels keep one numbering for the whole file;
    ``warn`` counts out-of-range integers per column (for ``TraceMeta.warnings``).
    """

    def __init__(self, path: str, ids: IdMap, warn: Counter[str] | None = None) -> None:
        self.path = path
        self.ids = ids
        self.warn: Counter[str] = warn if warn is not None else Counter()
        self.events: dict[str, list[Any]] = {c: [] for c in EVENTS_SCHEMA if c != "kind"}
        self.flows: dict[str, list[Any]] = {c: [] for c in FLOWS_SCHEMA}
        self.counters: dict[str, list[Any]] = {c: [] for c in COUNTERS_SCHEMA}
        self.instants: dict[str, list[Any]] = {c: [] for c in INSTANTS_SCHEMA}
        self.meta_rows: dict[str, list[Any]] = {c: [] for c in META_ROWS_SCHEMA}

    def _int(self, value: Any, column: str) -> int | None:
        v = coerce_int(value)
        if v is None and int_out_of_range(value):
            self.warn[column] += 1
        return v

    def _range_counters(self, args: dict[str, Any], i: int, name: str, pid: int | None, ts: int) -> None:
        """CUPTI profiler counters of a ``cuda_profiler_range`` event -> counters rows."""
        for key, value in args.items():
            if isinstance(value, bool):
                value = int(value)
            elif not isinstance(value, (int, float)):
                continue
            self._counter_row(i, name, pid, ts, key, value)

    def _counter_row(self, i: int, name: Any, pid: Any, ts: Any, key: Any, value: Any) -> None:
        c = self.counters
        c["idx"].append(i)
        c["name"].append(name)
        c["pid"].append(pid)
        c["ts"].append(ts)
        c["key"].append(str(key))
        c["value"].append(coerce_float(value))

    def add(self, ev: Any, i: int) -> None:
        path = self.path
        if not isinstance(ev, dict):
            raise TraceError(path, f"event is {json_type_name(ev)}, not an object", event_index=i)
        ph = ev.get("ph")
        if type(ph) is not str or ph not in LABELLED_PHASES:
            return  # an unknown phase (or not even a string: a list is unhashable) is ignored
        ids = self.ids
        raw_pid, raw_tid = ev.get("pid"), ev.get("tid")
        ids.register(raw_pid)
        ids.register(raw_tid)
        if ph == "X":
            self._complete(ev, i, raw_pid, raw_tid)
        elif ph in FLOW_PHASES:
            self._flow(ev, i, ph, raw_pid, raw_tid)
        elif ph == "C":
            self._counter(ev, i, raw_pid)
        elif ph == "i" or ph == "I":
            self._instant(ev, i, raw_pid, raw_tid)
        else:  # "M"
            self._meta(ev, i, raw_pid, raw_tid)

    def _complete(self, ev: dict[str, Any], i: int, raw_pid: Any, raw_tid: Any) -> None:
        """An ``X`` event: one events row (its args in the typed columns)."""
        path, ids = self.path, self.ids
        name = ev.get("name")
        if not isinstance(name, str):
            raise TraceError(path, "complete event without a string 'name'", event_index=i, field="name")
        if "ts" not in ev:
            raise TraceError(path, "complete event without 'ts'", event_index=i, field="ts")
        if "dur" not in ev:
            raise TraceError(path, "complete event without 'dur'", event_index=i, field="dur")
        cat = ev.get("cat")
        cat = cat if isinstance(cat, str) else ("" if cat is None else coerce_str(cat))
        cols = self.events
        ts = ns_value(ev["ts"], path, i, "ts")
        dur = ns_value(ev["dur"], path, i, "dur")
        cols["idx"].append(i)
        cols["cat"].append(cat)
        cols["name"].append(name)
        cols["pid"].append(ids(raw_pid))
        cols["tid"].append(ids(raw_tid))
        cols["ts"].append(ts)
        cols["dur"].append(dur)
        args = ev.get("args")
        if not isinstance(args, dict):
            args = {}
        self._arg_columns(cols, args)
        if cat == PROFILER_RANGE_CAT and args:
            self._range_counters(args, i, name, ids(raw_pid), ts)

    def _arg_columns(self, cols: dict[str, list[Any]], args: dict[str, Any]) -> None:
        """Append one value to every args column: the first of its keys present with a value
        of the column's type (None when none is)."""
        for col in ARG_COLUMN_NAMES:
            value: int | float | str | None = None
            for key in ARG_KEYS_BY_COLUMN[col]:
                raw = args.get(key)
                if raw is None:
                    continue
                if col in INT_ARG_COLUMNS:
                    value = self._int(raw, col)
                elif col in FLOAT_ARG_COLUMNS:
                    value = coerce_float(raw)
                else:
                    value = coerce_str(raw)
                if value is not None:
                    break
            cols[col].append(value)

    def _flow(self, ev: dict[str, Any], i: int, ph: str, raw_pid: Any, raw_tid: Any) -> None:
        ids = self.ids
        f = self.flows
        f["idx"].append(i)
        f["ph"].append(ph)
        f["cat"].append(coerce_str(ev.get("cat")))
        f["name"].append(coerce_str(ev.get("name")))
        f["id"].append(self._int(ev.get("id"), "flow id"))
        f["pid"].append(ids(raw_pid))
        f["tid"].append(ids(raw_tid))
        f["ts"].append(ns_value(ev.get("ts", 0), self.path, i, "ts"))
        f["bp"].append(coerce_str(ev.get("bp")))

    def _counter(self, ev: dict[str, Any], i: int, raw_pid: Any) -> None:
        args = ev.get("args")
        if isinstance(args, dict):
            ts = ns_value(ev.get("ts", 0), self.path, i, "ts")
            name = coerce_str(ev.get("name"))
            pid = self.ids(raw_pid)
            for key, value in args.items():
                self._counter_row(i, name, pid, ts, key, value)

    def _instant(self, ev: dict[str, Any], i: int, raw_pid: Any, raw_tid: Any) -> None:
        ids = self.ids
        args = ev.get("args")
        if not isinstance(args, dict):
            args = {}
        n = self.instants
        n["idx"].append(i)
        n["cat"].append(coerce_str(ev.get("cat")))
        n["name"].append(coerce_str(ev.get("name")))
        n["pid"].append(ids(raw_pid))
        n["tid"].append(ids(raw_tid))
        n["ts"].append(ns_value(ev.get("ts", 0), self.path, i, "ts"))
        n["scope"].append(coerce_str(ev.get("s")))
        for key, col in INSTANT_ARG_KEYS.items():
            n[col].append(self._int(args.get(key), col))

    def _meta(self, ev: dict[str, Any], i: int, raw_pid: Any, raw_tid: Any) -> None:
        ids = self.ids
        args = ev.get("args")
        if not isinstance(args, dict):
            args = {}
        mname = ev.get("name")
        m = self.meta_rows
        m["idx"].append(i)
        m["mname"].append(mname if isinstance(mname, str) else None)
        m["pid"].append(ids(raw_pid))
        m["tid"].append(ids(raw_tid))
        m["a_name"].append(coerce_str(args.get("name")))
        m["a_labels"].append(coerce_str(args.get("labels")))
        m["a_sort_index"].append(self._int(args.get("sort_index"), "sort_index"))
