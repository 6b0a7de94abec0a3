"""Fuzzing the native (C) chunk decoder (issue 14): it reads untrusted bytes.

Byte-level mutations of real traces (tests/data/traces) and hypothesis-generated hostile
documents are loaded with the native decoder and with the Python loader: both must give the
same tables or the same TraceError. Mutated chunks also go straight into
``decode_chunk`` (no splitter in front), where the only acceptable outcomes are a result
or "hand back to Python" — never a crash; ``make asan`` runs this file under
AddressSanitizer/UBSan, which turns any out-of-bounds read into a failure. Inputs are fixed
(seeded ``random.Random``, the derandomized hypothesis profile); ``KSCOPE_FUZZ_BUDGET``
multiplies their number as in tests/fuzz/test_fuzz_loader.py.
"""

from __future__ import annotations

import gzip
import json
import random
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kinetoscope.trace import _native
from tests.fuzz.test_fuzz_loader import BUDGET, LIMITS, SEEDS, TOKENS, _text, hostile_document, mutate
from tests.trace.test_native import assert_same, both

pytestmark = pytest.mark.skipif(not _native.available(), reason="the native decoder is not built")


def _events_text(data: bytes) -> bytes:
    """The ``traceEvents`` array of a document, from its '[' to the end of the data."""
    at = data.find(b'"traceEvents"')
    return data[data.index(b"[", at) :] if at >= 0 else data


@pytest.mark.parametrize("seed_file", SEEDS, ids=lambda s: s.split("/")[0])
def test_mutated_real_traces_match_the_python_path(tmp_path: Path, seed_file: str, fuzz_counts: Any) -> None:
    base = _text(seed_file)
    for k in range(12 * BUDGET):
        seed = f"native:{seed_file}#{k}"
        rnd = random.Random(seed)
        data = mutate(base, rnd)
        p = tmp_path / "m.json"
        p.write_bytes(data)
        chunk = rnd.choice([None, None, 64, 1000, 1 << 14])
        try:
            got, ref, _ = both(p, chunk_bytes=chunk, block_bytes=chunk, limits=LIMITS)
            assert_same(got, ref)
        except Exception as exc:
            raise AssertionError(f"input {seed!r} (chunk {chunk}): {type(exc).__name__}: {exc}") from exc
    fuzz_counts["native decoder: files"] += 12 * BUDGET


@pytest.mark.parametrize("seed_file", SEEDS, ids=lambda s: s.split("/")[0])
def test_mutated_chunks_never_crash(seed_file: str, fuzz_counts: Any) -> None:
    """Straight into the decoder: every input decodes or is handed back, nothing else."""
    base = _events_text(_text(seed_file))
    if "cupti" not in seed_file:  # (CUPTI profiler ranges always go to the Python path)
        assert _native.decode(base) is not None, "the unmutated events are not decoded natively"
    for k in range(150 * BUDGET):
        rnd = random.Random(f"chunk:{seed_file}#{k}")
        data = mutate(base, rnd)
        if rnd.random() < 0.3:  # a short piece: boundaries and truncation everywhere
            i = rnd.randrange(len(data) + 1)
            data = data[i : i + rnd.choice([1, 16, 256, 4096])]
        got = _native.decode(data if rnd.random() < 0.5 else bytearray(data))
        if got is not None:
            assert got.n_events >= 0
            for df in got.frames.values():
                assert df.height >= 0
    fuzz_counts["native decoder: chunks"] += 150 * BUDGET


@settings(
    max_examples=80 * BUDGET,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(
    doc=hostile_document(), indent=st.booleans(), gz=st.booleans(), token=st.sampled_from([b"", *TOKENS[:12]])
)
def test_hostile_documents_match_the_python_path(
    tmp_path_factory: pytest.TempPathFactory, doc: Any, indent: bool, gz: bool, token: bytes, fuzz_counts: Any
) -> None:
    raw = json.dumps(doc, indent=2 if indent else None).encode()
    if token:  # one hostile token in the middle
        i = len(raw) // 2
        raw = raw[:i] + token + raw[i:]
    p = tmp_path_factory.mktemp("hostile") / ("t.json.gz" if gz else "t.json")
    p.write_bytes(gzip.compress(raw, 1) if gz else raw)
    got, ref, _ = both(p, limits=LIMITS)
    assert_same(got, ref)
    fuzz_counts["native decoder: generated"] += 1
