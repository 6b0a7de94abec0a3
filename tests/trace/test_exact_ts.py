"""Timestamps are exact integer nanoseconds from the decimal text, never through a float64.

Epoch-based microseconds with 3 decimals (``1712171498123456.789``) need 19 significant digits;
a float64 holds 15-17, so reading them as floats is off by up to ~128 ns. The rule (see
``kinetoscope.trace.reference``): the exact decimal value x 1000, rounded half to even at the
nanosecond when there are more than 3 decimals.
"""

from __future__ import annotations

import random
from decimal import ROUND_HALF_EVEN, Decimal

import msgspec
import pytest

from kinetoscope.trace import TraceError, load_trace_reference, parse_trace
from kinetoscope.trace.exactns import ns_from_texts, texts_blob
from kinetoscope.trace.rules import TS_LIMIT_NS, exact_ns_text
from tests.trace.conftest import assert_same_trace, write_doc

# (text in the file, exact ns)
CASES = [
    ("1712171498123456.789", 1712171498123456789),
    ("1712195495519761.250", 1712195495519761250),  # float64 reads ...761.25 exactly: fine too
    ("1712195495519761.132", 1712195495519761132),  # float64: ...761.125 -> 1712195495519761125
    ("1712195495519689.047", 1712195495519689047),
    ("-1712171498123456.789", -1712171498123456789),
    ("9223372036854775.000", 9223372036854775000),  # the largest accepted: INT64_MAX // 1000 µs
    ("1.5e3", 1_500_000),
    ("1.5E+3", 1_500_000),
    ("2e-3", 2),
    ("1712171498123456789e-3", 1712171498123456789),
    ("17121714981234.56789e2", 1712171498123456789),
    ("12", 12_000),
    ("-12", -12_000),
    ("0", 0),
    ("-0.0", 0),
    ("0.001", 1),
    ("63.813", 63_813),
    ("5.5", 5_500),
    ("5.25", 5_250),
    # more than 3 decimals: round half to even at the nanosecond
    ("0.0005", 0),
    ("0.0015", 2),
    ("0.0025", 2),
    ("0.00251", 3),
    ("-0.0015", -2),
    ("1.2345", 1_234),
    ("1.2355", 1_236),
    ("1712171498123456.7895", 1712171498123456790),
    ("1712171498123456.7885", 1712171498123456788),
    ("1712171498123456.78849999", 1712171498123456788),
    ("123456789.123456789", 123_456_789_123),
]


def _doc(texts: list[str], key: str = "ts") -> bytes:
    """A trace whose X events carry ``texts`` verbatim as ts (or dur); flows and instants too."""
    events = []
    for i, t in enumerate(texts):
        ts = t if key == "ts" else "1"
        dur = t if key == "dur" else "1"
        events.append(
            f'{{"ph": "X", "cat": "cpu_op", "name": "e{i}", "pid": 1, "tid": 1, "ts": {ts}, "dur": {dur}}}'
        )
        if key == "ts":
            events.append(
                f'{{"ph": "f", "id": {i}, "pid": 1, "tid": 1, "ts": {t}, "cat": "ac2g", "name": "ac2g"}}'
            )
            events.append(f'{{"ph": "i", "s": "t", "name": "[memory]", "pid": 1, "tid": 1, "ts": {t}}}')
            events.append(f'{{"ph": "C", "name": "q", "pid": 1, "ts": {t}, "args": {{"v": 1}}}}')
    return ('{"traceEvents": [\n' + ",\n".join(events) + "\n]}").encode()


@pytest.mark.parametrize(("text", "ns"), CASES)
def test_rule(text, ns):
    assert exact_ns_text(text) == ns


@pytest.mark.parametrize("key", ["ts", "dur"])
@pytest.mark.parametrize("chunk", [None, 64, 700])
def test_hand_written_decimals_load_exactly(tmp_path, key, chunk):
    texts = [t for t, _ in CASES if key == "ts" or not t.startswith("-")]
    want = [ns for t, ns in CASES if key == "ts" or not t.startswith("-")]
    p = write_doc(tmp_path / "t.json", raw=_doc(texts, key))
    got = parse_trace(p, chunk_bytes=chunk)
    assert got.events[key].to_list() == want
    if key == "ts":
        assert got.flows["ts"].to_list() == want
        assert got.instants["ts"].to_list() == want
        assert got.counters["ts"].to_list() == want
    assert_same_trace(got, load_trace_reference(p))


