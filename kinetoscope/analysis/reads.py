"""What the core analyses read from a trace (``AnalysisSpec.reads``), in a module with no import
so that the static table of ``kinetoscope.analysis.builtins`` can name it without loading Polars:
a map task loads only the columns its analyses read (docs/scale.md, docs/performance.md "One huge
trace")."""

from __future__ import annotations

# Columns the analyses read from device events (the rest of the 40+ columns are not copied).
DEVICE_COLUMNS = ("idx", "kind", "name", "pid", "tid", "ts", "dur", "stream", "correlation", "memory_bw_gbps")
# ``AnalysisSpec.reads`` of the core analyses (steps, temporal, idle time, kernel breakdowns,
# overlap, user annotations, launch statistics, queue and memory-bandwidth counters): the
# events columns of the device frame, the launch links and the step detection, no other table.
# ``tests/analysis/test_reads.py`` checks each result is the same on a trace loaded with only these.
CORE_READS: dict[str, tuple[str, ...]] = {"events": DEVICE_COLUMNS}

# The heavier analyses (``default=False``: run with ``--only``), each checked the same way.
# The call graph (host call stacks + the device events under their launches): the host events'
# kind, name, thread and times, the launch links (``correlation``) and the device events
# (``stream``). Call graph, kernel sequences and ATen op -> kernel rows read nothing else.
CALL_GRAPH_READS: dict[str, tuple[str, ...]] = {
    "events": ("idx", "kind", "name", "pid", "tid", "ts", "dur", "stream", "correlation"),
}
# The critical path's graph: the call graph's events, plus the stream waits that make its
# cross-stream edges (``cudaStreamWaitEvent``: the stream and the event record's correlation)
# and the raw category of the rows of ``critical_path_breakdown``.
CRITICAL_PATH_READS: dict[str, tuple[str, ...]] = {
    "events": (*CALL_GRAPH_READS["events"], "cat", "wait_on_stream", "wait_on_cuda_event_record_corr_id"),
}
# The ``[memory]`` instant events: which device, when, the bytes allocated (> 0) or freed (< 0)
# and the allocator's totals after it; no event column beyond the loader's own.
_MEMORY_EVENT = ("idx", "name", "ts", "device_type", "device_id", "bytes")
MEMORY_READS: dict[str, tuple[str, ...]] = {
    "events": (),
    "instants": (*_MEMORY_EVENT, "total_allocated", "total_reserved"),
}
# Allocation sites: each allocation placed in its thread's host call stack (call graph); no totals.
MEMORY_SITES_READS: dict[str, tuple[str, ...]] = {
    "events": CALL_GRAPH_READS["events"],
    "instants": (*_MEMORY_EVENT, "pid", "tid"),
}
# CUPTI counters: the ``cuda_profiler_range`` events (with their category) and their launches in
# the call graph, and the counter values (``counters``: one row per event and counter key).
CUPTI_READS: dict[str, tuple[str, ...]] = {
    "events": (*CALL_GRAPH_READS["events"], "cat"),
    "counters": ("idx", "key", "value"),
}
