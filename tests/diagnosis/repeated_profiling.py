"""A synthetic repeated-profiling set: later profiling runs with kernels stamped before their launch.

Profiling one process again and again is known to corrupt the device timestamps at the start of
each later profiling run (PyTorch issues #192021 and #175790): kernels appear to start before
the host launched them. ``corrupt`` reproduces that on a real trace: every device event
(kernel, memcpy, memset) that starts in the first ``window_us`` of the trace's device work is
moved ``shift_us`` earlier, ahead of its launch. ``sample_set`` writes ``n`` samples of one job
folder, the first clean and the later ones corrupted, as the autopilot would collect them.
"""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path
from typing import Any

DEVICE_CATS = {"kernel", "gpu_memcpy", "gpu_memset"}


def corrupt(
    doc: dict[str, Any], shift_us: float = 2_000.0, window_us: float = 60_000.0
) -> tuple[dict[str, Any], int]:
    """``doc`` with its early device events shifted before their launches; and how many moved."""
    dev = [e for e in doc["traceEvents"] if e.get("ph") == "X" and e.get("cat") in DEVICE_CATS]
    if not dev:
        return doc, 0
    t0 = min(float(e["ts"]) for e in dev)
    moved = 0
    out = []
    for e in doc["traceEvents"]:
        if e.get("ph") == "X" and e.get("cat") in DEVICE_CATS and float(e["ts"]) < t0 + window_us:
            e = {**e, "ts": float(e["ts"]) - shift_us}
            moved += 1
        out.append(e)
    return {**doc, "traceEvents": out}, moved


def sample_set(source: Path, dest: Path, n: int = 4) -> list[Path]:
    """``n`` sample folders of the job in ``source``: ``sample-1`` clean, the others corrupted."""
    out = []
    for k in range(1, n + 1):
        d = dest / f"sample-{k}"
        d.mkdir(parents=True, exist_ok=True)
        for f in sorted(source.glob("rank-*.json.gz")):
            if k == 1:
                shutil.copy(f, d / f.name)
                continue
            with gzip.open(f, "rt") as fh:
                doc, _ = corrupt(json.load(fh))
            with gzip.open(d / f.name, "wt") as fh:
                json.dump(doc, fh)
        out.append(d)
    return out
