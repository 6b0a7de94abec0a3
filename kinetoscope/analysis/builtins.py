"""The built-in analyses, listed without importing them: name, description, options and the
rest of each ``AnalysisSpec``, plus where its function lives (``"module:function"``).

Why a table: ``kscope analyze --list``, ``--only`` validation, the display order and the
map/reduce plan need every analysis's metadata, but importing the ~15 analysis modules (numpy
and a few thousand lines of code with them) costs a few hundred milliseconds of every command's
start-up (issue 14). ``kinetoscope.analysis.registry`` builds lazy specs from this table and
imports a module only when one of its analyses runs.

Each module still registers its analyses at import time (``register(AnalysisSpec(...))`` next to
the function); the registry checks that registration against this table and refuses a mismatch,
and ``tests/analysis/test_registry_table.py`` imports every module and compares, so the two cannot
drift. Adding a built-in analysis: register it in its module, add its module to
``registry._BUILTIN_MODULES`` and its entry here (the test prints the entry to paste).

This module is plain data: it imports nothing from the analyses or the registry.
"""

from __future__ import annotations

from typing import Any

from kinetoscope.analysis.reads import (
    CALL_GRAPH_READS,
    CORE_READS,
    CRITICAL_PATH_READS,
    CUPTI_READS,
    MEMORY_READS,
    MEMORY_SITES_READS,
)

# ("module:function", AnalysisSpec fields other than ``func``), in display order.
# the options of the two critical-path analyses (one graph, two views of it)
_CRITICAL_PATH_OPTIONS: dict[str, Any] = {
    "annotation": None,
    "instance_id": 0,
    "data_load_events": None,
    "add_zero_weight_launch_edges": False,
}

