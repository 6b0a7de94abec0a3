"""DataFrames as JSON-ready row objects, shared by the diagnosis report and its parts (one
place below both, so the parts need not import the report that imports them)."""

from __future__ import annotations

import math
from typing import Any

import polars as pl


def frame_rows(df: pl.DataFrame) -> list[dict[str, Any]]:
    """A DataFrame as JSON-ready row objects (NaN/inf become null)."""
    if df.is_empty():
        return []
    rows = df.to_dicts()
    for row in rows:
        for k, v in row.items():
            if isinstance(v, float) and not math.isfinite(v):
                row[k] = None
    return rows
