"""Decoded events -> typed Polars tables (per chunk), and the final assembly into a ``Trace``.

The fast path turns a chunk of typed structs into columns with C-level passes
(``map``/``compress``/``astuple``/``zip``) and builds one Polars frame per table per chunk;
Python never loops over events one by one. ``args`` are sparse: each event category (``cat``)
keeps the set of args fields seen so far, and a chunk only extracts those, verified by counting
the non-null fields of every args struct (when the counts differ the whole struct is transposed
once and the set is extended). Anything unusual in a chunk (a missing name or ``ts``, a
timestamp out of range, an odd type) sends that chunk to the reference code
(:class:`~kinetoscope.trace.rules.RowBuilder`), which either handles it or raises the
:class:`TraceError` naming the event.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from itertools import compress, repeat
from operator import attrgetter, is_, itemgetter
from typing import Any

import msgspec
import polars as pl
from msgspec import UNSET
from msgspec.structs import astuple

from kinetoscope.trace import decode as D
from kinetoscope.trace.compact import PROJECTED_TABLES, Columns, contiguous, kept_columns
from kinetoscope.trace.metadata import apply_location, infer_device_type
from kinetoscope.trace.model import Trace, TraceMeta
from kinetoscope.trace.rules import (
    INT64_MAX,
    INT64_MIN,
    META_ROWS_SCHEMA,
    PROCESS_META_NAMES,
    PROFILER_RANGE_CAT,
    THREAD_META_NAMES,
    TS_LIMIT_NS,
    TS_LIMIT_US,
    IdMap,
    RowBuilder,
    coerce_int,
    coerce_str,
    exact_ns_text,
    int_out_of_range,
)
from kinetoscope.trace.schema import (
    ARG_COLUMNS,
    CAT_TO_KIND,
    COUNTERS_SCHEMA,
    EVENTS_SCHEMA,
    FLOWS_SCHEMA,
    INSTANTS_SCHEMA,
    KIND,
    PROCESSES_SCHEMA,
    RUNTIME_KINDS,
    TABLE_SCHEMAS,
    THREADS_SCHEMA,
)

EVENTS_NO_KIND = {c: t for c, t in EVENTS_SCHEMA.items() if c != "kind"}
_N_XARGS = len(D.XARG_KEYS)
_LEARN_SAMPLE = 256
# |value * 1000| below this: a float64 timestamp is within 1/8 ns of the exact decimal value
# (two roundings of relative error 2**-53 each), so rounding it gives the exact answer unless
# it lies near a half nanosecond (only possible with more than 3 decimals): see _ns
_FLOAT_EXACT_NS = float(2**49)
_FLOAT_TIE_MARGIN = 0.375
_INSTANT_COLS = tuple(D.InstantArgs.__struct_fields__)


class _Slow(Exception):
    """This chunk needs the reference per-event path."""


class _NeedExact(Exception):
    """Float64 cannot give this chunk's timestamps exactly: decode them as text."""

    def __init__(self, dur: bool) -> None:
        super().__init__("dur" if dur else "ts")
        self.dur = dur


def _sub(
    evs: list[Any], tys: list[type], want: type | frozenset[type], first: int, total: int, count: int
) -> tuple[list[Any], pl.Series]:
    """(events, their indices as an Int64 Series) of one type (or set of types), in order."""
    if count == total:
        return evs, pl.int_range(first, first + total, dtype=pl.Int64, eager=True)
    mask = (
        list(map(want.__contains__, tys))
        if isinstance(want, frozenset)
        else list(map(is_, tys, repeat(want)))
    )
    idx = pl.Series(mask, dtype=pl.Boolean).arg_true().cast(pl.Int64)
    if first:
        idx = idx + first
    return list(compress(evs, mask)), idx


def _ns(vals: list[Any] | tuple[Any, ...], *, missing_zero: bool, dur: bool = False) -> pl.Series:
    """File microseconds -> int64 ns, exactly as ``rules.ns_value``. Raises _Slow (odd
    values: the reference path decides) or _NeedExact (float64 is not exact enough here).

    ``vals`` are the typed decoder's numbers, or ``msgspec.Raw`` texts (:func:`_ns_raw`).
    Missing values arrive as ``UNSET`` (Polars rejects them, so the common case never scans
    for them): they are 0 for flows/instants and an error for complete events."""
    if not vals:
        return pl.Series([], dtype=pl.Int64)
    v0 = vals[0]
    if type(v0) is msgspec.Raw:
        return _ns_raw(vals, missing_zero=missing_zero)
    if type(v0) is int:
        try:
            s = pl.Series(vals, dtype=pl.Int64)
        except (TypeError, OverflowError, ValueError):
            pass
        else:
            if s.null_count():
                raise _Slow
            if s.min() < -TS_LIMIT_US or s.max() > TS_LIMIT_US:  # type: ignore[operator]
                raise _Slow
            return s * 1000
    try:
        f = pl.Series(vals, dtype=pl.Float64)
    except (TypeError, OverflowError, ValueError):
        if missing_zero and any(v is UNSET for v in vals):
            return _ns([0 if v is UNSET else v for v in vals], missing_zero=False, dur=dur)
        raise _Slow from None
    if f.null_count():
        raise _Slow
    y = f * 1000.0
    r = y.round(0, mode="half_to_even")
    top, err = pl.select(top=y.abs().max(), err=(y - r).abs().max()).row(0)
    if top < _FLOAT_EXACT_NS and err < _FLOAT_TIE_MARGIN:
        ns: pl.Series = r.cast(pl.Int64)  # (polars types Series.cast as Any)
        return ns
    raise _NeedExact(dur)


