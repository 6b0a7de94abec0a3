"""msgspec structs for trace events, and the streaming splitter of the ``traceEvents`` array.

Events are decoded with a tagged union on ``ph``: each phase gets a small ``gc=False`` Struct
holding only the fields the tables need, so unknown keys (call stacks, module hierarchies, ...)
are skipped in C. A chunk whose events do not fit these types (a float pid, a string ``ts``, an
unknown phase) raises ``msgspec.ValidationError`` and is re-decoded generically and handled by
the reference per-event code (:class:`kinetoscope.trace.reference.RowBuilder`).

:class:`EventStream` reads decompressed blocks, parses the top-level object (metadata before and
after the array is decoded with msgspec), and cuts the ``traceEvents`` array into chunks at
candidate event boundaries (``}`` ``,`` ``{`` with optional whitespace). A boundary inside a
string or a nested object always leaves the chunk's last event unclosed, so the chunk fails to
decode; the chunk is then extended to a later boundary. Memory stays bounded by the chunk size.
The native decoder (:mod:`kinetoscope.trace._native`) is tried on each chunk first; when it
gives up (anything unusual, errors included) the chunk is decoded here, as before.
"""

from __future__ import annotations

import re
from collections.abc import Generator, Iterator
from dataclasses import dataclass, field
from typing import Any, cast

import msgspec
from msgspec import UNSET, UnsetType

from kinetoscope.protocol.structinfo import prime_structs
from kinetoscope.trace import _native
from kinetoscope.trace._native import NativeChunk
from kinetoscope.trace.errors import TraceError
from kinetoscope.trace.limits import MAX_KEY_BYTES, Limits, fmt_size
from kinetoscope.trace.reader import BlockReader
from kinetoscope.trace.rules import (
    EXACT_DECODER,
    FLOAT_ARG_COLUMNS,
    INSTANT_ARG_KEYS,
    INT_ARG_COLUMNS,
    nesting_error,
    not_a_trace_hint,
)
from kinetoscope.trace.schema import ARG_COLUMNS

# ---------------------------------------------------------------------------------------------
# structs
# ---------------------------------------------------------------------------------------------
Id = int | str | None
Num = int | float | UnsetType


def _ident(key: str) -> str:
    return "k_" + "".join(ch if ch.isalnum() else "_" for ch in key)


# One field per args key that feeds an events column (ARG_COLUMNS order).
XARG_KEYS: tuple[str, ...] = tuple(ARG_COLUMNS)
XARG_COLUMNS: tuple[str, ...] = tuple(ARG_COLUMNS[k][0] for k in XARG_KEYS)


def _xarg_type(key: str) -> Any:
    col = ARG_COLUMNS[key][0]
    if col in INT_ARG_COLUMNS:
        return int | None
    if col in FLOAT_ARG_COLUMNS:
        return float | None
    return Any  # strings as they are, lists/objects become JSON text


XArgs = msgspec.defstruct(
    "XArgs",
    [(_ident(k), _xarg_type(k), msgspec.field(default=None, name=k)) for k in XARG_KEYS],
    gc=False,
    frozen=True,
    omit_defaults=True,  # encoding lists only the fields present (used to count them)
)
XARG_FIELDS: tuple[str, ...] = XArgs.__struct_fields__
EMPTY_XARGS = XArgs()

InstantArgs = msgspec.defstruct(
    "InstantArgs",
    [(col, int | None, msgspec.field(default=None, name=key)) for key, col in INSTANT_ARG_KEYS.items()],
    gc=False,
    frozen=True,
)
EMPTY_INSTANT_ARGS = InstantArgs()


class MetaArgs(msgspec.Struct, gc=False, frozen=True):
    name: str | None = None
    labels: str | None = None
    sort_index: int | None = None


EMPTY_META_ARGS = MetaArgs()


class _Event(msgspec.Struct, gc=False, tag_field="ph"):
    pass


# A missing ``ts``/``dur`` decoded as Raw (an empty text; never valid JSON, so never ambiguous).
MISSING_RAW = msgspec.Raw(b"")


class Counter(_Event, tag="C"):
    name: Any = None
    pid: Id = None
    tid: Id = None
    ts: Any = UNSET  # a float that is not exact is read again as text (rare events)
    args: Any = None


class Meta(_Event, tag="M"):
    name: str | None = None
    pid: Id = None
    tid: Id = None
    args: MetaArgs | None = EMPTY_META_ARGS


# Chrome trace phases the tables do not use: decoded as empty structs (fields skipped in C).
IGNORED_PHASES = (
    "B",
    "E",
    "b",
    "e",
    "n",
    "S",
    "T",
    "p",
    "F",
    "P",
    "N",
    "O",
    "D",
    "R",
    "c",
    "(",
    ")",
    "v",
    "V",
)
IGNORED_TYPES = tuple(
    msgspec.defstruct(f"Ignored_{i}", [], bases=(_Event,), tag=ph) for i, ph in enumerate(IGNORED_PHASES)
)


@dataclass(frozen=True)
class Family:
    """The typed structs of one decoder. Timestamps are numbers (``Num``: the fast float path,
    exact when the magnitudes allow it) or ``msgspec.Raw`` (the literal's text, converted to ns
    exactly by :func:`kinetoscope.trace.tables.ns_from_raw`). Field order is the same in every
    family, so the table builder is the same."""

    name: str
    X: type
    flows: tuple[type, type, type]  # s, f, t
    instants: tuple[type, type]  # i, I
    decoder: msgspec.json.Decoder[list[Any]]
    raw_ts: bool
    raw_dur: bool

    @property
    def labelled(self) -> frozenset[type]:
        return frozenset((self.X, *self.flows, *self.instants, Counter, Meta))


