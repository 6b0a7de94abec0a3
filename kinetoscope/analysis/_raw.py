"""Reading and writing raw trace JSON for overlays (private to the heavy analyses).

Overlays (critical path, frequent kernel sequences) need the original events to copy them into
a new file, so they re-read the file with orjson. This is deliberately independent of the
loader: the loader builds typed tables and drops what the schema does not keep.
"""

from __future__ import annotations

import gzip
import os
from pathlib import Path
from typing import Any

import orjson

_gzip: Any  # isal's igzip (untyped), or the stdlib gzip module
try:  # isal is a pinned dependency; fall back to the stdlib if a build lacks it
    from isal import igzip as _gzip
except ImportError:  # pragma: no cover
    _gzip = gzip


def read_raw_bytes(path: str | os.PathLike[str]) -> bytes:
    """File bytes, gunzipped when the file starts with the gzip magic."""
    with open(path, "rb") as fh:
        head = fh.read(2)
        fh.seek(0)
        if head == b"\x1f\x8b":
            with _gzip.open(fh) as gz:
                data: bytes = gz.read()
                return data
        return fh.read()


def read_raw_trace(path: str | os.PathLike[str]) -> tuple[dict[str, Any], list[Any]]:
    """(document, its ``traceEvents`` list). A legacy top-level array becomes a document."""
    doc = orjson.loads(read_raw_bytes(path))
    if isinstance(doc, list):
        doc = {"traceEvents": doc}
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        raise ValueError(f"{path}: not a Kineto trace (no traceEvents array)")
    return doc, doc["traceEvents"]


def write_raw_trace(path: str | os.PathLike[str], doc: dict[str, Any]) -> None:
    """Write a trace document; gzip when the name ends in ``.gz``."""
    data = orjson.dumps(doc)
    if str(path).endswith(".gz"):
        with gzip.open(path, "wb", compresslevel=6) as fh:
            fh.write(data)
    else:
        with open(path, "wb") as fh:
            fh.write(data)


def output_path(output: str | os.PathLike[str], trace_path: str, prefix: str) -> str:
    """``output`` itself, or ``output/<prefix><trace file name>`` when it is a directory.
    Refuses to overwrite the input trace."""
    out = Path(output)
    if out.is_dir():
        out = out / (prefix + Path(trace_path).name)
    if trace_path and out.exists() and out.resolve() == Path(trace_path).resolve():
        raise ValueError(f"refusing to overwrite the input trace {trace_path}")
    out.parent.mkdir(parents=True, exist_ok=True)
    return str(out)