def _float_is_exact(v: float) -> bool:
    """The float path gives ``v``'s exact ns (the test of :func:`_ns`, for one value)."""
    y = v * 1000.0
    return abs(y) < _FLOAT_EXACT_NS and abs(y - round(y)) < _FLOAT_TIE_MARGIN


def _ns_raw(raws: Any, *, missing_zero: bool) -> pl.Series:
    """``msgspec.Raw`` number texts -> int64 ns, exactly (vectorised; odd values one by one)."""
    from kinetoscope.trace.exactns import ns_from_texts, texts_blob  # (numpy: only when needed)

    got = ns_from_texts(texts_blob(raws), len(raws))
    if got is not None:
        return pl.Series(got)
    return pl.Series([_raw_ns(r, missing_zero) for r in raws], dtype=pl.Int64)


_NUMBER_START = frozenset(b"-0123456789")


def _raw_ns(raw: Any, missing_zero: bool) -> int:
    text = bytes(raw)
    if not text:
        if missing_zero:
            return 0
        raise _Slow  # a complete event without ts/dur: the reference raises
    if text[0] not in _NUMBER_START:
        raise _Slow  # a string, bool, null, ...: the reference decides
    try:
        ns = exact_ns_text(text.decode())
    except (ValueError, ArithmeticError):
        raise _Slow from None
    if not -TS_LIMIT_NS <= ns <= TS_LIMIT_NS:
        raise _Slow
    return ns


def _int_col(vals: Any, warn: Counter[str], column: str) -> pl.Series:
    """Python ints (or None) -> Int64; values outside int64 become null and are counted."""
    try:
        return pl.Series(vals, dtype=pl.Int64)
    except (TypeError, OverflowError, ValueError):
        pass
    out = []
    bad = 0
    for v in vals:
        if v is not None and not INT64_MIN <= v <= INT64_MAX:
            v = None
            bad += 1
        out.append(v)
    warn[column] += bad
    return pl.Series(out, dtype=pl.Int64)


_ENCODER = msgspec.json.Encoder()


def _str_col(vals: Any) -> pl.Series:
    """Strings as they are; lists/objects/numbers as compact JSON text (``coerce_str``).

    Vectorised: one C call encodes every value as a line of JSON, Polars splits the lines;
    only a column that mixes strings with other JSON values falls back to Python."""
    n = len(vals)
    if not n:
        return pl.Series([], dtype=pl.String)
    blob = _ENCODER.encode_lines(vals)
    lines = pl.Series([blob], dtype=pl.Binary).cast(pl.String).str.split("\n").explode().slice(0, n)
    frame = lines.to_frame("v")
    stats = frame.select(
        nulls=(pl.col("v") == "null").sum(), strs=pl.col("v").str.starts_with('"').sum()
    ).row(0)
    n_null, n_str = stats
    if n_str == 0:
        strs: pl.Series = frame.select(pl.when(pl.col("v") != "null").then(pl.col("v"))).to_series()
        return strs
    if n_str + n_null == n:
        return pl.Series(vals, dtype=pl.String)
    str_ = str
    return pl.Series([v if v is None or type(v) is str_ else coerce_str(v) for v in vals], dtype=pl.String)


def _opt_str_col(vals: Any) -> pl.Series:
    return pl.Series(vals, dtype=pl.String)


# ---- the typed fast path's tables, one chunk at a time ---------------------------------------
# A gatherer returns (columns, pids, tids) of one table's events in the chunk, or None when the
# chunk has none; a frame builder turns the columns into the table (ids resolved by the caller).
_Gathered = tuple[dict[str, Any], Sequence[Any], Sequence[Any]]