def _family(
    name: str,
    raw_ts: bool,
    raw_dur: bool,
    flows: tuple[type, type, type] | None = None,
    instants: tuple[type, type] | None = None,
) -> Family:
    def tstype(raw: bool) -> tuple[Any, Any]:
        return (msgspec.Raw, MISSING_RAW) if raw else (Num, UNSET)

    ts_t, ts_d = tstype(raw_ts)
    dur_t, dur_d = tstype(raw_dur)
    X = msgspec.defstruct(
        f"XEvent{name}",
        [
            ("cat", str | None, None),
            ("name", str | None, None),
            ("pid", Id, None),
            ("tid", Id, None),
            ("ts", ts_t, ts_d),
            ("dur", dur_t, dur_d),
            ("args", XArgs | None, EMPTY_XARGS),
        ],
        bases=(_Event,),
        tag="X",
    )
    if flows is None:
        fields = [
            ("cat", str | None, None),
            ("name", str | None, None),
            ("id", int | None, None),
            ("pid", Id, None),
            ("tid", Id, None),
            ("ts", ts_t, ts_d),
            ("bp", str | None, None),
        ]
        flows = cast(
            "tuple[type, type, type]",
            tuple(
                msgspec.defstruct(f"Flow{ph}{name}", fields, bases=(_Event,), tag=ph)
                for ph in ("s", "f", "t")
            ),
        )
    if instants is None:
        fields = [
            ("cat", str | None, None),
            ("name", str | None, None),
            ("pid", Id, None),
            ("tid", Id, None),
            ("ts", ts_t, ts_d),
            ("s", str | None, None),
            ("args", InstantArgs | None, EMPTY_INSTANT_ARGS),
        ]
        instants = cast(
            "tuple[type, type]",
            tuple(
                msgspec.defstruct(f"Instant{ph}{name}", fields, bases=(_Event,), tag=ph) for ph in ("i", "I")
            ),
        )
    union: Any = X
    for t in (*flows, *instants, Counter, Meta, *IGNORED_TYPES):
        union = union | t
    return Family(name, X, flows, instants, msgspec.json.Decoder(list[union]), raw_ts, raw_dur)


FLOAT = _family("", raw_ts=False, raw_dur=False)
EXACT_TS = _family("ExactTs", raw_ts=True, raw_dur=False)
EXACT_ALL = _family("ExactAll", raw_ts=True, raw_dur=True, flows=EXACT_TS.flows, instants=EXACT_TS.instants)
FAMILIES = (FLOAT, EXACT_TS, EXACT_ALL)
FAMILY_OF: dict[type, Family] = {}
for _f in FAMILIES:
    FAMILY_OF.setdefault(_f.X, _f)

# backwards-compatible names (the float family)
XEvent = FLOAT.X
FlowStart, FlowEnd, FlowStep = FLOAT.flows
Instant, InstantGlobal = FLOAT.instants
FLOW_TYPES = FLOAT.flows
INSTANT_TYPES = FLOAT.instants
LABELLED_TYPES = FLOAT.labelled
TYPED_DECODER = FLOAT.decoder
GENERIC_DECODER = msgspec.json.Decoder()  # top-level metadata (plain floats)
# odd chunks, decoded generically for the reference RowBuilder: floats keep their text
EXACT_GENERIC_DECODER = EXACT_DECODER


# ---------------------------------------------------------------------------------------------
# streaming splitter
# ---------------------------------------------------------------------------------------------
_BYTE_RE = re.compile(r"\(byte (\d+)\)")
_PATH_INDEX_RE = re.compile(r"at `\$\[(\d+)\]")
_BOUNDARY = re.compile(rb"\}[ \t\r\n]*,[ \t\r\n]*\{")
_SALVAGE_END = re.compile(rb"\}[ \t\r\n]*(?:,|\Z)")
_WS = b" \t\r\n"
_WS_COMMA = b" \t\r\n,"
# what may follow the start of a boundary match that began before a search window (then '{')
_WS_COMMA_RUN = re.compile(rb"[ \t\r\n,]*")
_SCALAR_END = re.compile(rb"[ \t\r\n,}\]]")
SEP_MAX_WS = 64  # whitespace kept in the preferred separator (self.sep)
_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)
_SPECIAL = re.compile(rb'["\\\[\]{}]')
_QUOTE = re.compile(rb'["\\]')

# a ts with >= 12 integer digits and a fraction (epoch-based microseconds with ns decimals):
# float64 cannot hold it exactly, so such a file's chunks are decoded with Raw timestamps from
# the start instead of being decoded twice (a guess from the first bytes of each chunk; the
# table builder checks every value anyway and decodes a chunk again when the guess was wrong)
_EPOCH_TS = re.compile(rb'"ts"[ \t\r\n]*:[ \t\r\n]*-?[0-9]{12,}\.')
EPOCH_SNIFF_BYTES = 1 << 16


def _next_in_string(buf: bytearray, p: int, n: int) -> int:
    """Index of the next '"' or backslash at or after ``p`` (-1: none), by ``find`` (memchr)."""
    q = buf.find(b'"', p, n)
    b = buf.find(b"\\", p, n if q < 0 else q)
    return b if b >= 0 else q


def _next_special(buf: bytearray, p: int) -> int:
    m = _SPECIAL.search(buf, p)
    return -1 if m is None else m.start()


def _skip_ws(buf: bytearray, p: int) -> int:
    """Index of the first non-whitespace byte of ``buf`` at or after ``p`` (``len(buf)`` if
    none). C-speed ``lstrip`` over windows that grow, so a short gap costs little and a long
    run is skipped at memory speed (a regex character class is ~100x slower)."""
    n = len(buf)
    window = 64
    while p < n:
        seg = buf[p : p + window]
        rest = seg.lstrip(_WS)
        if rest:
            return p + len(seg) - len(rest)
        p += len(seg)
        window = min(window * 16, 1 << 22)
    return n


def sniff_family(view: Any, family: Family) -> Family:
    """EXACT_TS when ``family`` is FLOAT and the chunk's first bytes show epoch-based decimal
    timestamps (see _EPOCH_TS), else ``family``."""
    if family is FLOAT and _EPOCH_TS.search(view[:EPOCH_SNIFF_BYTES]):
        return EXACT_TS
    return family


