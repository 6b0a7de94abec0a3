"""The typed columnar schema every loader produces and every analysis consumes.

This module is the contract between ``kinetoscope.trace`` (file -> tables) and
``kinetoscope.analysis`` (tables -> answers). Times are integer **nanoseconds** as written in
the file (Kineto writes microseconds with up to 3 decimals; we multiply by 1000 and round), so
interval arithmetic is exact. Missing values are nulls, never sentinels like -1.
"""

from __future__ import annotations

import polars as pl

# Normalised event kinds. Old (2021) traces use capitalised categories; they map onto these.
EVENT_KINDS: tuple[str, ...] = (
    "cpu_op",
    "user_annotation",
    "gpu_user_annotation",
    "python_function",
    "cuda_runtime",
    "cuda_driver",
    "kernel",
    "gpu_memcpy",
    "gpu_memset",
    "cuda_sync",
    "cuda_profiler_range",
    "mtia_runtime",
    "mtia_ccp_events",
    "trace",
    "other",
)
KIND = pl.Enum(list(EVENT_KINDS))

CAT_TO_KIND: dict[str, str] = {
    "cpu_op": "cpu_op",
    "Operator": "cpu_op",
    "user_annotation": "user_annotation",
    "gpu_user_annotation": "gpu_user_annotation",
    "python_function": "python_function",
    "cuda_runtime": "cuda_runtime",
    "Runtime": "cuda_runtime",
    "cuda_driver": "cuda_driver",
    "kernel": "kernel",
    "Kernel": "kernel",
    "gpu_memcpy": "gpu_memcpy",
    "Memcpy": "gpu_memcpy",
    "gpu_memset": "gpu_memset",
    "Memset": "gpu_memset",
    "cuda_sync": "cuda_sync",
    "cuda_profiler_range": "cuda_profiler_range",
    "mtia_runtime": "mtia_runtime",
    "mtia_ccp_events": "mtia_ccp_events",
    "Trace": "trace",
}

# Kinds that execute on a device timeline (their pid is the device, tid the stream).
DEVICE_KINDS: frozenset[str] = frozenset({"kernel", "gpu_memcpy", "gpu_memset", "mtia_ccp_events"})
# Kinds issued by the host that launch or synchronise device work.
RUNTIME_KINDS: frozenset[str] = frozenset({"cuda_runtime", "cuda_driver", "mtia_runtime"})

# args key in the file -> (column, dtype). Lower-case variants come from 2021-era traces.
ARG_COLUMNS: dict[str, tuple[str, pl.DataType]] = {
    "stream": ("stream", pl.Int64()),
    "device": ("device", pl.Int64()),
    "correlation": ("correlation", pl.Int64()),
    "External id": ("external_id", pl.Int64()),
    "external id": ("external_id", pl.Int64()),
    "bytes": ("bytes", pl.Int64()),
    "memory bandwidth (GB/s)": ("memory_bw_gbps", pl.Float64()),
    "grid": ("grid", pl.String()),
    "block": ("block", pl.String()),
    "registers per thread": ("registers_per_thread", pl.Int64()),
    "shared memory": ("shared_memory", pl.Int64()),
    "blocks per SM": ("blocks_per_sm", pl.Float64()),
    "warps per SM": ("warps_per_sm", pl.Float64()),
    "est. achieved occupancy %": ("est_occupancy_pct", pl.Float64()),
    "Input Dims": ("input_dims", pl.String()),
    "Input type": ("input_type", pl.String()),
    "Input Strides": ("input_strides", pl.String()),
    "Concrete Inputs": ("concrete_inputs", pl.String()),
    "Sequence number": ("sequence_number", pl.Int64()),
    "Fwd thread id": ("fwd_thread_id", pl.Int64()),
    "Record function id": ("record_function_id", pl.Int64()),
    "Ev Idx": ("ev_idx", pl.Int64()),
    "Python id": ("python_id", pl.Int64()),
    "Python parent id": ("python_parent_id", pl.Int64()),
    "Collective name": ("collective_name", pl.String()),
    "In msg nelems": ("in_msg_nelems", pl.Int64()),
    "Out msg nelems": ("out_msg_nelems", pl.Int64()),
    "dtype": ("msg_dtype", pl.String()),
    "Group size": ("group_size", pl.Int64()),
    "In split size": ("in_split_size", pl.String()),
    "Out split size": ("out_split_size", pl.String()),
    "Process Group Name": ("pg_name", pl.String()),
    "Process Group Description": ("pg_desc", pl.String()),
    "Process Group Ranks": ("pg_ranks", pl.String()),
    "Seq": ("seq", pl.Int64()),
    "wait_on_stream": ("wait_on_stream", pl.Int64()),
    "wait_on_cuda_event_record_corr_id": ("wait_on_cuda_event_record_corr_id", pl.Int64()),
    "cuda_sync_kind": ("cuda_sync_kind", pl.String()),
    "flops": ("flops", pl.Float64()),
}