def _gather_x(
    evs: list[Any], tys: list[type], counts: dict[type, int], fam: D.Family, first: int
) -> _Gathered | None:
    n_x = counts.get(fam.X, 0)
    if not n_x:
        return None
    xs, xidx = _sub(evs, tys, fam.X, first, len(evs), n_x)
    cat, name, pid, tid, ts, dur, args = zip(*map(astuple, xs))
    if None in name:
        raise _Slow  # complete event without a name: the reference raises
    if PROFILER_RANGE_CAT in cat:
        raise _Slow  # CUPTI counters in args (-> counters rows): the reference path
    return {"idx": xidx, "cat": cat, "name": name, "ts": ts, "dur": dur, "args": args}, pid, tid


def _gather_flows(
    evs: list[Any], tys: list[type], counts: dict[type, int], fam: D.Family, first: int
) -> _Gathered | None:
    flow_set = frozenset(fam.flows)
    n_flow = sum(counts.get(t, 0) for t in flow_set)
    if not n_flow:
        return None
    fs, fidx = _sub(evs, tys, flow_set, first, len(evs), n_flow)
    fcat, fname, fid, fpid, ftid, fts, fbp = zip(*map(astuple, fs))
    flow_ph = dict(zip(fam.flows, ("s", "f", "t")))
    flows = {
        "idx": fidx,
        "ph": list(map(flow_ph.__getitem__, map(type, fs))),
        "cat": fcat,
        "name": fname,
        "id": fid,
        "ts": fts,
        "bp": fbp,
    }
    return flows, fpid, ftid


def _gather_instants(
    evs: list[Any], tys: list[type], counts: dict[type, int], fam: D.Family, first: int
) -> _Gathered | None:
    instant_set = frozenset(fam.instants)
    n_inst = sum(counts.get(t, 0) for t in instant_set)
    if not n_inst:
        return None
    ins, iidx = _sub(evs, tys, instant_set, first, len(evs), n_inst)
    iargs: Sequence[Any]
    icat, iname, ipid, itid, its, iscope, iargs = zip(*map(astuple, ins))
    return {"idx": iidx, "cat": icat, "name": iname, "ts": its, "scope": iscope, "args": iargs}, ipid, itid


def _gather_meta(
    evs: list[Any], tys: list[type], counts: dict[type, int], fam: D.Family, first: int
) -> _Gathered | None:
    n_meta = counts.get(D.Meta, 0)
    if not n_meta:
        return None
    ms, midx = _sub(evs, tys, D.Meta, first, len(evs), n_meta)
    margs: Sequence[Any]
    mname, mpid, mtid, margs = zip(*map(astuple, ms))
    return {"idx": midx, "mname": mname, "args": margs}, mpid, mtid


def _flow_frame(flows: dict[str, Any], id_series: dict[str, pl.Series], warn: Counter[str]) -> pl.DataFrame:
    return pl.DataFrame(
        {
            "idx": flows["idx"].alias("idx"),
            "ph": pl.Series(flows["ph"], dtype=pl.String),
            "cat": _opt_str_col(flows["cat"]),
            "name": _opt_str_col(flows["name"]),
            "id": _int_col(flows["id"], warn, "flow id"),
            "pid": id_series["f.pid"],
            "tid": id_series["f.tid"],
            "ts": _ns(flows["ts"], missing_zero=True),
            "bp": _opt_str_col(flows["bp"]),
        },
    )


def _instant_frame(inst: dict[str, Any], id_series: dict[str, pl.Series], warn: Counter[str]) -> pl.DataFrame:
    iargs = inst["args"]
    if None in iargs:
        iargs = [D.EMPTY_INSTANT_ARGS if a is None else a for a in iargs]
    acols = list(zip(*map(astuple, iargs)))
    data = {
        "idx": inst["idx"].alias("idx"),
        "cat": _opt_str_col(inst["cat"]),
        "name": _opt_str_col(inst["name"]),
        "pid": id_series["i.pid"],
        "tid": id_series["i.tid"],
        "ts": _ns(inst["ts"], missing_zero=True),
        "scope": _opt_str_col(inst["scope"]),
    }
    for col, vals in zip(_INSTANT_COLS, acols):
        data[col] = _int_col(vals, warn, col)
    return pl.DataFrame(data)


def _meta_frame(meta: dict[str, Any], id_series: dict[str, pl.Series], warn: Counter[str]) -> pl.DataFrame:
    margs = meta["args"]
    if None in margs:
        margs = [D.EMPTY_META_ARGS if a is None else a for a in margs]
    a_name, a_labels, a_sort = zip(*map(astuple, margs))
    return pl.DataFrame(
        {
            "idx": meta["idx"].alias("idx"),
            "mname": _opt_str_col(meta["mname"]),
            "pid": id_series["m.pid"],
            "tid": id_series["m.tid"],
            "a_name": _opt_str_col(a_name),
            "a_labels": _opt_str_col(a_labels),
            "a_sort_index": _int_col(a_sort, warn, "sort_index"),
        }
    )


