"""The part of one rank's trace that the job diagnosis reads, to send from a worker to the driver.

The diagnosis (``kinetoscope.diagnosis.diagnose``) is cross-rank (clock alignment, stragglers,
MFU) and takes whole ``Trace`` objects, so it runs on the driver. Sending every rank's full
tables there is what does not scale; this keeps only the rows and columns it reads:

* rows of the kinds it filters on (device, runtime, CPU ops, annotations), rows whose name the
  compilation detector looks for (any kind), and the first-starting and last-ending events
  (so ``Trace.span_ns()`` is unchanged);
* the columns in ``DIAGNOSIS_COLUMNS`` (``tests/scale`` checks that every events column named in
  the diagnosis sources is here, so a new one cannot be dropped silently);
* no flows, counters or instants (the diagnosis reads none).
"""

from __future__ import annotations

import polars as pl

from kinetoscope.trace.model import Trace
from kinetoscope.trace.schema import DEVICE_KINDS, RUNTIME_KINDS

DIAGNOSIS_KINDS: frozenset[str] = frozenset(
    {"cpu_op", "user_annotation", "gpu_user_annotation", "cuda_sync", *DEVICE_KINDS, *RUNTIME_KINDS}
)
# Names kinetoscope.diagnosis.detectors.detect_compilation matches over events of any kind.
COMPILE_NAME_PATTERN = (
    r"^Torch-Compiled Region|^TorchDynamo Cache Lookup$|compile_id=\d+/\d+"
    r"|^(dynamo|entire_frame_compile|_compile\.compile_inner \(dynamo_timed\)|compile_fx_inner)$"
)
DIAGNOSIS_COLUMNS: tuple[str, ...] = (
    "idx", "kind", "name", "pid", "tid", "ts", "dur", "stream", "device", "correlation",
    "external_id", "memory_bw_gbps", "input_dims", "concrete_inputs", "collective_name",
    "in_msg_nelems", "out_msg_nelems", "pg_name", "seq", "flops",
)


def slim_for_diagnosis(trace: Trace) -> Trace:
    """A Trace with only what the diagnosis needs (same metadata object)."""
    ev = trace.events
    if ev.height:
        end = pl.col("ts") + pl.col("dur")
        keep = (
            pl.col("kind").cast(pl.String).is_in(list(DIAGNOSIS_KINDS))
            | pl.col("name").str.contains(COMPILE_NAME_PATTERN)
            | (pl.int_range(pl.len()) == pl.col("ts").arg_min())
            | (pl.int_range(pl.len()) == end.arg_max())
        )
        ev = ev.filter(keep)
    cols = [c for c in DIAGNOSIS_COLUMNS if c in ev.columns]
    return Trace(meta=trace.meta, events=ev.select(cols), processes=trace.processes, threads=trace.threads)


def meta_only(trace: Trace) -> Trace:
    """Only the metadata: what ``build_document`` needs of a rank when nothing else is wanted."""
    return Trace(meta=trace.meta)
