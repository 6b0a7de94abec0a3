"""Fuzzing the trace loader (issue 16): byte-level mutations of copies of the real traces in
tests/data/traces (JSON text and gzip stream), and hypothesis-generated hostile documents.

Every input must either load or raise :class:`TraceError` naming the file and a location (a
byte offset or an event index); any other exception is a failure. Inputs are fixed: seeded
``random.Random`` per input and the derandomized hypothesis profile of tests/conftest.py, so a
failure names the seed that replays it. ``KSCOPE_FUZZ_BUDGET`` (default 1) multiplies the
number of inputs (``make fuzz`` uses a larger one); docs/trace-loading.md, "Fuzzing".
"""

from __future__ import annotations

import gzip
import json
import os
import random
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kinetoscope.trace import TraceError, parse_trace
from kinetoscope.trace.limits import Limits
from tests.trace.test_properties import document

BUDGET = max(1, int(os.environ.get("KSCOPE_FUZZ_BUDGET", "1")))
TRACES = Path(__file__).resolve().parents[1] / "data" / "traces" / "hta"
# small real traces of different shapes (CPU-only, GPU, AMD, CUPTI counters, u64 ids, ...)
SEEDS = [
    "cpu_only/rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz",
    "large_integer_trace/rank-70.Mar_25_20_48_12.2861.pt.trace.json.gz",
    "trace_file_list/inference_rank_1.json.gz",
    "critical_path/cuda_event_sync/event_sync_trace.json.gz",
    "call_stack/backward_thread.json",
    "amd_trace/mi250_minitoy_train_ROCm6_2_kineto.json.gz",
    "with_gpu_user_annotation/step_based_trace_2543932.json.gz",
    "cupti_profiler/benchmark_result_924719_1679055439_trace.json.gz",
]
# limits low enough that the fuzzer reaches them, high enough for every seed trace
LIMITS = Limits(max_trace_bytes=64 << 20, max_value_bytes=4 << 20)
TOKENS = [
    b"{",
    b"}",
    b"[",
    b"]",
    b'"',
    b"\\",
    b",",
    b":",
    b"},{",
    b"1e999",
    b"-",
    b"null",
    b"true",
    b'"\\ud800"',
    b"\xff\xfe",
    b"\x00",
    b"99999999999999999999999",
    b"-9223372036854775809",
    b"0.000000000000000000001",
    b"[" * 1200,
    b'{"a":' * 1100,
    b" " * 5000,
    b'"ts": "x"',
    b'"dur": -5',
    b'"ph": "Q"',
    b'"pid": 1.5',
    b'"traceEvents": {}',
    b'"args": []',
    b"\xef\xbb\xbf",
    b"NaN",
    b"Infinity",
    b'"\\u0000"',
]

_STATS: Counter[str] = Counter()


def _text(rel: str) -> bytes:
    raw = (TRACES / rel).read_bytes()
    return gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw


def mutate(data: bytes, rnd: random.Random) -> bytes:
    """One to four random edits of ``data``."""
    b = bytearray(data)
    for _ in range(rnd.randint(1, 4)):
        n = len(b)
        if n == 0:
            b += rnd.choice(TOKENS)
            continue
        i = rnd.randrange(n)
        j = min(n, i + rnd.choice([1, 8, 64, 4096]))
        op = rnd.randrange(7)
        if op == 0:
            b[i] = rnd.randrange(256)
        elif op == 1:
            del b[i:j]
        elif op == 2:
            b[i:i] = b[i:j]
        elif op == 3:
            b[i:i] = rnd.choice(TOKENS)
        elif op == 4:
            del b[i:]
        elif op == 5:
            k = rnd.randrange(n)
            b[i:j], b[k:k] = b"", bytes(b[i:j])
        else:
            b[i:j] = rnd.choice(TOKENS)
    return bytes(b)