BUILTIN_ANALYSES: tuple[tuple[str, dict[str, Any]], ...] = (
    (
        "kinetoscope.analysis.steps:step_durations",
        {
            "name": "step_durations",
            "description": "Training steps per rank (ProfilerStep#N, else optimizer steps) and their durations.",
            "needs_gpu": False,
            "order": 5,
            "group": "steps",
            "empty_note": "no steps found (no ProfilerStep#N or Optimizer.step annotations)",
            "combine": "concat_by_rank",
            "reads": CORE_READS,
        },
    ),
    (
        "kinetoscope.analysis.temporal:temporal_breakdown",
        {
            "name": "temporal_breakdown",
            "description": "GPU time per rank split into idle, compute and non-compute (HTA temporal breakdown).",
            "order": 10,
            "combine": "concat",
            "reads": CORE_READS,
        },
    ),
    (
        "kinetoscope.analysis.temporal:temporal_breakdown_by_step",
        {
            "name": "temporal_breakdown_by_step",
            "description": "Temporal breakdown per training step (kernels assigned to the step that launched them).",
            "order": 11,
            "group": "steps",
            "empty_note": "no steps found (no ProfilerStep#N or Optimizer.step annotations)",
            "combine": "concat_by_rank",
            "reads": CORE_READS,
        },
    ),
    (
        "kinetoscope.analysis.idle_time:idle_time_breakdown",
        {
            "name": "idle_time_breakdown",
            "description": "GPU idle time per rank and stream: host wait, kernel wait (< 30 µs gaps), other.",
            "options": {"consecutive_kernel_delay_us": 30.0, "streams": None},
            "order": 20,
            "combine": "concat_by_rank",
            "reads": CORE_READS,
        },
    ),
    (
        "kinetoscope.analysis.idle_time:idle_time_interval_stats",
        {
            "name": "idle_time_interval_stats",
            "description": "Statistics of the idle gaps per rank, stream and idle category.",
            "default": False,
            "options": {"consecutive_kernel_delay_us": 30.0, "streams": None},
            "order": 21,
            "combine": "concat_by_rank",
            "reads": CORE_READS,
        },
    ),
    (
        "kinetoscope.analysis.kernel_breakdown:kernel_type_breakdown",
        {
            "name": "kernel_type_breakdown",
            "description": "GPU busy time per rank by kernel type, exclusive and overlapping (compute/comm/memory).",
            "options": {"include_memory_kernels": True},
            "order": 30,
            "combine": "concat_by_rank",
            "reads": CORE_READS,
        },
    ),
    (
        "kinetoscope.analysis.kernel_breakdown:kernel_breakdown",
        {
            "name": "kernel_breakdown",
            "description": "Top kernels per rank and kernel type with per-call duration statistics.",
            "options": {"num_kernels": 10, "duration_ratio": 0.8, "include_memory_kernels": True},
            "order": 31,
            "combine": "concat",
            "reads": CORE_READS,
        },
    ),
    (
        "kinetoscope.analysis.kernel_distribution:kernel_distribution",
        {
            "name": "kernel_distribution",
            "description": "Per top kernel and rank: call count and duration distribution (mean, min, max, std, p50/p90/p99).",
            "options": {"num_kernels": 10, "duration_ratio": 0.8, "include_memory_kernels": True},
            "order": 32,
            "combine": "reduce",
            "reads": CORE_READS,
        },
    ),
    (
        "kinetoscope.analysis.comm_overlap:comm_comp_overlap",
        {
            "name": "comm_comp_overlap",
            "description": "Share of communication-kernel time overlapped by computation kernels, per rank.",
            "order": 40,
            "combine": "concat_by_rank",
            "reads": CORE_READS,
        },
    ),
    (
        "kinetoscope.analysis.user_annotation:gpu_user_annotation_breakdown",
        {
            "name": "gpu_user_annotation_breakdown",
            "description": "Time per GPU user annotation (record_function ranges on the GPU timeline), per rank.",
            "options": {
                "use_gpu_annotation": True,
                "num_kernels": 1000,
                "duration_ratio": 0.8,
                "allowlist_patterns": None,
            },
            "order": 50,
            "group": "annotations",
            "empty_note": "no gpu_user_annotation events",
            "combine": "concat_by_rank",
            "reads": CORE_READS,
        },
    ),
    (
        "kinetoscope.analysis.user_annotation:gpu_kernels_with_user_annotations",
        {
            "name": "gpu_kernels_with_user_annotations",
            "description": "Every GPU kernel with the innermost GPU user annotation it runs under (one row per kernel).",
            "default": False,
            "order": 51,
            "group": "annotations",
            "empty_note": "no gpu_user_annotation events",
            "combine": "concat",
            "reads": CORE_READS,
        },
    ),
    (
        "kinetoscope.analysis.launch_stats:kernel_launch_summary",
        {
            "name": "kernel_launch_summary",
            "description": "Kernel launches per rank: short kernels, runtime and launch-delay outliers, duration stats.",
            "options": {
                "runtime_cutoff_us": 50.0,
                "launch_delay_cutoff_us": 100.0,
                "include_memory_events": True,
            },
            "order": 60,
            "group": "launch",
            "empty_note": "no kernel launches with a matching device event",
            "combine": "concat_by_rank",
            "reads": CORE_READS,
        },
    ),
    (
        "kinetoscope.analysis.launch_stats:kernel_launch_stats",
        {
            "name": "kernel_launch_stats",
            "description": "Every kernel launch: CPU duration, GPU duration and launch delay (one row per launch).",
            "default": False,
            "options": {"include_memory_events": True},
            "order": 61,
            "group": "launch",
            "empty_note": "no kernel launches with a matching device event",
            "combine": "concat",
            "reads": CORE_READS,
        },
    ),
    (
        "kinetoscope.analysis.counters:queue_length_summary",
        {
            "name": "queue_length_summary",
            "description": "Launch-queue length per rank and stream (operations launched but not yet started).",
            "order": 70,
            "group": "counters",
            "empty_note": "no kernel launches with a matching device event",
            "combine": "concat_by_rank",
            "reads": CORE_READS,
        },
    ),
    (
        "kinetoscope.analysis.counters:time_blocked_on_full_queue",
        {
            "name": "time_blocked_on_full_queue",
            "description": "Time each stream's launch queue is full (>= max_queue_length, default 1024).",
            "options": {"max_queue_length": 1024},
            "order": 71,
            "group": "counters",
            "empty_note": "no kernel launches with a matching device event",
            "combine": "concat_by_rank",
            "reads": CORE_READS,
        },
    ),
    (
        "kinetoscope.analysis.counters:queue_length_time_series",
        {
            "name": "queue_length_time_series",
            "description": "Launch-queue length per stream at every change (one row per launch and per kernel start).",
            "default": False,
            "order": 72,
            "group": "counters",
            "empty_note": "no kernel launches with a matching device event",
            "combine": "concat",
            "reads": CORE_READS,
        },
    ),
    (
        "kinetoscope.analysis.counters:memory_bw_summary",
        {
            "name": "memory_bw_summary",
            "description": "Memory copy/set bandwidth (GB/s) per rank and kind: statistics over time.",
            "order": 73,
            "group": "counters",
            "empty_note": "no memcpy/memset events with a bandwidth",
            "combine": "concat_by_rank",
            "reads": CORE_READS,
        },
    ),
    (
        "kinetoscope.analysis.counters:memory_bw_time_series",
        {
            "name": "memory_bw_time_series",
            "description": "Aggregate memory copy/set bandwidth (GB/s) per kind at every change.",
            "default": False,
            "order": 74,
            "group": "counters",
            "empty_note": "no memcpy/memset events with a bandwidth",
            "combine": "concat",
            "reads": CORE_READS,
        },
    ),
    (
        "kinetoscope.analysis.call_graph:call_graph_summary",
        {
            "name": "call_graph",
            "description": "CPU ops with the GPU work they launch (call stacks + kernels): count, depth, CPU and kernel time per op name.",
            "default": False,
            "order": 80,
            "group": "heavy",
            "empty_note": "no CPU op launched a kernel",
            "combine": "concat",
            "reads": CALL_GRAPH_READS,
        },
    ),
    (
        "kinetoscope.analysis.frequent_sequences:frequent_sequences",
        {
            "name": "frequent_kernel_sequences",
            "description": "Most frequent GPU kernel sequences launched by CPU ops whose name contains operator_name.",
            "default": False,
            "options": {"operator_name": "aten::", "min_pattern_len": 3, "outermost": True},
            "order": 81,
            "group": "heavy",
            "empty_note": "no op matching operator_name launched at least min_pattern_len kernels",
            "combine": "concat",
            "reads": CALL_GRAPH_READS,
        },
    ),
    (
        "kinetoscope.analysis.critical_path:critical_path_summary",
        {
            "name": "critical_path",
            "description": "Lightweight critical path of a step (or the whole trace): share bound by CPU, GPU compute, communication, launch and kernel-kernel overhead.",
            "default": False,
            "options": dict(_CRITICAL_PATH_OPTIONS),
            "order": 82,
            "group": "heavy",
            "empty_note": "no critical path (no events in the window)",
            "combine": "concat",
            "reads": CRITICAL_PATH_READS,
        },
    ),
    (
        "kinetoscope.analysis.critical_path:critical_path_breakdown",
        {
            "name": "critical_path_breakdown",
            "description": "Every edge on the critical path with the event it is attributed to and what it is bound by.",
            "default": False,
            "options": dict(_CRITICAL_PATH_OPTIONS),
            "order": 83,
            "group": "heavy",
            "empty_note": "no critical path (no events in the window)",
            "combine": "concat",
            "reads": CRITICAL_PATH_READS,
        },
    ),
    (
        "kinetoscope.analysis.memory_timeline:memory_summary",
        {
            "name": "memory_summary",
            "description": "Memory per device from the memory events: allocations, frees, peak allocated/reserved and when.",
            "default": False,
            "needs_gpu": False,
            "order": 84,
            "group": "memory",
            "empty_note": "no memory events (record with profile_memory=True)",
            "combine": "concat",
            "reads": MEMORY_READS,
        },
    ),
    (
        "kinetoscope.analysis.memory_timeline:memory_allocation_sites",
        {
            "name": "memory_allocation_sites",
            "description": "Ops that allocate the most memory (innermost op enclosing each allocation).",
            "default": False,
            "needs_gpu": False,
            "options": {"top_k": 20},
            "order": 85,
            "group": "memory",
            "empty_note": "no memory events (record with profile_memory=True)",
            "combine": "concat",
            "reads": MEMORY_SITES_READS,
        },
    ),
    (
        "kinetoscope.analysis.memory_timeline:memory_timeline",
        {
            "name": "memory_timeline",
            "description": "Every memory event: bytes, total allocated and reserved over time, per device.",
            "default": False,
            "needs_gpu": False,
            "order": 86,
            "group": "memory",
            "empty_note": "no memory events (record with profile_memory=True)",
            "combine": "concat",
            "reads": MEMORY_READS,
        },
    ),
    (
        "kinetoscope.analysis.aten_op_kernels:aten_op_kernels",
        {
            "name": "aten_op_kernels",
            "description": "Kernels each ATen op launches, how often, and its mean op-to-launch and launch-to-kernel delays.",
            "default": False,
            "order": 87,
            "group": "launch",
            "empty_note": "no kernel launch inside an aten:: op",
            "combine": "concat",
            "reads": CALL_GRAPH_READS,
        },
    ),
    (
        "kinetoscope.analysis.cupti_counters:cupti_counters",
        {
            "name": "cupti_counters",
            "description": "CUPTI profiler counters per kernel (cuda_profiler_range events) with the ops that launched it.",
            "default": False,
            "needs_gpu": False,
            "order": 88,
            "group": "counters",
            "empty_note": "no cuda_profiler_range events, or their count differs from the kernel launches",
            "combine": "concat",
            "reads": CUPTI_READS,
        },
    ),
)