def test_epoch_trace_every_chunk_exact(tmp_path):
    """Many chunks of epoch-based timestamps (the vectorised text path), mixed with the odd
    integer, a value with 2 decimals and a missing flow ts (0)."""
    rnd = random.Random(7)
    texts = []
    for i in range(3000):
        r = rnd.random()
        if r < 0.01:
            texts.append(str(1712171498000000 + i))
        elif r < 0.02:
            texts.append(f"1712171498{i:06d}.{rnd.randint(0, 99):02d}")
        else:
            texts.append(f"1712171498{i:06d}.{rnd.randint(0, 999):03d}")
    want = [int(Decimal(t) * 1000) for t in texts]
    raw = _doc(texts).replace(b'"ts": 1712171498000005, "cat"', b'"cat"')  # (a flow without ts)
    p = write_doc(tmp_path / "t.json.gz", raw=raw, gz=True)
    got = parse_trace(p, chunk_bytes=20_000)
    assert got.events["ts"].to_list() == want
    assert_same_trace(got, load_trace_reference(p))


def test_float64_would_be_wrong_here(tmp_path):
    """The reason for all this: float64 misreads these by up to ~128 ns."""
    text = "1712195495519761.132"
    assert round(float(text) * 1000.0) != 1712195495519761132
    p = write_doc(tmp_path / "t.json", raw=_doc([text]))
    assert parse_trace(p).events["ts"][0] == 1712195495519761132


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("9223372036854775.001", "out of range"),  # |ns| <= (INT64_MAX // 1000) * 1000
        ("-9223372036854775.001", "out of range"),
        ("1e17", "out of range"),
        ('"soon"', "not a number"),
        ("true", "must be a number"),
        ("null", "must be a number"),
    ],
)
def test_bad_values_raise_like_the_reference(tmp_path, text, problem):
    p = write_doc(tmp_path / "t.json", raw=_doc(["1712171498123456.789", text]))
    with pytest.raises(TraceError, match=problem) as got:
        parse_trace(p)
    with pytest.raises(TraceError, match=problem) as ref:
        load_trace_reference(p)
    assert got.value.event_index == ref.value.event_index == 4


def test_numeric_strings_are_exact_too(tmp_path):
    p = write_doc(tmp_path / "t.json", raw=_doc(['"1712171498123456.789"', '" 12 "']))
    assert parse_trace(p).events["ts"].to_list() == [1712171498123456789, 12000]


def test_vectorised_parser_matches_the_rule():
    """ns_from_texts (numpy) agrees with exact_ns_text, or declines (None) for what it does not
    handle; it never declines a plain decimal with <= 3 decimals that fits."""
    rnd = random.Random(3)

    def plain():
        sign = "-" if rnd.random() < 0.2 else ""
        digits = str(rnd.randint(0, 10 ** rnd.randint(1, 15)))
        frac = rnd.choice(["", ".5", ".25", ".125", ".000"])
        return sign + digits + frac

    for _ in range(3000):
        n = rnd.randint(1, 40)
        if rnd.random() < 0.5:
            base = rnd.randint(10**15, 2 * 10**15)
            texts = [f"{base + rnd.randint(0, 10**6)}.{rnd.randint(0, 999):03d}" for _ in range(n)]
        else:
            texts = [plain() for _ in range(n)]
        odd = rnd.random() < 0.2
        if odd:
            texts[rnd.randrange(n)] = rnd.choice(['"1"', "1e3", "0.0005", "9223372036854775.808", "null"])
        got = ns_from_texts(texts_blob([msgspec.Raw(t.encode()) for t in texts]), n)
        if got is None:
            assert odd, texts
            continue
        want = []
        for t in texts:
            d = Decimal(t) * 1000
            want.append(int(d.to_integral_value(rounding=ROUND_HALF_EVEN)))
        assert [int(v) for v in got] == want
        assert all(abs(v) <= TS_LIMIT_NS for v in want)