def _arg_columns(df: pl.DataFrame) -> pl.DataFrame:
    """args keys -> columns (coalescing keys that feed one column, in ARG_COLUMNS order)."""
    out: dict[str, pl.Expr] = {}
    for key in D.XARG_KEYS:
        if key not in df.columns:
            continue
        out_col = ARG_COLUMNS[key][0]
        out[out_col] = pl.coalesce(out[out_col], pl.col(key)) if out_col in out else pl.col(key)
    return df.select([e.alias(c) for c, e in out.items()])


class TableBuilder:
    """Accumulates per-chunk frames for one file; :meth:`finish` concatenates them."""

    def __init__(self, path: str, columns: Columns | None = None) -> None:
        self.path = path
        self.columns = columns  # trace.compact.Columns: keep only these (None: everything)
        self.ids = IdMap()
        self.warn: Counter[str] = Counter()
        self.events: list[pl.DataFrame] = []
        self.flows: list[pl.DataFrame] = []
        self.counters: list[pl.DataFrame] = []
        self.instants: list[pl.DataFrame] = []
        self.meta_rows: list[pl.DataFrame] = []
        # per cat: indices of XArgs fields seen so far (adaptive sparse extraction)
        self.arg_fields: dict[str | None, set[int]] = {}
        self.n_events = 0
        self.slow_chunks = 0
        self.exact_chunks = 0  # chunks decoded again for exact timestamps

    # ---- public -------------------------------------------------------------------------
    def add(self, chunk: Any) -> None:
        """One chunk of events: decoded here (DecodedChunk) or built by a worker (BuiltChunk).
        With ``columns``, the chunk's frames keep only those columns from the start."""
        if self.columns is None:
            self._add(chunk)
            return
        before = {name: len(getattr(self, name)) for name in PROJECTED_TABLES}
        self._add(chunk)
        for name, n in before.items():
            frames: list[pl.DataFrame] = getattr(self, name)
            keep = kept_columns(name, self.columns)
            if keep is None:
                del frames[n:]
                continue
            for i in range(n, len(frames)):
                frames[i] = _project_chunk(frames[i], keep)

    def _add(self, chunk: Any) -> None:
        if not isinstance(chunk, D.DecodedChunk):
            return self.add_built(chunk)
        self.n_events = chunk.first_index + len(chunk.events)
        if chunk.typed:
            events, fam = chunk.events, chunk.family
            while True:
                try:
                    self._add_typed(events, chunk.first_index, fam, chunk.redecode)
                    return
                except _NeedExact as need:
                    new = D.EXACT_ALL if (need.dur or fam.raw_ts) else D.EXACT_TS
                    assert new is not fam
                    events, fam = chunk.redecode(new.decoder, copy=True), new
                    self.exact_chunks += 1
                    if new is D.EXACT_TS and chunk.source is not None:
                        # this file's timestamps need their text: decode them so from now on
                        chunk.source.family = D.EXACT_TS
                except _Slow:
                    break
            events = chunk.redecode(D.EXACT_GENERIC_DECODER)
        else:
            events = chunk.events
        self.slow_chunks += 1
        self._add_generic(events, chunk.first_index)

    def reset_chunk(self) -> None:
        """Forget the tables and labels built so far but keep what was learnt about the
        file's args (a worker process builds each chunk on its own)."""
        self.ids = IdMap()
        self.warn = Counter()
        self.events, self.flows, self.counters, self.instants, self.meta_rows = [], [], [], [], []
        self.slow_chunks = 0
        self.exact_chunks = 0

    def add_built(self, b: Any) -> None:
        """A worker's frames for one chunk (:class:`kinetoscope.trace.parallel.BuiltChunk`):
        shift the chunk-local event indices and map the chunk-local pid/tid labels to this
        file's numbering (first appearance order), then link them like local frames."""
        first = b.first_index
        self.n_events = first + b.n_events
        labels = self.ids.labels
        remap: dict[int, int] = {}
        for text, local in b.labels:
            got = labels.get(text)
            if got is None:
                got = labels[text] = -(len(labels) + 1)
            if got != local:
                remap[local] = got
        self.ids.out_of_range += b.out_of_range
        self.warn.update(b.warn)
        self.slow_chunks += b.slow
        self.exact_chunks += b.exact
        for name, df in b.frames.items():
            exprs = []
            if first:
                exprs.append(pl.col("idx") + first)
            if remap:
                exprs += [pl.col(c).replace(remap) for c in ("pid", "tid") if c in df.columns]
            if exprs:
                df = df.with_columns(exprs)
            getattr(self, name).append(df)

    # ---- slow path ----------------------------------------------------------------------
    def _add_generic(self, events: list[Any], first: int) -> None:
        rb = RowBuilder(self.path, self.ids, self.warn)
        for i, ev in enumerate(events, first):
            rb.add(ev, i)
        if rb.events["idx"]:
            self.events.append(pl.DataFrame(rb.events, schema=EVENTS_NO_KIND))
        if rb.flows["idx"]:
            self.flows.append(pl.DataFrame(rb.flows, schema=FLOWS_SCHEMA))
        if rb.counters["idx"]:
            self.counters.append(pl.DataFrame(rb.counters, schema=COUNTERS_SCHEMA))
        if rb.instants["idx"]:
            self.instants.append(pl.DataFrame(rb.instants, schema=INSTANTS_SCHEMA))
        if rb.meta_rows["idx"]:
            self.meta_rows.append(pl.DataFrame(rb.meta_rows, schema=META_ROWS_SCHEMA))

    # ---- fast path ----------------------------------------------------------------------
    def _add_typed(self, evs: list[Any], first: int, fam: D.Family, redecode: Any) -> None:
        n = len(evs)
        if not n:
            return
        tys = list(map(type, evs))
        counts = {t: tys.count(t) for t in set(tys)}
        # committed only if the whole chunk succeeds: a chunk that falls back (_Slow) or is
        # decoded again (_NeedExact) is counted once, by the attempt that succeeds
        warn: Counter[str] = Counter()
        # one table's columns (name -> values or Series), absent when the chunk has no such events
        gathered: dict[str, dict[str, Any]] = {}
        pending_ids: list[tuple[str, Any]] = []  # (table.col, raw id list)
        for key, gather in (
            ("x", _gather_x),
            ("f", _gather_flows),
            ("i", _gather_instants),
            ("m", _gather_meta),
        ):
            got = gather(evs, tys, counts, fam, first)
            if got is not None:
                gathered[key], pid, tid = got
                pending_ids += [(f"{key}.pid", pid), (f"{key}.tid", tid)]
        n_counter = counts.get(D.Counter, 0)
        id_series, ids_out_of_range = self._id_series(evs, tys, counts, fam, pending_ids, n_counter)

        # build frames (nothing is committed until every table of the chunk is built)
        frames: dict[str, pl.DataFrame] = {}
        if "x" in gathered:
            frames["events"] = self._x_frame(gathered["x"], id_series, warn)
        if "f" in gathered:
            frames["flows"] = _flow_frame(gathered["f"], id_series, warn)
        if "i" in gathered:
            frames["instants"] = _instant_frame(gathered["i"], id_series, warn)
        if "m" in gathered:
            frames["meta"] = _meta_frame(gathered["m"], id_series, warn)
        counters = None
        if n_counter:
            counters = self._counter_frame(evs, tys, first, n_counter, warn, redecode)

        # commit
        self.warn.update(warn)
        self.ids.out_of_range += ids_out_of_range
        for name, table in (("events", self.events), ("flows", self.flows), ("instants", self.instants)):
            if name in frames:
                table.append(frames[name])
        if "meta" in frames:
            self.meta_rows.append(frames["meta"])
        if counters is not None:
            self.counters.append(counters)

    def _id_series(
        self,
        evs: list[Any],
        tys: list[type],
        counts: dict[type, int],
        fam: D.Family,
        pending_ids: list[tuple[str, Any]],
        n_counter: int,
    ) -> tuple[dict[str, pl.Series], int]:
        """pid/tid columns by ``table.col``: ints pass straight through; strings need labels in
        file order. Also how many ids did not fit in int64 (committed with the chunk)."""
        id_series: dict[str, pl.Series] = {}
        failed: list[tuple[str, Any]] = []
        for key, vals in pending_ids:
            try:
                id_series[key] = pl.Series(vals, dtype=pl.Int64)
            except (TypeError, OverflowError, ValueError):
                failed.append((key, vals))
        if failed or n_counter:
            self._register_labels(evs, tys, failed, counts, fam)
        out_of_range = 0
        for key, vals in failed:
            id_series[key], bad = self._map_ids(vals)
            out_of_range += bad
        return id_series, out_of_range

    def _x_frame(
        self, x: dict[str, Any], id_series: dict[str, pl.Series], warn: Counter[str]
    ) -> pl.DataFrame:
        """The events table of the chunk's complete events, args columns included."""
        cat_s = pl.Series("cat", x["cat"], dtype=pl.String)
        if cat_s.null_count():
            cat_s = cat_s.fill_null("")
        cols = {
            "idx": x["idx"].alias("idx"),
            "cat": cat_s,
            "name": pl.Series("name", x["name"], dtype=pl.String),
            "pid": id_series["x.pid"].alias("pid"),
            "tid": id_series["x.tid"].alias("tid"),
            "ts": _ns(x["ts"], missing_zero=False).alias("ts"),
            "dur": _ns(x["dur"], missing_zero=False, dur=True).alias("dur"),
        }
        df = pl.DataFrame(cols)
        argdf = self._x_args(x["args"], cat_s, warn)
        if argdf is not None:
            df = pl.concat([df, argdf], how="horizontal")
        return df

    def _counter_frame(
        self, evs: list[Any], tys: list[type], first: int, n_counter: int, warn: Counter[str], redecode: Any
    ) -> pl.DataFrame | None:
        """The counters rows of the chunk, through the reference rules (``RowBuilder``); decoded
        again when a timestamp needs its text."""
        cs, cidx = _sub(evs, tys, D.Counter, first, len(evs), n_counter)
        rb = RowBuilder(self.path, self.ids, warn)
        rows = []
        inexact = False
        for ev in cs:
            d = {"ph": "C", "name": ev.name, "pid": ev.pid, "tid": ev.tid, "args": ev.args}
            ts = ev.ts
            if ts is not UNSET:
                d["ts"] = ts
                if type(ts) is float and not _float_is_exact(ts):
                    inexact = True
            rows.append(d)
        positions = cidx.to_list()
        if inexact:  # the counters' timestamps need their text: decode this chunk again
            again = redecode(D.EXACT_GENERIC_DECODER)
            rows = [again[i - first] for i in positions]
        for i, d in zip(positions, rows):
            rb.add(d, i)
        return pl.DataFrame(rb.counters, schema=COUNTERS_SCHEMA) if rb.counters["idx"] else None

    def _register_labels(
        self,
        evs: list[Any],
        tys: list[type],
        failed: list[tuple[str, Any]],
        counts: dict[type, int],
        fam: D.Family,
    ) -> None:
        """Give new string pids/tids their label ids in file order (pid, then tid, per event)."""
        labels = self.ids.labels
        new = False
        for _key, vals in failed:
            for v in set(vals):
                if type(v) is str and v not in labels:
                    new = True
                    break
            if new:
                break
        if not new and not counts.get(D.Counter, 0):
            return
        register = self.ids.register
        labelled = fam.labelled
        for e, t in zip(evs, tys):
            if t in labelled:
                register(e.pid)
                register(e.tid)

    def _map_ids(self, vals: Any) -> tuple[pl.Series, int]:
        """pid/tid values -> Int64 ids, and how many did not fit in int64 (not yet added to
        ``self.ids.out_of_range``: the caller commits the count with its chunk)."""
        ids = self.ids
        mapping: dict[Any, Any] = {}
        bad = 0
        for v in set(vals):
            if type(v) is str and not int_out_of_range(v):
                mapping[v] = ids(v)
            elif (type(v) is int or type(v) is str) and int_out_of_range(v):
                mapping[v] = None
                bad += vals.count(v)
        return pl.Series(list(map(mapping.get, vals, vals)), dtype=pl.Int64), bad

    def _x_args(self, args: tuple[Any, ...], cat_s: pl.Series, warn: Counter[str]) -> pl.DataFrame | None:
        """Columns of the args fields present in this chunk, in event order."""
        if None in args:
            args = tuple(D.EMPTY_XARGS if a is None else a for a in args)
        groups = cat_s.to_frame().with_row_index("__i").group_by("cat", maintain_order=True).agg("__i").rows()
        parts: list[pl.DataFrame] = []
        for cat, positions in groups:
            if len(groups) == 1:
                sub = args
            elif len(positions) == 1:
                sub = (args[positions[0]],)
            else:
                sub = itemgetter(*positions)(args)
            series = self._category_args(cat, sub, warn)
            if not series:
                continue
            data: dict[str, pl.Series] = {"__i": pl.Series(positions, dtype=pl.UInt32)}
            for fi in sorted(series):
                data[D.XARG_KEYS[fi]] = series[fi]
            parts.append(pl.DataFrame(data))
        if not parts:
            return None
        if len(parts) == 1 and len(groups) == 1:
            df = parts[0]
        else:
            df = pl.concat(parts, how="diagonal").sort("__i")
            n = len(cat_s)
            if len(df) != n:  # some categories had no args at all: re-align by position
                df = pl.DataFrame({"__i": pl.arange(0, n, dtype=pl.UInt32, eager=True)}).join(
                    df, on="__i", how="left"
                )
        return _arg_columns(df)

    def _category_args(self, cat: str, sub: tuple[Any, ...], warn: Counter[str]) -> dict[int, pl.Series]:
        """The present args fields (field index -> column) of one category's events ``sub``:
        the fields known for the category, unless the encoded text holds more keys than they
        found (then every field)."""
        m = len(sub)
        known = self.arg_fields.get(cat)
        if known is None:  # first sight of this category: learn its fields from a sample
            sample = list(map(astuple, sub[:_LEARN_SAMPLE]))
            known = self.arg_fields[cat] = {
                fi for fi, col in enumerate(zip(*sample)) if col.count(None) != len(col)
            }
        # how many fields are present in total: every present field is one '"key":' in the
        # compact encoding (omit_defaults); text inside values can only add to the count
        total = _ENCODER.encode(sub).count(b'":')
        series: dict[int, pl.Series] = {}
        got = 0
        w1: Counter[str] = Counter()
        if known:
            if len(known) <= 3:
                cols = {fi: list(map(attrgetter(D.XARG_FIELDS[fi]), sub)) for fi in known}
            else:
                tups = list(map(astuple, sub))
                cols = {fi: list(map(itemgetter(fi), tups)) for fi in known}
            for fi in sorted(cols):
                s = self._arg_series(fi, cols[fi], w1)
                nn = m - s.null_count()
                if nn:
                    series[fi] = s
                    got += nn
        if got == total:
            warn.update(w1)
            return series
        # a field not seen before in this category (or odd text): all of them
        series = {}
        for fi, col in enumerate(zip(*map(astuple, sub))):
            if col.count(None) != m:
                series[fi] = self._arg_series(fi, col, warn)
                known.add(fi)
        return series

    def _arg_series(self, fi: int, vals: Any, warn: Counter[str]) -> pl.Series:
        key = D.XARG_KEYS[fi]
        col = D.XARG_COLUMNS[fi]
        dtype = EVENTS_SCHEMA[col]
        if dtype == pl.Int64():
            return _int_col(vals, warn, col)
        if dtype == pl.Float64():
            return pl.Series(vals, dtype=pl.Float64)
        del key
        return _str_col(vals)

    # ---- finish -------------------------------------------------------------------------
    def finish(self) -> dict[str, pl.DataFrame]:
        meta_rows = _concat(self.meta_rows, META_ROWS_SCHEMA)
        procs, thrs = processes_and_threads_polars(meta_rows)
        out = {name: self._table(name) for name in PROJECTED_TABLES}
        return {**out, "processes": procs, "threads": thrs}

    def _table(self, name: str) -> pl.DataFrame:
        """One table from its chunks (a dropped table: no columns, see ``trace.compact``)."""
        keep = kept_columns(name, self.columns)
        if keep is None:
            return pl.DataFrame()
        schema = TABLE_SCHEMAS[name]
        return _concat(getattr(self, name), {c: schema[c] for c in keep})


