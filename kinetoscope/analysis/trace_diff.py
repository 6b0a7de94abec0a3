"""Trace diff: which ops and kernels were added, removed or changed between two traces
(HTA ``TraceDiff.compare_traces`` / ``ops_diff``, §1.20).

Definition. For each trace, the selected events are grouped by name (or by HTA's
``shorten_name`` with ``use_short_name``) into a count and a total duration (µs). The two
summaries are outer-joined (missing = 0) into one row per name:

* ``{control}_counts``, ``{control}_total_duration``, ``{test}_counts``, ``{test}_total_duration``
  (labels default to HTA's ``Control`` / ``Test``);
* ``diff_counts`` = test − control, ``diff_duration`` = test − control (µs);
* ``counts_change_categories``: ``+``, ``-`` or ``=`` (HTA);
* ``count_change``: ``added`` (only in test), ``deleted`` (only in control), ``increased``,
  ``decreased`` or ``unchanged`` (in both; by count, like HTA's ``ops_diff`` lists, so an op
  that runs as often but longer is ``unchanged`` with a non-zero ``diff_duration``);
* ``device``: ``gpu`` for kernels, memcpy, memset, CUDA sync rows and GPU annotations, else
  ``cpu``.

Rows are sorted by ``|diff_duration|`` (largest change first), then name.

Selection: ``device`` = ``all`` | ``cpu`` | ``gpu``; ``step`` = None (whole trace, the default:
unlike HTA, traces without ProfilerStep annotations can be compared), ``"first"`` (HTA's
default: the first step of each trace), a step number, or a list of step numbers; steps come
from ``steps.assign_steps`` (device events belong to the step that launched them).
``control_step`` / ``test_step`` select differently in each trace. ``trace_diff_by_step``
repeats the diff for every step number present in both traces.

A diff of a trace with itself has no added/deleted rows and all ``diff_*`` are 0.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Union

import polars as pl

from kinetoscope.analysis.names import shorten_name
from kinetoscope.analysis.steps import assign_steps, detect_steps
from kinetoscope.trace.model import Trace
from kinetoscope.trace.schema import DEVICE_KINDS

GPU_SIDE_KINDS: frozenset[str] = frozenset(DEVICE_KINDS) | {"cuda_sync", "gpu_user_annotation"}
StepSel = Union[None, int, str, Sequence[int]]
CHANGES = ("added", "deleted", "increased", "decreased", "unchanged")


def _select(trace: Trace, step: StepSel, device: str) -> pl.DataFrame:
    ev = trace.events.filter(pl.col("kind") != "trace").with_columns(
        pl.col("kind").cast(pl.String).is_in(list(GPU_SIDE_KINDS)).alias("_gpu")
    )
    if device == "cpu":
        ev = ev.filter(~pl.col("_gpu"))
    elif device == "gpu":
        ev = ev.filter(pl.col("_gpu"))
    elif device != "all":
        raise ValueError(f"device must be 'all', 'cpu' or 'gpu', not {device!r}")
    if step is None:
        return ev
    steps = detect_steps(trace)
    if steps.is_empty():
        raise ValueError(f"{trace.path}: no steps (ProfilerStep#N or Optimizer.step) to select from")
    available = sorted(steps["step"].to_list())
    if isinstance(step, str):
        if step != "first":
            raise ValueError(f"step must be a number, a list of numbers, 'first' or None, not {step!r}")
        wanted = [available[0]]
    elif isinstance(step, int):
        wanted = [step]
    else:
        wanted = [int(s) for s in step]
    missing = [s for s in wanted if s not in available]
    if missing:
        raise ValueError(f"{trace.path}: no step {missing[0]} (steps: {available[0]}..{available[-1]})")
    return assign_steps(trace, ev, steps).filter(pl.col("step").is_in(wanted))


def ops_summary(
    trace: Trace, *, step: StepSel = None, device: str = "all", use_short_name: bool = False
) -> pl.DataFrame:
    """HTA ``LabeledTrace.get_ops_summary`` grouped by name: ``name, device, counts,
    total_duration`` (µs)."""
    ev = _select(trace, step, device)
    names = ev.select(pl.col("name").unique())
    if use_short_name:
        names = names.with_columns(
            pl.col("name").map_elements(shorten_name, return_dtype=pl.String).alias("_key")
        )
    else:
        names = names.with_columns(pl.col("name").alias("_key"))
    return (
        ev.join(names, on="name", how="left")
        .group_by("_key")
        .agg(
            pl.col("_gpu").any().alias("_gpu"),
            pl.col("dur").count().cast(pl.Int64).alias("counts"),
            (pl.col("dur").sum() / 1000).alias("total_duration"),
        )
        .select(
            pl.col("_key").alias("name"),
            pl.when(pl.col("_gpu")).then(pl.lit("gpu")).otherwise(pl.lit("cpu")).alias("device"),
            "counts",
            "total_duration",
        )
    )


def trace_diff(
    control: Trace,
    test: Trace,
    *,
    step: StepSel = None,
    control_step: StepSel = None,
    test_step: StepSel = None,
    device: str = "all",
    use_short_name: bool = False,
    labels: tuple[str, str] = ("Control", "Test"),
) -> pl.DataFrame:
    """Per op/kernel name: counts and total durations in both traces and their difference (see
    the module docstring). ``step`` applies to both traces unless ``control_step`` /
    ``test_step`` are given."""
    c_label, t_label = labels
    if c_label == t_label:  # HTA mangles the test label the same way
        t_label = f"{t_label}_control_test"
    cs = control_step if control_step is not None else step
    ts = test_step if test_step is not None else step
    a = ops_summary(control, step=cs, device=device, use_short_name=use_short_name)
    b = ops_summary(test, step=ts, device=device, use_short_name=use_short_name)
    cc, cd = f"{c_label}_counts", f"{c_label}_total_duration"
    tc, td = f"{t_label}_counts", f"{t_label}_total_duration"
    df = a.rename({"counts": cc, "total_duration": cd, "device": "_dev_a"}).join(
        b.rename({"counts": tc, "total_duration": td, "device": "_dev_b"}),
        on="name",
        how="full",
        coalesce=True,
    )
    df = df.with_columns(
        pl.col(cc).fill_null(0),
        pl.col(tc).fill_null(0),
        pl.col(cd).fill_null(0.0),
        pl.col(td).fill_null(0.0),
        pl.coalesce("_dev_b", "_dev_a").alias("device"),
    ).with_columns(
        (pl.col(tc) - pl.col(cc)).alias("diff_counts"),
        (pl.col(td) - pl.col(cd)).alias("diff_duration"),
    )
    df = df.with_columns(
        pl.when(pl.col("diff_counts") > 0)
        .then(pl.lit("+"))
        .when(pl.col("diff_counts") < 0)
        .then(pl.lit("-"))
        .otherwise(pl.lit("="))
        .alias("counts_change_categories"),
        pl.when(pl.col(cc) == 0)
        .then(pl.lit("added"))
        .when(pl.col(tc) == 0)
        .then(pl.lit("deleted"))
        .when(pl.col("diff_counts") > 0)
        .then(pl.lit("increased"))
        .when(pl.col("diff_counts") < 0)
        .then(pl.lit("decreased"))
        .otherwise(pl.lit("unchanged"))
        .alias("count_change"),
    )
    return df.select(
        "name",
        "device",
        cc,
        cd,
        tc,
        td,
        "diff_counts",
        "diff_duration",
        "counts_change_categories",
        "count_change",
    ).sort([pl.col("diff_duration").abs(), pl.col("name")], descending=[True, False])


def ops_diff(diff: pl.DataFrame) -> dict[str, list[str]]:
    """HTA ``ops_diff``: names that were added, deleted, increased, decreased, unchanged."""
    out: dict[str, list[str]] = {k: [] for k in CHANGES}
    if diff.is_empty():
        return out
    for change, names in (
        diff.sort("name").group_by("count_change", maintain_order=True).agg(pl.col("name")).iter_rows()
    ):
        out[change] = list(names)
    return out


def trace_diff_by_step(control: Trace, test: Trace, **kwargs: Any) -> pl.DataFrame:
    """``trace_diff`` for every step number present in both traces, with a ``step`` column."""
    a = set(detect_steps(control)["step"].to_list())
    b = set(detect_steps(test)["step"].to_list())
    frames = [
        trace_diff(control, test, step=s, **kwargs).with_columns(pl.lit(s, dtype=pl.Int64).alias("step"))
        for s in sorted(a & b)
    ]
    if not frames:
        return (
            trace_diff(control, test, **kwargs)
            .with_columns(pl.lit(None, dtype=pl.Int64).alias("step"))
            .clear()
        )
    return pl.concat(frames).select("step", pl.exclude("step"))


def diff_document(
    control: Trace, test: Trace, diff: pl.DataFrame, *, options: dict[str, Any] | None = None
) -> dict[str, Any]:
    """JSON-ready document for ``kscope diff --json``: ``control`` / ``test`` (trace metadata),
    ``options``, ``trace_diff`` (rows), ``ops_diff`` (name lists) and ``totals``."""
    from kinetoscope.analysis.runner import frame_rows

    counts = diff.group_by("count_change").len()
    totals = {k: 0 for k in CHANGES} | dict(zip(counts["count_change"].to_list(), counts["len"].to_list()))
    return {
        "control": control.meta.to_dict(),
        "test": test.meta.to_dict(),
        "options": dict(options or {}),
        "totals": totals,
        "trace_diff": frame_rows(diff),
        "ops_diff": ops_diff(diff),
    }
