"""HTA (traceinsight 0.6.1) as a test oracle, and the input transformations that make our
analyses see what HTA sees.

How the comparison is set up, and why:

* HTA is loaded with ``include_last_profiler_step=True``. Its default drops the last
  ProfilerStep and every kernel launched in it (HTA issue #76); we keep every step, so the
  comparison is made on the whole trace. (Because of HTA's unaligned ``end`` column, this flag
  in fact keeps *all* host events, hta_features.md §6.1.)
* Even with that flag, when a trace has at least two ``ProfilerStep#N`` names, HTA drops every
  device event whose ``correlation`` matches no host event (kernels launched before the trace
  window). We keep them. ``hta_view`` drops them too before our analyses run.
* HTA rounds ns-resolution traces (fractional µs ``ts``) to integer µs: ``ceil(ts)``,
  ``floor(ts + dur)``, in float64 (so ``ts + dur`` is first rounded to the float grid, 0.25 µs
  at today's epoch timestamps). ``hta_view`` applies the same rounding to our integer-ns tables, so the
  numbers can be compared exactly instead of within a rounding-sized tolerance.
* HTA's temporal breakdown, kernel breakdown and overlap take every row with a stream
  (``stream != -1``): that includes ``cuda_sync`` rows that name a stream (Stream Sync, but
  not Event/Context Sync, which carry ``stream: -1``) and, in the Triton trace, a ``cpu_op``
  carrying a stream. We leave those out on purpose; ``hta_view(stream_rows_as_device=True)``
  relabels them as kernels for those comparisons. Separate tests show what the difference is.
* HTA's rank is 0 when the file has no ``distributedInfo.rank``; ``hta_rank`` mirrors that.
"""

from __future__ import annotations

import csv
import functools
import logging
import shutil
import tempfile
from pathlib import Path

import polars as pl

from kinetoscope.trace import Trace, load_trace

TRACES = Path(__file__).resolve().parents[1] / "data" / "traces"
HTA_DIR = TRACES / "hta"

# Same blob as another entry (kept out to save time): critical_path/simple_add (absent here),
# timeline_analysis/sampled_rank-0 == trace_filter/sampled_rank-0 (also absent here).
_SKIP = {
    "hta/critical_path/end_to_end/simple_add/output/overlaid_critical_path_trace.json.gz",  # derived
    "hta/mtia_trace_single_rank/mtia_rank_0.json.gz",  # 87 MB of MTIA: see test_mtia_* (slow)
}


def gpu_traces() -> list[str]:
    """Every trace in the corpus with device events (paths relative to tests/data/traces/hta)."""
    out = []
    with open(TRACES / "MANIFEST.tsv") as fh:
        for row in csv.DictReader(fh, delimiter="\t"):
            rel = row["rel"]
            if rel in _SKIP or not rel.startswith("hta/"):
                continue
            if int(row["kernels"] or 0) > 0 or "mtia_inference" in rel:
                out.append(rel[len("hta/") :])
    return sorted(out)


@functools.cache
def ours(rel: str) -> Trace:
    return load_trace(HTA_DIR / rel, cache=False)


def hta_rank(trace: Trace) -> int:
    return trace.meta.rank if trace.meta.rank is not None else 0


_tmp_root: list[Path] = []


@functools.cache
def hta(rel: str):
    """A loaded ``hta.trace_analysis.TraceAnalysis`` for one trace (copied to a temp dir first,
    since HTA may write beside its input), cached for the whole session."""
    logging.getLogger("hta").setLevel(logging.ERROR)
    from hta.configs.config import logger as hta_logger
    from hta.trace_analysis import TraceAnalysis

    hta_logger.setLevel(logging.ERROR)
    if not _tmp_root:
        _tmp_root.append(Path(tempfile.mkdtemp(prefix="kscope-hta-")))
    dst_dir = _tmp_root[0] / rel.replace("/", "__")
    dst_dir.mkdir(parents=True, exist_ok=True)
    dst = dst_dir / Path(rel).name
    shutil.copyfile(HTA_DIR / rel, dst)
    rank = hta_rank(ours(rel))
    return TraceAnalysis(
        trace_files={rank: str(dst)}, trace_dir=str(dst_dir), include_last_profiler_step=True
    )


def cleanup() -> None:
    for p in _tmp_root:
        shutil.rmtree(p, ignore_errors=True)
    _tmp_root.clear()


def _is_ns_trace(trace: Trace) -> bool:
    ev = trace.events
    return bool(((ev["ts"] % 1000) != 0).any()) or bool(((trace.flows["ts"] % 1000) != 0).any())