def _concat(frames: list[pl.DataFrame], schema: dict[str, pl.DataType]) -> pl.DataFrame:
    """Per-chunk frames -> one table in ``schema`` order. Each frame is first given the full
    schema (missing columns as nulls), so the concatenation only links the chunks' buffers
    instead of copying them; then the columns are made contiguous one at a time
    (:func:`~kinetoscope.trace.compact.contiguous`): peak memory stays at one copy of the tables
    plus one column, and later eager filters do not copy the whole table."""
    if not frames:
        return pl.DataFrame(schema=schema)
    full = []
    for df in frames:
        cols = [
            (
                _KIND_EXPR
                if c == "kind" and "cat" in df.columns
                else pl.col(c).cast(t)
                if c in df.columns
                else pl.lit(None, dtype=t).alias(c)
            )
            for c, t in schema.items()
        ]
        full.append(df.select(cols))
    frames.clear()
    if len(full) == 1:
        return full[0]
    linked = [pl.concat(full, how="vertical", rechunk=False)]
    full.clear()  # the chunks' buffers are now held by the linked frame alone,
    return contiguous(linked.pop())  # which ``contiguous`` owns (its old columns are freed)


def _project_chunk(df: pl.DataFrame, keep: list[str]) -> pl.DataFrame:
    """One chunk's frame with only the ``keep`` columns it has; an events frame gets its
    ``kind`` from ``cat`` first (``cat`` itself may not be kept)."""
    if "kind" in keep and "kind" not in df.columns and "cat" in df.columns:
        df = df.with_columns(_KIND_EXPR)
    return df.select([c for c in df.columns if c in keep])