CHUNK_BYTES = 4 << 20  # decoded per step; bounds memory, amortises per-chunk overhead
META_VALUE_LIMIT = 64 << 20  # a top-level value larger than this is skipped, not decoded


def error_byte(exc: Exception) -> int | None:
    m = _BYTE_RE.search(str(exc))
    return int(m.group(1)) if m else None


def error_event_index(exc: Exception) -> int | None:
    m = _PATH_INDEX_RE.search(str(exc))
    return int(m.group(1)) if m else None


def _clean(exc: Exception) -> str:
    text = _BYTE_RE.sub("", str(exc)).strip()
    prefix = "JSON is malformed: "
    return text[len(prefix) :] if text.startswith(prefix) else text


@dataclass
class DecodedChunk:
    """Decoded events ``traceEvents[first_index : first_index + len(events)]``.

    ``typed``: the events are :data:`EventUnion` structs (fast path); otherwise they are plain
    Python objects from a generic decode, for :class:`~kinetoscope.trace.reference.RowBuilder`.
    """

    events: list[Any]
    first_index: int
    typed: bool
    offset: int  # absolute offset of the chunk's first byte in the decompressed stream
    family: Family = FLOAT  # the structs of ``events`` when typed
    # how to decode the same bytes again (another family, or generically): the source and the
    # absolute span [lo, hi) of the JSON array text; ``patch``: the byte that held ']' at
    # decode time (it was restored afterwards), or None. Valid until the next chunk is read.
    source: Any = None
    lo: int = 0
    hi: int = 0
    patch: int | None = None

    def redecode(self, decoder: msgspec.json.Decoder[Any], *, copy: bool = False) -> list[Any]:
        """The same events decoded by ``decoder`` (raises TraceError like the first decode).
        ``copy``: decode a copy of the bytes (needed when the result holds ``msgspec.Raw``
        values, which keep their source buffer exported)."""
        events: list[Any] = self.source.redecode(self, decoder, copy=copy)
        return events


# A chunk decoded here: by the Python path (events) or the native decoder (frames).
Chunk = DecodedChunk | NativeChunk


@dataclass
class StreamState:
    top: dict[str, Any] = field(default_factory=dict)
    legacy: bool = False
    saw_events: bool = False
    salvaged: str | None = None  # salvage: why loading stopped early (None: complete file)
    warnings: list[str] = field(default_factory=list)


class _Split(Exception):
    """A candidate boundary was not a real event boundary."""