@functools.cache
def _hta_view_cached(rel: str, stream_rows_as_device: bool, drop_last_step: bool) -> Trace:
    return hta_view(ours(rel), stream_rows_as_device=stream_rows_as_device, drop_last_step=drop_last_step)


def hta_view_of(rel: str, *, stream_rows_as_device: bool = False, drop_last_step: bool = False) -> Trace:
    return _hta_view_cached(rel, stream_rows_as_device, drop_last_step)


@functools.cache
def _raw_float_times(path: str) -> pl.DataFrame:
    """``idx, _ts_f, _dur_f``: the float64 µs values of every complete event, as HTA reads them."""
    import gzip

    import orjson

    with open(path, "rb") as fh:
        data = fh.read()
    if data[:2] == b"\x1f\x8b":
        data = gzip.decompress(data)
    doc = orjson.loads(data)
    events = doc["traceEvents"] if isinstance(doc, dict) else doc
    idx, ts, dur = [], [], []
    for i, e in enumerate(events):
        if isinstance(e, dict) and e.get("ph") == "X":
            idx.append(i)
            ts.append(float(e["ts"]))
            dur.append(float(e["dur"]))
    return pl.DataFrame(
        {"idx": idx, "_ts_f": ts, "_dur_f": dur},
        schema={"idx": pl.Int64, "_ts_f": pl.Float64, "_dur_f": pl.Float64},
    )


def hta_view(trace: Trace, *, stream_rows_as_device: bool = False, drop_last_step: bool = False) -> Trace:
    """Our trace transformed the way HTA's loader transforms it (see module docstring).

    ``drop_last_step`` reproduces HTA's *default* load instead (``include_last_profiler_step=
    False``): host events that start at or after the start of the last ProfilerStep are dropped,
    and so is every device event whose correlation is not among the remaining host events."""
    ev = trace.events
    if _is_ns_trace(trace):
        # HTA works on the float64 µs values of the file: at ~1.7e15 µs a float64 step is
        # 0.25 µs, so ``ts + dur`` is itself rounded before ``floor``. Our ns integers cannot
        # give those floats back exactly, so redo HTA's arithmetic on the file's own numbers.
        raw = _raw_float_times(trace.path)
        ev = (
            ev.join(raw, on="idx", how="left")
            .with_columns(_end_f=pl.col("_ts_f") + pl.col("_dur_f"))
            .with_columns(
                ts=pl.col("_ts_f").ceil().cast(pl.Int64) * 1000,
                _end=pl.col("_end_f").floor().cast(pl.Int64) * 1000,
            )
            .with_columns(dur=pl.col("_end") - pl.col("ts"))
            .drop("_ts_f", "_dur_f", "_end_f", "_end")
        )
    steps = ev.filter(pl.col("name").str.contains(r"^ProfilerStep#\d+"))["name"].n_unique()
    if steps >= 2 and trace.meta.device_type != "MTIA":
        is_gpu = (pl.col("stream").is_not_null() & pl.col("correlation").is_not_null()) | pl.col(
            "name"
        ).is_in(["Event Sync", "Context Sync"])
        cpu = ev.filter(~is_gpu)
        if drop_last_step:
            last_start = cpu.filter(pl.col("name").str.contains(r"^ProfilerStep#\d+"))["ts"].max()
            cpu = cpu.filter(pl.col("ts") < last_start)
        cpu_corr = cpu.filter(pl.col("correlation").is_not_null())["correlation"].unique()
        keep_cpu = cpu.select("idx")
        ev = ev.filter(
            (~is_gpu & pl.col("idx").is_in(keep_cpu["idx"].implode()))
            | (is_gpu & pl.col("correlation").is_in(cpu_corr.implode()))
        )
    if stream_rows_as_device:
        ev = ev.with_columns(
            kind=pl.when(
                pl.col("stream").is_not_null()
                & (pl.col("stream") != -1)
                & ~pl.col("kind").is_in(["kernel", "gpu_memcpy", "gpu_memset"])
            )
            .then(pl.lit("kernel").cast(ev.schema["kind"]))
            .otherwise(pl.col("kind"))
        )
    return Trace(
        meta=trace.meta,
        events=ev,
        flows=trace.flows,
        counters=trace.counters,
        instants=trace.instants,
        processes=trace.processes,
        threads=trace.threads,
    )


def pd_to_pl(df) -> pl.DataFrame:
    """pandas -> polars without pyarrow (pandas 3 string columns need it otherwise)."""
    df = df.reset_index(drop=True)
    cols = {}
    for c in df.columns:
        values = df[c].tolist()
        cols[str(c)] = [None if (isinstance(v, float) and v != v) else v for v in values]
    return pl.DataFrame(cols, strict=False)
