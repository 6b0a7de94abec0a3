"""Derive the malformed-trace cases of this folder from a real 4-rank CPU job.

Source: ``tests/data/cpu_jobs/small_steady_w4`` (torchrun + gloo, traced through ``kscope daemon``,
rank 0 a persistent small straggler). Each case is that job with one thing wrong, as seen in the
field (issue 28). Run from the repository root: ``python tests/data/malformed_jobs/make_cases.py``.
The output is deterministic (gzip mtime 0).
"""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
SOURCE = HERE.parent / "cpu_jobs" / "small_steady_w4"


def _load(path: Path) -> dict[str, Any]:
    with gzip.open(path, "rt") as f:
        doc: dict[str, Any] = json.load(f)
    return doc


def _write(doc: dict[str, Any], path: Path) -> None:
    raw = json.dumps(doc, separators=(",", ":")).encode()
    with open(path, "wb") as out, gzip.GzipFile(fileobj=out, mode="wb", mtime=0, filename="") as gz:
        gz.write(raw)


def _step_starts(doc: dict[str, Any]) -> list[float]:
    return sorted(e["ts"] for e in doc["traceEvents"] if e.get("name", "").startswith("Optimizer.step#"))


def _window(doc: dict[str, Any], lo: float, hi: float) -> dict[str, Any]:
    """Keep the metadata and the events that lie within [lo, hi] (a shorter trace window)."""
    keep = []
    for e in doc["traceEvents"]:
        if e.get("ph") == "M":
            keep.append(e)
            continue
        ts = float(e.get("ts", 0.0))
        if lo <= ts and ts + float(e.get("dur", 0.0)) <= hi:
            keep.append(e)
    return {**doc, "traceEvents": keep}


def _case(name: str) -> Path:
    out = HERE / name
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir()
    return out


def main() -> None:
    files = sorted(SOURCE.glob("rank-*.pt.trace.json.gz"))
    docs = {f.name: _load(f) for f in files}

    # truncated: rank 1's compressed file cut at 60% of its bytes (a copy or writer killed
    # mid-write); --salvage reads its complete events
    out = _case("truncated_rank1_w4")
    for f in files:
        _write(docs[f.name], out / f.name)
        if f.name.startswith("rank-1_"):
            raw = (out / f.name).read_bytes()
            (out / f.name).write_bytes(raw[: int(len(raw) * 0.6)])

    # empty: rank 2 wrote a trace with 0 events (the profiler started and stopped at once)
    out = _case("empty_rank2_w4")
    for f in files:
        doc = docs[f.name]
        if f.name.startswith("rank-2_"):
            doc = {**doc, "traceEvents": []}
        _write(doc, out / f.name)

    # a rank missing: rank 2's file never arrived
    out = _case("missing_rank2_w4")
    for f in files:
        if not f.name.startswith("rank-2_"):
            shutil.copy(f, out / f.name)

    # a window of one step on every rank
    out = _case("one_step_w4")
    for f in files:
        doc = docs[f.name]
        s = _step_starts(doc)
        _write(_window(doc, s[5] - 1.0, s[6] + 1.0), out / f.name)

    # windows that do not overlap: ranks 0-1 traced the first 6 steps, ranks 2-3 the last 6
    out = _case("disjoint_windows_w4")
    for f in files:
        doc = docs[f.name]
        s = _step_starts(doc)
        early = f.name.startswith(("rank-0_", "rank-1_"))
        _write(_window(doc, s[0] - 1.0, s[6]) if early else _window(doc, s[9], s[-1] + 1e5), out / f.name)

    # staggered windows (a trace taken while the ranks picked the request up at different times):
    # rank r traced 8 steps starting r steps later than rank 0
    out = _case("staggered_windows_w4")
    for f in files:
        doc = docs[f.name]
        s = _step_starts(doc)
        r = int(f.name.split("_")[0].split("-")[1])
        _write(_window(doc, s[r] - 1.0, s[r + 8] - 1.0), out / f.name)


if __name__ == "__main__":
    main()