def mutate_gzip(text: bytes, rnd: random.Random) -> bytes:
    """A gzip stream of ``text`` with its compressed bytes damaged (or members appended)."""
    gz = bytearray(gzip.compress(text, 1))
    op = rnd.randrange(4)
    if op == 0:
        for _ in range(rnd.randint(1, 3)):
            gz[rnd.randrange(len(gz))] ^= 1 << rnd.randrange(8)
    elif op == 1:
        del gz[rnd.randrange(len(gz)) :]
    elif op == 2:
        gz += rnd.choice([b"\x00" * 16, b"garbage", gzip.compress(b" ")[: rnd.randrange(1, 20)]])
    else:
        gz[-8 + rnd.randrange(8)] ^= 0xFF  # CRC or length trailer
    return bytes(gz)


def check(path: Path, rnd: random.Random, what: str) -> None:
    """Load ``path`` as the loader's users do (random salvage and chunk sizes): it loads, or
    raises TraceError naming the file and a location."""
    salvage = rnd.random() < 0.3
    chunk = rnd.choice([None, None, 64, 1000, 1 << 14])
    try:
        parse_trace(path, salvage=salvage, chunk_bytes=chunk, block_bytes=chunk, workers=0, limits=LIMITS)
        _STATS[f"{what}: loaded"] += 1
    except TraceError as e:
        _STATS[f"{what}: TraceError"] += 1
        assert e.path == str(path), e
        assert e.offset is not None or e.event_index is not None, f"no location: {e}"
    _STATS[f"{what}: inputs"] += 1


@pytest.mark.parametrize("seed_file", SEEDS, ids=lambda s: s.split("/")[0])
def test_mutated_real_traces(tmp_path, seed_file):
    base = _text(seed_file)
    for k in range(25 * BUDGET):
        seed = f"{seed_file}#{k}"
        rnd = random.Random(seed)
        data = mutate(base, rnd)
        gz = rnd.random() < 0.25
        p = tmp_path / ("m.json.gz" if gz else "m.json")
        p.write_bytes(gzip.compress(data, 1) if gz else data)
        try:
            check(p, rnd, "loader mutated JSON")
        except Exception as exc:
            raise AssertionError(f"input {seed!r} (gz={gz}): {type(exc).__name__}: {exc}") from exc


@pytest.mark.parametrize("seed_file", SEEDS[:4], ids=lambda s: s.split("/")[0])
def test_damaged_gzip_streams(tmp_path, seed_file):
    base = _text(seed_file)
    for k in range(15 * BUDGET):
        seed = f"gz:{seed_file}#{k}"
        rnd = random.Random(seed)
        p = tmp_path / "m.json.gz"
        p.write_bytes(mutate_gzip(base, rnd))
        try:
            check(p, rnd, "loader damaged gzip")
        except Exception as exc:
            raise AssertionError(f"input {seed!r}: {type(exc).__name__}: {exc}") from exc


json_value = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=20,
)
hostile_event = st.dictionaries(
    st.sampled_from(["ph", "name", "cat", "ts", "dur", "pid", "tid", "id", "args", "s", "bp"]),
    json_value,
    max_size=8,
)


@st.composite
def hostile_document(draw):
    kind = draw(st.integers(0, 3))
    if kind == 0:
        return draw(document())
    if kind == 1:
        return {
            "traceEvents": draw(st.lists(hostile_event, max_size=20)),
            **draw(st.dictionaries(st.text(max_size=5), json_value, max_size=3)),
        }
    if kind == 2:
        return draw(st.lists(hostile_event, max_size=20))
    return draw(json_value)


@settings(
    max_examples=150 * BUDGET,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(doc=hostile_document(), indent=st.booleans(), gz=st.booleans(), seed=st.integers(0, 2**32 - 1))
def test_generated_documents(tmp_path_factory, doc, indent, gz, seed):
    # the standard library writes what orjson refuses (integers beyond 64 bits, NaN, Infinity)
    raw = json.dumps(doc, indent=2 if indent else None).encode()
    p = tmp_path_factory.mktemp("gen") / ("t.json.gz" if gz else "t.json")
    p.write_bytes(gzip.compress(raw, 1) if gz else raw)
    check(p, random.Random(seed), "loader generated documents")


def test_zz_report_counts(capsys):
    """Prints the inputs tried per surface (run with -s to see them); the last test here."""
    with capsys.disabled():
        for key in sorted(_STATS):
            print(f"fuzz {key}: {_STATS[key]}")