# One row per complete ("X") event, in file order.
EVENTS_SCHEMA: dict[str, pl.DataType] = {
    "idx": pl.Int64(),  # position in traceEvents (for writing overlays back into the raw file)
    "kind": KIND,
    "cat": pl.String(),  # raw category as written
    "name": pl.String(),
    "pid": pl.Int64(),  # non-numeric pids/tids map to stable negative ids (see TraceMeta.labels)
    "tid": pl.Int64(),
    "ts": pl.Int64(),  # ns
    "dur": pl.Int64(),  # ns
    **{col: dtype for col, dtype in dict(ARG_COLUMNS.values()).items()},
}

FLOWS_SCHEMA: dict[str, pl.DataType] = {
    "idx": pl.Int64(),
    "ph": pl.String(),  # "s" (start) or "f" (finish)
    "cat": pl.String(),  # ac2g, fwdbwd, async_cpu_to_gpu, async_gpu, ...
    "name": pl.String(),
    "id": pl.Int64(),
    "pid": pl.Int64(),
    "tid": pl.Int64(),
    "ts": pl.Int64(),  # ns
    "bp": pl.String(),
}

# One row per (counter event, series key): Chrome "C" events in long form.
COUNTERS_SCHEMA: dict[str, pl.DataType] = {
    "idx": pl.Int64(),
    "name": pl.String(),
    "pid": pl.Int64(),
    "ts": pl.Int64(),
    "key": pl.String(),
    "value": pl.Float64(),
}

# Instant ("i") events; memory events ("[memory]") carry allocation columns.
INSTANTS_SCHEMA: dict[str, pl.DataType] = {
    "idx": pl.Int64(),
    "cat": pl.String(),
    "name": pl.String(),
    "pid": pl.Int64(),
    "tid": pl.Int64(),
    "ts": pl.Int64(),
    "scope": pl.String(),
    "device_type": pl.Int64(),
    "device_id": pl.Int64(),
    "addr": pl.Int64(),
    "bytes": pl.Int64(),
    "total_allocated": pl.Int64(),
    "total_reserved": pl.Int64(),
}

# "M" metadata events: process and thread names/labels.
PROCESSES_SCHEMA: dict[str, pl.DataType] = {
    "pid": pl.Int64(),
    "name": pl.String(),
    "labels": pl.String(),
    "sort_index": pl.Int64(),
}
THREADS_SCHEMA: dict[str, pl.DataType] = {
    "pid": pl.Int64(),
    "tid": pl.Int64(),
    "name": pl.String(),
    "sort_index": pl.Int64(),
}

TABLE_SCHEMAS: dict[str, dict[str, pl.DataType]] = {
    "events": EVENTS_SCHEMA,
    "flows": FLOWS_SCHEMA,
    "counters": COUNTERS_SCHEMA,
    "instants": INSTANTS_SCHEMA,
    "processes": PROCESSES_SCHEMA,
    "threads": THREADS_SCHEMA,
}


_EMPTY: dict[str, pl.DataFrame] = {}


def empty_table(name: str) -> pl.DataFrame:
    """An empty table with the named schema (analyses must accept empty inputs). A clone of
    one made once: building ~40 empty columns from Python costs ~0.5 ms, and every
    metadata-only ``Trace`` (each rank's, on the way to the driver) needs six tables."""
    proto = _EMPTY.get(name)
    if proto is None:
        proto = _EMPTY[name] = pl.DataFrame(schema=TABLE_SCHEMAS[name])
    return proto.clone()
