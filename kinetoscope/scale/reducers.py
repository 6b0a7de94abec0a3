"""Cross-rank analyses split into a per-rank partial (map, on a worker) and a driver-side reduce.

Imported by both the map (``mapper``) and the reduce (``reduce``) so neither imports the other.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import polars as pl

from kinetoscope.trace.model import Trace


@dataclass(frozen=True)
class Reducer:
    """A cross-rank analysis split into a per-rank partial and a driver-side reduce."""

    map: Callable[[Trace, Mapping[str, Any]], Any]
    reduce: Callable[[list[Any], Mapping[str, Any]], pl.DataFrame]


# kernel_distribution: the top kernels are the union over ranks of each rank's kernel_breakdown
# names, so a rank's rows can depend on other ranks. Each worker sends its own top names and the
# statistics of *every* kernel it ran (one row per distinct kernel: small); the driver keeps the
# rows of the union and orders them as kernel_distribution does.
def _kernel_distribution_map(trace: Trace, opts: Mapping[str, Any]) -> tuple[pl.DataFrame, pl.DataFrame]:
    from kinetoscope.analysis.kernel_breakdown import OTHERS, kernel_breakdown
    from kinetoscope.analysis.kernel_distribution import kernel_distribution

    top = (
        kernel_breakdown([trace], **opts)
        .filter(pl.col("name") != OTHERS)
        .select("kernel_type", "name")
        .unique()
    )
    # no folding (ratio 1.0 and no count limit): every kernel's distribution on this rank
    every = kernel_distribution([trace], 1 << 62, 1.0, opts["include_memory_kernels"])
    return top, every


def _kernel_distribution_reduce(
    parts: list[tuple[pl.DataFrame, pl.DataFrame]], opts: Mapping[str, Any]
) -> pl.DataFrame:
    from kinetoscope.analysis._common import concat_or_empty
    from kinetoscope.analysis.kernel_distribution import DISTRIBUTION_SCHEMA

    keys = ["kernel_type", "name"]
    tops = [t for t, _ in parts if t.height]
    if not tops:
        return pl.DataFrame(schema=DISTRIBUTION_SCHEMA)
    top = pl.concat(tops).unique()
    out = concat_or_empty([every.join(top, on=keys, how="semi") for _, every in parts], DISTRIBUTION_SCHEMA)
    total = pl.col("sum (us)").sum().over(keys)
    return out.sort(
        [pl.col("kernel_type"), total, pl.col("name"), pl.col("rank")],
        descending=[False, True, False, False],
        nulls_last=True,
    )


REDUCERS: dict[str, Reducer] = {
    "kernel_distribution": Reducer(_kernel_distribution_map, _kernel_distribution_reduce),
}
