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
