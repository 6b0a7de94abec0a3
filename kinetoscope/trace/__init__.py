"""Trace files -> typed Polars tables (``Trace``). See ``kinetoscope.trace.schema`` for the
tables and ``docs/trace-loading.md`` for formats, rank discovery, cache, salvage and errors."""

from kinetoscope.trace.cache import TraceCache, default_cache_dir
from kinetoscope.trace.discover import RankProblem, TraceList, check_ranks, expand_paths
from kinetoscope.trace.errors import TraceError
from kinetoscope.trace.loader import load_trace, load_traces, parse_trace, prestart_workers
from kinetoscope.trace.model import Trace, TraceMeta
from kinetoscope.trace.reference import load_trace_reference

__all__ = [
    "RankProblem",
    "Trace",
    "TraceCache",
    "TraceError",
    "TraceList",
    "TraceMeta",
    "check_ranks",
    "default_cache_dir",
    "expand_paths",
    "load_trace",
    "load_trace_reference",
    "load_traces",
    "parse_trace",
    "prestart_workers",
]