class EventStream:
    """Parses one decompressed trace document, yielding :class:`DecodedChunk` s of
    ``traceEvents`` and collecting the other top-level keys in ``state.top``."""

    def __init__(
        self,
        path: str,
        reader: BlockReader,
        *,
        salvage: bool = False,
        chunk_bytes: int = CHUNK_BYTES,
        pool: Any = None,
        limits: Limits | None = None,
    ) -> None:
        self.path = path
        self.reader = reader
        self.limits = limits or getattr(reader, "limits", None) or Limits.from_env()
        self.salvage = salvage
        self.chunk_bytes = chunk_bytes
        self.buf = bytearray()
        self.base = 0  # absolute offset of buf[0]
        self.pos = 0
        self.eof = False
        self.state = StreamState()
        self.n_events = 0  # events yielded so far
        self.stopped = False  # salvage: nothing more to read
        self.family = FLOAT  # typed structs for the next chunks (the table builder may switch)
        self.pool = pool  # parallel.ChunkPool: workers decode the chunks (None: all here)
        self.sep = b""  # the likely separator between events (see _last_boundary)
        self.native = _native.decode if _native.enabled() else None  # C decoder of whole chunks

    # ---- buffer -------------------------------------------------------------------------
    def _more(self) -> bool:
        """Append one more block; False at the end of the data."""
        if self.eof:
            return False
        block = self.reader.read_block()
        if not block:
            self.eof = True
            return False
        self.buf += block
        return True

    def _fill(self, upto: int) -> None:
        """Read until ``len(buf) >= upto`` or the end of the data."""
        while len(self.buf) < upto and self._more():
            pass

    def _compact(self, keep_from: int) -> int:
        """Drop consumed bytes before ``keep_from - 1``; returns the shift applied to indices."""
        cut = keep_from - 1
        if cut > (1 << 20) and cut > len(self.buf) // 4:
            del self.buf[:cut]
            self.base += cut
            self.pos -= cut
            return cut
        return 0

    def _peek(self) -> int | None:
        """Skip whitespace; the next byte (not consumed), or None at the end of the data.
        Linear in the whitespace skipped, and skipped bytes are dropped from the buffer; a run
        longer than the single-value limit is an error (a decompression bomb of blanks)."""
        run_from = self.base + self.pos
        while True:
            p = _skip_ws(self.buf, self.pos)
            self.pos = p
            if self.base + p - run_from > self.limits.max_value_bytes:
                raise TraceError(
                    self.path,
                    f"more than {fmt_size(self.limits.max_value_bytes)} of whitespace: "
                    f"over {self.limits.value_hint()}",
                    offset=run_from,
                )
            if p < len(self.buf):
                return self.buf[p]
            self._compact(p)
            if not self._more():
                return None

    def _error(self, problem: str, offset: int | None = None, **kw: Any) -> TraceError:
        return TraceError(self.path, problem, offset=self.base + self.pos if offset is None else offset, **kw)

    def _end_offset(self) -> int:
        return self.base + len(self.buf)

    def _truncated(self, where: str) -> TraceError:
        why = self.reader.problem
        return TraceError(
            self.path,
            f"file ends unexpectedly {where} (truncated?{' ' + why if why else ''})",
            offset=self._end_offset(),
        )

    def _stop(self, why: str) -> None:
        """Salvage: stop reading; what was yielded so far is the result."""
        if self.state.salvaged is None:
            self.state.salvaged = why
        self.stopped = True

    # ---- document -----------------------------------------------------------------------
    def chunks(self) -> Iterator[Chunk]:
        c = self._peek()
        if c is None:
            if self.reader.problem:
                raise self._truncated("before any JSON")
            raise TraceError(self.path, "empty file", offset=0)
        if self.buf.startswith(b"\xef\xbb\xbf") and self.pos == 0:
            self.pos = 3  # UTF-8 byte order mark
            c = self._peek()
            if c is None:
                raise TraceError(self.path, "empty file", offset=0)
        if c == 0x5B:  # '[': legacy format, the file is the event array
            self.state.legacy = True
            self.state.saw_events = True
            self.pos += 1
            yield from self._events()
            if not self.stopped:
                self._expect_end()
            return
        if c != 0x7B:
            raise self._error(f"not a trace: top-level JSON is {self._describe()}")
        self.pos += 1
        yield from self._object()

    def _describe(self) -> str:
        ch = chr(self.buf[self.pos])
        if ch == '"':
            return "a string"
        if ch in "-0123456789":
            return "a number"
        if ch in "tf":
            return "a boolean"
        if ch == "n":
            return "null"
        return f"not JSON (starts with {ch!r})"

    def _object(self) -> Iterator[Chunk]:
        first = True
        while True:
            c = self._peek()
            if c is None:
                return self._eof_in_object("inside the top-level object")
            if c == 0x7D:  # '}'
                if not first:
                    raise self._error("invalid JSON: trailing comma in object")
                self.pos += 1
                break
            key = self._member_key(c)
            if key is None:
                return None
            if key == "traceEvents":
                yield from self._trace_events()
                if self.stopped:
                    return
            elif not self._read_value(key):
                return
            first = False
            more = self._next_member()
            if more is None:
                return None
            if not more:
                break
        if not self.state.saw_events:
            raise TraceError(  # at the '}' that closed the document
                self.path,
                "not a trace: no 'traceEvents' key" + not_a_trace_hint(self.state.top),
                offset=self.base + self.pos - 1,
            )
        self._expect_end()

    def _member_key(self, c: int) -> str | None:
        """Read a top-level member's ``"key":`` (``c``: the byte at the position), leaving the
        position at its value; None when the file ends first (``_eof_in_object`` said so)."""
        if c != 0x22:
            raise self._error("invalid JSON: expected a key string in the top-level object")
        key = self._read_key()
        if key is None:
            self._eof_in_object("inside a top-level key")
            return None
        c2 = self._peek()
        if c2 is None:
            self._eof_in_object(f"after top-level key {key!r}")
            return None
        if c2 != 0x3A:
            raise self._error("invalid JSON: expected ':' after a key")
        self.pos += 1
        if self._peek() is None:
            self._eof_in_object(f"at top-level key {key!r}")
            return None
        return key

    def _trace_events(self) -> Iterator[Chunk]:
        """The ``traceEvents`` member's value (the position is at its first byte)."""
        if self.state.saw_events:
            raise self._error("'traceEvents' appears twice", field="traceEvents")
        if self._peek() != 0x5B:
            raise self._error("'traceEvents' is not an array", field="traceEvents")
        self.state.saw_events = True
        self.pos += 1
        yield from self._events()

    def _next_member(self) -> bool | None:
        """After a member: True when a ',' says another follows, False when '}' closed the
        object (both consumed); None when the file ends there (``_eof_in_object`` said so)."""
        c = self._peek()
        if c is None:
            self._eof_in_object("inside the top-level object")
            return None
        if c == 0x2C:  # ','
            self.pos += 1
            if self._peek() == 0x7D:
                raise self._error("invalid JSON: trailing comma in object")
            return True
        if c == 0x7D:
            self.pos += 1
            return False
        raise self._error("invalid JSON: expected ',' or '}' in the top-level object")

    def _eof_in_object(self, where: str) -> None:
        if self.salvage and self.state.saw_events:
            self._stop(f"file ends {where} at byte {self._end_offset()}, after traceEvents")
            return None
        raise self._truncated(where)

    def _expect_end(self) -> None:
        c = self._peek()
        if c is not None:
            raise self._error("invalid JSON: trailing data after the end of the document")

    def _read_key(self) -> str | None:
        while True:
            m = _STRING.match(self.buf, self.pos)
            if m is not None:
                try:
                    key: str = msgspec.json.decode(m.group(0))  # (the regex matched a string)
                except (msgspec.DecodeError, UnicodeDecodeError) as exc:
                    raise self._error(f"invalid JSON in a key: {exc}") from None
                self.pos = m.end()
                return key
            if len(self.buf) - self.pos > MAX_KEY_BYTES:
                too_long = fmt_size(MAX_KEY_BYTES)
                raise self._error(f"a top-level key string longer than {too_long} (not a trace?)")
            if not self._more():
                return None

    def _read_value(self, key: str) -> bool:
        """Decode one top-level value into ``state.top[key]``; False if the data ended inside it
        (salvage only)."""
        want = 1 << 16
        while True:
            with memoryview(self.buf) as whole:
                view = whole[self.pos :]
                try:
                    try:
                        value = GENERIC_DECODER.decode(view)
                        end = len(view)
                        complete = self.eof
                    except msgspec.DecodeError as exc:
                        b = error_byte(exc)
                        if "trailing characters" in str(exc) and b is not None:
                            end = b - 1
                            value = GENERIC_DECODER.decode(view[:end])
                            complete = True
                        elif "truncated" in str(exc):
                            complete = False
                        else:
                            raise self._error(
                                f"invalid JSON: {_clean(exc)}", offset=self.base + self.pos + (b or 0)
                            ) from None
                    except (msgspec.ValidationError, UnicodeDecodeError) as exc:
                        raise self._error(f"invalid value for top-level key {key!r}: {exc}") from None
                    except RecursionError:
                        raise nesting_error(self.path, view, self.base + self.pos) from None
                finally:
                    view.release()
            if complete:
                self.state.top[key] = value
                self.pos += end
                return True
            if self.eof:
                if self.salvage and self.state.saw_events:
                    self._stop(f"file ends inside top-level key {key!r} at byte {self._end_offset()}")
                    return False
                raise self._truncated(f"inside top-level key {key!r}")
            limit = META_VALUE_LIMIT
            if len(self.buf) - self.pos > limit:
                return self._skip_value(key)
            self._fill(min(len(self.buf) + want, self.pos + limit + 1))
            want *= 2

    def _skip_value(self, key: str) -> bool:
        """Skip a huge top-level value without decoding it (memory stays bounded): an object or
        array to its matching bracket, a string to its closing quote, a number or literal to
        the next delimiter."""
        start = self.base + self.pos
        if self.buf[self.pos] not in b'[{"':
            return self._skip_scalar(key, start)
        depth = 0
        in_str = False
        esc = False
        p = self.pos
        while True:
            buf = self.buf
            n = len(buf)
            while p < n:
                if esc:
                    esc = False
                    p += 1
                    continue
                at = _next_in_string(buf, p, n) if in_str else _next_special(buf, p)
                if at < 0:
                    p = n
                    break
                ch = buf[at]
                p = at + 1
                if in_str:
                    if ch == 0x5C:
                        esc = True
                        continue
                    in_str = False
                    if depth > 0:
                        continue
                elif ch == 0x22:
                    in_str = True
                    continue
                elif ch in (0x5B, 0x7B):
                    depth += 1
                    continue
                elif ch in (0x5D, 0x7D):
                    depth -= 1
                    if depth > 0:
                        continue
                else:
                    continue
                # the value ended at p (its closing quote or bracket)
                self.pos = p
                self._skipped(key, self.base + p - start)
                return True
            self.pos = p
            self._compact(p)
            p = self.pos
            if not self._more():
                return self._eof_in_value(key)

    def _skip_scalar(self, key: str, start: int) -> bool:
        while True:
            m = _SCALAR_END.search(self.buf, self.pos)
            if m is not None:
                self.pos = m.start()
                self._skipped(key, self.base + self.pos - start)
                return True
            self.pos = len(self.buf)
            self._compact(self.pos)
            if not self._more():
                return self._eof_in_value(key)

    def _skipped(self, key: str, size: int) -> None:
        self.state.warnings.append(f"top-level key {key!r} holds {size} bytes; skipped, not decoded")

    def _eof_in_value(self, key: str) -> bool:
        if self.salvage and self.state.saw_events:
            self._stop(f"file ends inside top-level key {key!r} at byte {self._end_offset()}")
            return False
        raise self._truncated(f"inside top-level key {key!r}")

    # ---- the events array ---------------------------------------------------------------
    def _events(self) -> Iterator[Chunk]:
        """Yield chunks of the array whose '[' was just consumed; leave ``pos`` after its ']'."""
        c = self._peek()
        if c is None:
            if self.salvage:
                self._stop(f"file ends at the start of traceEvents (byte {self._end_offset()})")
                return
            raise self._truncated("at the start of traceEvents")
        if c == 0x5D:
            self.pos += 1
            return
        if c != 0x7B:
            if self.state.legacy:
                raise self._error(
                    "not a trace: a JSON array whose items are not event objects", event_index=0
                )
            raise self._error(f"event is {self._describe()}, not an object", event_index=0)
        start = self.pos  # at '{'; buf[start - 1] is overwritten with '['
        k = start - 1
        while k > 0 and start - k <= SEP_MAX_WS and self.buf[k] in _WS:
            k -= 1
        # ("[" + whitespace + "{"); odd amounts of whitespace: no preferred separator
        self.sep = b"}," + bytes(self.buf[k + 1 : start]) + b"{" if start - k <= SEP_MAX_WS else b""
        if self.pool is not None and not self.salvage:
            yield from self._events_parallel(start)
        else:
            yield from self._serial(start)

    def _serial(self, start: int, steps: int | None = None) -> Generator[Chunk, None, int | None]:
        """Decode chunks here, from the event at ``buf[start]`` (a true event start). Returns
        (as the generator's value) the start of the next chunk after ``steps`` chunks, or None
        when the array (or the data) ended; then ``pos`` is after the array.

        The search for a boundary is linear in the data: after a block without one, only a
        boundary that straddles the old end (a ``}`` followed by whitespace and commas up to
        it) or starts after it can appear, and blocks of nothing but whitespace and commas are
        read on without searching (see :meth:`_read_past_blanks`)."""
        while True:
            self._fill(start + self.chunk_bytes)
            lo = scan = start + 1
            while True:
                cut = self._last_boundary(scan, len(self.buf))
                if cut is None:
                    nxt = self._read_past_blanks(start, lo, scan)
                    if nxt is not None:
                        scan = nxt
                        continue
                    yield from self._final(start)
                    return None
                try:
                    chunk, ended_at = self._decode_range(start, cut)
                except _Split:
                    lo = scan = cut + 1
                    self._check_value_size(start)
                    if not self._more() and self._last_boundary(lo, len(self.buf)) is None:
                        yield from self._final(start)
                        return None
                    continue
                break
            if chunk is not None and chunk.events:
                yield chunk
                self.n_events += len(chunk.events)
            if ended_at is not None:  # the array ended inside this range
                self.pos = ended_at
                return None
            if self.stopped:
                return None
            m = _BOUNDARY.match(self.buf, cut)
            assert m is not None
            start = m.end() - 1
            self.pos = start
            start -= self._compact(start)
            if steps is not None:
                steps -= 1
                if steps <= 0:
                    return start

    def _read_past_blanks(self, start: int, lo: int, scan: int) -> int | None:
        """No boundary starts in ``[lo, len(buf))`` (the last search began at ``scan``): read
        more data (past blocks of only whitespace and commas, which cannot complete a
        boundary) and return where the next search must start, or None at the end of the
        data. ``[scan, len(buf))`` holds a non-blank byte unless ``scan == lo``, so the blank
        run at the end starts at or after ``scan``: only the new bytes are looked at."""
        n = len(self.buf)
        run = self._blank_run_start(scan, n)
        scan = run - 1 if run - 1 >= lo and self.buf[run - 1] == 0x7D else n  # a '}' that may straddle
        while True:
            self._check_value_size(start)
            old = len(self.buf)
            if not self._more():
                return None
            if self._blank_run_start(old, len(self.buf)) > old:  # something besides blanks
                return scan

    def _blank_run_start(self, lo: int, hi: int) -> int:
        """Start of the run of whitespace and commas that ends ``buf[lo:hi]`` (``hi`` if none)."""
        with memoryview(self.buf) as whole:
            tail = bytes(whole[lo:hi])
        return lo + len(tail.rstrip(_WS_COMMA))

    def _check_value_size(self, start: int) -> None:
        """The event starting at ``buf[start]`` (with what follows it) has grown past the
        single-value limit without a boundary: refuse rather than buffer without end."""
        if len(self.buf) - start > self.limits.max_value_bytes + self.chunk_bytes:
            raise TraceError(
                self.path,
                f"no end of traceEvents[{self.n_events}] within {fmt_size(self.limits.max_value_bytes)}: "
                f"one event (or run of whitespace) is over {self.limits.value_hint()}",
                offset=self.base + start,
                event_index=self.n_events,
            )

    def _events_parallel(self, start: int) -> Iterator[Any]:
        """Like :meth:`_serial`, but chunks are decoded and turned into tables by the worker
        processes of ``self.pool`` (see :mod:`kinetoscope.trace.parallel`).

        Chunks are cut at candidate boundaries and sent speculatively; results are taken in
        order. A chunk whose start is a true event boundary and that decodes as complete
        events ends at a true boundary too, so the first chunk a worker cannot handle (a
        boundary inside a string or nested value, the end of the array, a syntax error, an
        event the reference must judge) is decoded here instead, with the serial rules, and
        the chunks sent after it are dropped. The bytes of chunks in flight stay in the buffer
        until their result is taken; at most ``pool.capacity`` chunks are in flight."""
        pool = self.pool
        job = pool.begin(self.path)
        try:
            while True:
                hi = start + self.chunk_bytes
                self._fill(hi)
                cut = self._last_boundary(start + 1, min(hi, len(self.buf)))
                if cut is None:
                    cut = self._last_boundary(start + 1, len(self.buf))
                if cut is None and not self.eof:
                    # no boundary within reach (a huge event or run of whitespace): take the
                    # results in flight, then this chunk by the serial rules (linear, limited)
                    nxt = yield from self._drain_then_serial(job, start, final=False)
                    if nxt is None:
                        return
                    start = nxt
                    continue
                final = cut is None  # the rest of the data: the array's end should be in it
                if (yield from self._take_ready(job)):  # take finished results first
                    return
                if job.failed_at is not None:  # decode from the failed chunk's start here
                    start = job.failed_at - self.base
                    job.failed_at = None
                    nxt = yield from self._serial(start, steps=1)
                    if nxt is None:
                        return
                    start = nxt
                    continue
                if job.can_submit():
                    if self._send(job, start, cut, final):
                        if cut is None:  # the last chunk is in flight: take every result
                            yield from self._drain_then_serial(job, start, final=True)
                            return
                        start = self._after_cut(job, cut)
                        continue
                elif job.in_flight():  # wait for a free slot
                    if (yield from self._take_one(job)):
                        return
                    continue
                # no worker can take this chunk (none ready yet, or it is too big): take every
                # result, then decode it here
                nxt = yield from self._drain_then_serial(job, start, final)
                if nxt is None:
                    return
                start = nxt
        finally:
            job.close()

    def _send(self, job: Any, start: int, cut: int | None, final: bool) -> bool:
        """Submit ``buf[start:cut + 1]`` (to the end of the data when ``cut`` is None) to a
        worker; whether it was sent."""
        view = memoryview(self.buf)
        try:
            sent: bool = job.submit(
                view[start : len(self.buf) if cut is None else cut + 1], self.base + start, final
            )
        finally:
            view.release()
        return sent

    def _after_cut(self, job: Any, cut: int) -> int:
        """Where the next chunk starts after one sent up to the boundary at ``cut``; the bytes
        before it (and before the oldest chunk in flight) are dropped from the buffer."""
        m = _BOUNDARY.match(self.buf, cut)
        assert m is not None
        start = m.end() - 1
        keep = job.oldest_offset()
        return start - self._compact(start if keep is None else min(start, keep - self.base))

    def _take_ready(self, job: Any) -> Generator[Any, None, bool]:
        """Yield the frames of the results already finished, in order; True when one reached
        the end of ``traceEvents`` (then ``self.pos`` is past it)."""
        while job.has_result():
            res = job.take()
            if res is None:
                break
            yield self._built(res)
            if res.end is not None:
                self.pos = res.end - self.base
                return True
        return False

    def _take_one(self, job: Any) -> Generator[Any, None, bool]:
        """Yield the frames of the next result (waiting for it); True when it reached the end of
        ``traceEvents``. No frames when the next chunk failed (``job.failed_at``)."""
        res = job.take()
        if res is None:
            return False
        yield self._built(res)
        if res.end is not None:
            self.pos = res.end - self.base
            return True
        return False

    def _drain_then_serial(self, job: Any, start: int, final: bool) -> Generator[Any, None, int | None]:
        """Take every result in flight, then decode here with the serial rules from where they
        stopped: one chunk (returning where the next starts), or the rest of the data when
        ``final``. None when the array ended."""
        start, done = yield from self._take_all(job, start)
        if done:
            return None
        if final:
            yield from self._serial(start)
            return None
        return (yield from self._serial(start, steps=1))

    def _take_all(self, job: Any, start: int) -> Generator[Any, None, tuple[int, bool]]:
        """Yield the in-flight chunks' frames in file order. Returns ``(start, done)``: where the
        serial parse must go on (the first failed chunk's offset, else ``start``), and whether a
        chunk reached the end of ``traceEvents`` (then ``self.pos`` is past it)."""
        for res in job.drain():
            if res is None:
                start = job.failed_at - self.base
                job.failed_at = None
                break
            yield self._built(res)
            if res.end is not None:
                self.pos = res.end - self.base
                return start, True
        return start, False

    def _built(self, res: Any) -> Any:
        res.first_index = self.n_events
        self.n_events += res.n_events
        return res

    def _last_boundary(self, lo: int, hi: int) -> int | None:
        """Index of the '}' of the last boundary match starting in ``[lo, hi)``: preferably
        one that looks like the separator before the first event (``self.sep``, e.g.
        ``},\n  {``: pretty-printed nested values and strings rarely contain exactly that),
        else any ``}`` ``,`` ``{``."""
        buf = self.buf
        if self.sep:
            i = buf.rfind(self.sep, lo, hi)
            if i >= 0:
                return i
        window = 1 << 16
        prev_a = prev_end = hi
        while hi > lo:
            a = max(lo, hi - window)
            best = None
            for best in _BOUNDARY.finditer(buf, a, hi + 0):  # noqa: B007 (keeps the last match)
                pass
            if best is not None:
                return best.start()
            if a == lo:
                return None
            # a match straddling ``a`` starts before it and ends at most where the blanks and
            # commas from ``a`` (and one '{') end: the next window must reach that far, however
            # long that run (each run of whitespace may be up to the value limit). The run is
            # scanned up to the previous window's start only (each byte once): reaching it, it
            # ends where the previous one did.
            run = _WS_COMMA_RUN.match(buf, a, prev_a)
            stop = run.end() if run is not None else a
            end = prev_end if stop == prev_a else stop + (buf[stop : stop + 1] == b"{")
            hi = min(hi, max(a + 256, end))
            prev_a, prev_end = a, end
            window *= 4
        return None

    def _decode_range(self, start: int, cut: int) -> tuple[Chunk | None, int | None]:
        """Decode events ``buf[start : cut + 1]`` (``cut`` is a candidate '}' boundary).

        Returns (chunk, None), or (chunk, position after the array's ']') when the real array
        ended inside the range. Raises _Split for a boundary inside a string or nested value."""
        buf = self.buf
        buf[start - 1] = 0x5B  # '['
        saved = buf[cut + 1]
        buf[cut + 1] = 0x5D  # ']'
        try:
            return self._decode_view(start, cut + 2, final=False, patch=cut + 1)
        finally:
            buf[cut + 1] = saved

    def _final(self, start: int) -> Iterator[Chunk]:
        """The rest of the data: the last events, ']' and whatever follows."""
        self.buf[start - 1] = 0x5B
        try:
            chunk, ended_at = self._decode_view(start, len(self.buf), final=True)
        except _Split:  # the data ends inside an event
            chunk, ended_at = self._eof_in_events(start)
        if chunk is not None and chunk.events:
            yield chunk
            self.n_events += len(chunk.events)
        if ended_at is not None:
            self.pos = ended_at
        else:
            self.pos = len(self.buf)
            if not self.stopped:
                self._stop(f"file ends inside traceEvents at byte {self._end_offset()}")

    def _eof_in_events(self, start: int) -> tuple[Chunk | None, int | None]:
        chunk = self._salvage(start, len(self.buf))
        complete = self.n_events + (len(chunk.events) if chunk is not None else 0)
        if not self.salvage:
            err = self._truncated(f"inside traceEvents[{complete}]")
            err.event_index = complete
            raise TraceError(self.path, err.problem, offset=err.offset, event_index=complete)
        why = self.reader.problem or "the JSON text ends early"
        self._stop(f"file ends inside traceEvents[{complete}] at byte {self._end_offset()} ({why})")
        return chunk, None

    def _salvage(self, start: int, hi: int) -> Chunk | None:
        """The longest run of complete events in ``buf[start:hi]`` (None if there is none)."""
        buf = self.buf
        while True:
            best = None
            lo = start + 1
            window = 1 << 16
            h = hi
            while h > lo and best is None:
                a = max(lo, h - window)
                for best in _SALVAGE_END.finditer(buf, a, h):  # noqa: B007 (keeps the last match)
                    pass
                if a == lo:
                    break
                h = min(h, a + 256)
                window *= 4
            if best is None:
                return None
            cut = best.start()
            buf[start - 1] = 0x5B
            saved = buf[cut + 1] if cut + 1 < len(buf) else None
            if saved is None:
                buf.append(0x5D)
            else:
                buf[cut + 1] = 0x5D
            salvage, self.salvage = self.salvage, False
            try:
                chunk, _ = self._decode_view(start, cut + 2, final=False, patch=cut + 1)
                return chunk
            except (_Split, TraceError):
                hi = cut
            finally:
                self.salvage = salvage
                if saved is None:
                    del buf[-1]
                else:
                    buf[cut + 1] = saved

    def _decode_view(
        self, start: int, end: int, *, final: bool, patch: int | None = None
    ) -> tuple[Chunk | None, int | None]:
        """Decode ``buf[start-1:end]`` ('[' + events ...). See :meth:`_decode_range`."""
        base_off = self.base + start - 1
        first = self.n_events
        with memoryview(self.buf) as whole:
            view = whole[start - 1 : end]
            try:
                chunk, done = self._decode_mv(view, start, end, base_off, first, final)
            finally:
                view.release()
        if chunk is not None and chunk.source is None:  # (salvage returns finished chunks)
            hi = self.base + chunk.hi  # _decode_mv stores the relative end
            chunk.source = self
            chunk.lo = base_off
            chunk.hi = hi
            chunk.patch = self.base + patch if patch is not None and self.base + patch == hi - 1 else None
        return chunk, done

    def _chunk(self, events: list[Any], first: int, typed: bool, base_off: int, hi: int) -> DecodedChunk:
        return DecodedChunk(events, first, typed, base_off, self.family if typed else FLOAT, hi=hi)

    def _decode_mv(
        self, view: memoryview, start: int, end: int, base_off: int, first: int, final: bool
    ) -> tuple[Chunk | None, int | None]:
        try:
            return self._decode_mv_inner(view, start, end, base_off, first, final)
        except RecursionError:
            raise nesting_error(self.path, view, base_off) from None

    def _decode_mv_inner(
        self, view: memoryview, start: int, end: int, base_off: int, first: int, final: bool
    ) -> tuple[Chunk | None, int | None]:
        done = start - 1 + len(view) if final else None
        if self.native is not None:  # the C decoder, else (it gave up) the Python path below
            got = self.native(view)
            if got is not None:
                got.first_index = first
                if got.end is not None:  # the array ended inside: the top level goes on there
                    done = start - 1 + got.end
                return got, done
        try:
            fam = self.family = sniff_family(view, self.family)
            # Raw values keep their source buffer exported: give them a copy, not the buffer
            data = bytes(view) if fam.raw_ts else view
            return self._chunk(fam.decoder.decode(data), first, True, base_off, end), done
        except msgspec.ValidationError:
            pass  # odd types: generic decode below
        except msgspec.DecodeError as exc:
            return self._decode_failed(exc, view, start, base_off, first, final, typed=True)
        except UnicodeDecodeError:
            raise self._bad_utf8(view, base_off) from None
        try:
            return self._chunk(EXACT_GENERIC_DECODER.decode(view), first, False, base_off, end), done
        except msgspec.ValidationError as exc:  # e.g. a number out of range (1e400)
            raise self._invalid_value(exc, first, base_off) from None
        except msgspec.DecodeError as exc:
            return self._decode_failed(exc, view, start, base_off, first, final, typed=False)
        except UnicodeDecodeError:
            raise self._bad_utf8(view, base_off) from None

    def _invalid_value(self, exc: Exception, first: int, chunk_offset: int) -> TraceError:
        """A value msgspec rejects; located by event index, else by the chunk's offset."""
        k = error_event_index(exc)
        if k is None:
            return TraceError(self.path, f"invalid value: {exc}", offset=chunk_offset)
        return TraceError(self.path, f"invalid value: {exc}", event_index=first + k)

    def _decode_failed(
        self,
        exc: msgspec.DecodeError,
        view: memoryview,
        start: int,
        base_off: int,
        first: int,
        final: bool,
        typed: bool,
    ) -> tuple[Chunk | None, int | None]:
        text = str(exc)
        b = error_byte(exc)
        n = len(view)
        if "trailing characters" in text and b is not None:
            # the events array closed inside this range: decode up to its ']'
            end = b - 1
            sub = view[:end]
            try:
                try:
                    fam = self.family
                    evs, is_typed = fam.decoder.decode(bytes(sub) if fam.raw_ts else sub), True
                except msgspec.ValidationError:
                    evs, is_typed = EXACT_GENERIC_DECODER.decode(sub), False
            except msgspec.ValidationError as exc2:
                raise self._invalid_value(exc2, first, base_off) from None
            finally:
                sub.release()
            return self._chunk(evs, first, is_typed, base_off, start - 1 + end), start - 1 + end
        if "truncated" in text or (b is not None and b >= n - 1):
            if final and b is not None and "truncated" not in text:
                # the last byte of the data is wrong: report it as a syntax error
                return self._syntax_error(exc, b, view, start, base_off, first)
            raise _Split
        return self._syntax_error(exc, b, view, start, base_off, first)

    def redecode(
        self, chunk: DecodedChunk, decoder: msgspec.json.Decoder[Any], *, copy: bool = False
    ) -> list[Any]:
        """Decode the bytes of ``chunk`` (the last one yielded) again with ``decoder``."""
        buf = self.buf
        lo = chunk.lo - self.base
        hi = chunk.hi - self.base
        assert lo >= 0, "the chunk's bytes are gone"
        buf[lo] = 0x5B  # '[' (already there unless a later chunk overwrote it)
        patch = None if chunk.patch is None else chunk.patch - self.base
        saved = None
        if patch is not None:
            if patch == len(buf):
                buf.append(0x5D)
            else:
                saved = buf[patch]
                buf[patch] = 0x5D
        try:
            with memoryview(buf) as whole:
                view = whole[lo:hi]
                try:
                    events: list[Any] = decoder.decode(bytes(view) if copy else view)
                    return events
                except RecursionError:
                    raise nesting_error(self.path, view, chunk.lo) from None
                except msgspec.ValidationError as exc:
                    raise self._invalid_value(exc, chunk.first_index, chunk.lo) from None
                except UnicodeDecodeError:  # in a field the typed decode skipped
                    raise self._bad_utf8(view, chunk.lo) from None
                finally:
                    view.release()
        finally:
            if patch is not None:
                if saved is None:
                    del buf[-1]
                else:
                    buf[patch] = saved

    def _syntax_error(
        self, exc: msgspec.DecodeError, b: int | None, view: memoryview, start: int, base_off: int, first: int
    ) -> tuple[Chunk | None, int | None]:
        offset = base_off + (b or 0)
        if self.salvage:
            chunk = self._salvage(start, start - 1 + (b or 0))
            self._stop(f"invalid JSON at byte {offset}: {_clean(exc)}")
            return chunk, None
        raise TraceError(self.path, f"invalid JSON: {_clean(exc)}", offset=offset)

    def _bad_utf8(self, view: memoryview, base_off: int) -> TraceError:
        try:
            bytes(view).decode("utf-8")
        except UnicodeDecodeError as err:
            return TraceError(self.path, f"invalid UTF-8 ({err.reason})", offset=base_off + err.start)
        return TraceError(self.path, "invalid UTF-8", offset=base_off)


prime_structs(globals())