def processes_and_threads_polars(meta_rows: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Vectorised fold of "M" rows (same result as ``reference.processes_and_threads``)."""
    m = pl.col("mname")
    procs = (
        meta_rows.filter(m.is_in(list(PROCESS_META_NAMES)))
        .group_by("pid", maintain_order=True)
        .agg(
            pl.col("a_name").filter(m == "process_name").last().alias("name"),
            pl.col("a_labels").filter(m == "process_labels").last().alias("labels"),
            pl.col("a_sort_index").filter(m == "process_sort_index").last().alias("sort_index"),
        )
        .select(list(PROCESSES_SCHEMA))
        .cast(PROCESSES_SCHEMA)  # type: ignore[arg-type]
    )
    thrs = (
        meta_rows.filter(m.is_in(list(THREAD_META_NAMES)))
        .group_by("pid", "tid", maintain_order=True)
        .agg(
            pl.col("a_name").filter(m == "thread_name").last().alias("name"),
            pl.col("a_sort_index").filter(m == "thread_sort_index").last().alias("sort_index"),
        )
        .select(list(THREADS_SCHEMA))
        .cast(THREADS_SCHEMA)  # type: ignore[arg-type]
    )
    return procs, thrs


# ---------------------------------------------------------------------------------------------
# assembly (shared by the reference and the fast loader)
# ---------------------------------------------------------------------------------------------
_TOP_KEYS_HANDLED = (
    "distributedInfo",
    "deviceProperties",
    "baseTimeNanoseconds",
    "schemaVersion",
    "trace_id",
)


def content_meta(
    path: str,
    top: dict[str, Any],
    *,
    num_events: int,
    events: pl.DataFrame,
    ids: IdMap,
    warn: Counter[str],
    extra_warnings: list[str] | None = None,
) -> TraceMeta:
    """The part of TraceMeta that depends only on the file's content (cacheable)."""
    dist = top.get("distributedInfo")
    dist = dist if isinstance(dist, dict) else {}
    kinds = set(events.get_column("kind").unique().cast(pl.String).to_list()) if len(events) else set()
    runtime_names = (
        set(
            events.select(pl.col("name").filter(pl.col("kind").is_in(list(RUNTIME_KINDS))).unique())
            .get_column("name")
            .to_list()
        )
        if len(events)
        else set()
    )
    props = top.get("deviceProperties")
    warnings: list[str] = list(extra_warnings or [])
    for column, count in sorted(warn.items()):
        if count:
            warnings.append(f"{count} value(s) of {column} do not fit in int64 and were stored as null")
    if ids.out_of_range:
        warnings.append(f"{ids.out_of_range} pid/tid value(s) do not fit in int64 and were stored as null")
    host = top.get("host_name")
    return TraceMeta(
        path=path,
        world_size=None,
        hostname=host if isinstance(host, str) else None,
        trace_id=coerce_str(top.get("trace_id")),
        device_type=infer_device_type(dist, kinds, runtime_names),
        device_properties=[d for d in props if isinstance(d, dict)] if isinstance(props, list) else [],
        distributed_info=dict(dist),
        base_time_ns=coerce_int(top.get("baseTimeNanoseconds")),
        schema_version=coerce_int(top.get("schemaVersion")),
        num_trace_events=num_events,
        labels=dict(ids.labels),
        extra={k: v for k, v in top.items() if k not in _TOP_KEYS_HANDLED},
        warnings=warnings,
    )


_KIND_EXPR = pl.col("cat").replace_strict(CAT_TO_KIND, default="other", return_dtype=KIND).alias("kind")


def clamp_negative_durations(events: pl.DataFrame) -> tuple[pl.DataFrame, str | None]:
    """Complete events with a negative ``dur`` get ``dur`` 0, and a warning naming the first.

    A negative duration is never real (an event cannot end before it starts; seen in traces
    whose clocks were adjusted mid-run): the event's start is kept, so analyses still see it,
    but it covers no time rather than undoing other events' time in sums."""
    bad = events.filter(pl.col("dur") < 0)
    if bad.height == 0:
        return events, None
    first = bad.row(0, named=True)
    msg = (
        f"{bad.height} complete event(s) have a negative dur and were given dur 0 (first: "
        f"traceEvents[{first['idx']}] {first['name']!r}, dur {first['dur'] / 1000:g} us)"
    )
    return events.with_columns(pl.when(pl.col("dur") < 0).then(0).otherwise(pl.col("dur")).alias("dur")), msg


def add_kind(events: pl.DataFrame) -> pl.DataFrame:
    """The ``kind`` column from ``cat`` (a no-op when the chunks already carry it)."""
    if "kind" in events.columns:
        return events
    return events.select([_KIND_EXPR if c == "kind" else pl.col(c) for c in EVENTS_SCHEMA])


def assemble_trace(
    path: str,
    top: dict[str, Any],
    *,
    num_events: int,
    events: pl.DataFrame,
    flows: pl.DataFrame,
    counters: pl.DataFrame,
    instants: pl.DataFrame,
    processes: pl.DataFrame,
    threads: pl.DataFrame,
    ids: IdMap,
    warn: Counter[str],
    extra_warnings: list[str] | None = None,
    locate: bool = True,
) -> Trace:
    """Typed tables + metadata -> Trace (rank resolved from the file's location too)."""
    events, negative = clamp_negative_durations(add_kind(events))
    meta = content_meta(
        path,
        top,
        num_events=num_events,
        events=events,
        ids=ids,
        warn=warn,
        extra_warnings=list(extra_warnings or []) + ([negative] if negative else []),
    )
    if locate:
        apply_location(meta, path)
    return Trace(
        meta=meta,
        events=events,
        flows=flows,
        counters=counters,
        instants=instants,
        processes=processes,
        threads=threads,
    )
