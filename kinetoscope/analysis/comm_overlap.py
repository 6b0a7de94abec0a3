"""Communication–computation overlap: how much of the communication time is hidden by compute.

Definition (HTA §1.8, ``CommunicationAnalysis.get_comm_comp_overlap``), per rank, over device
events classified by ``kernel_types``:

* ``communication_time`` = length of the union of COMMUNICATION kernels (NCCL, RCCL, HCCL);
* ``computation_time`` = length of the union of COMPUTATION kernels;
* ``overlap_time`` = time during which both a communication and a computation kernel run;
* ``comp_comm_overlap_pctg = round(100 * overlap_time / communication_time, 2)``.

Times in µs. Difference from HTA: a rank without communication kernels gets a **null**
percentage (HTA divides 0 by 0, returns NaN and numpy prints "invalid value in scalar divide",
HTA issues #247/#56).
"""

from __future__ import annotations

import polars as pl

from kinetoscope.analysis._common import CORE_READS, TraceInput, device_frame, per_rank
from kinetoscope.analysis.kernel_breakdown import kernel_type_time
from kinetoscope.analysis.kernel_types import COMMUNICATION, COMPUTATION
from kinetoscope.analysis.registry import AnalysisSpec, register
from kinetoscope.trace.model import Trace

OVERLAP_SCHEMA: dict[str, pl.DataType] = {
    "rank": pl.Int64(),
    "comp_comm_overlap_pctg": pl.Float64(),
    "communication_time(us)": pl.Float64(),
    "computation_time(us)": pl.Float64(),
    "overlap_time(us)": pl.Float64(),
}
_BOTH = f"{COMPUTATION} overlapping {COMMUNICATION}"


def comm_comp_overlap(traces: TraceInput) -> pl.DataFrame:
    """One row per rank with device events (see module docstring)."""

    def one_rank(t: Trace) -> pl.DataFrame | None:
        dev = device_frame(t)
        if dev.is_empty():
            return None
        kt = dict(
            kernel_type_time(dev, [COMPUTATION, COMMUNICATION]).select("kernel_type", "time").iter_rows()
        )
        both = kt.get(_BOTH, 0)
        comm = kt.get(COMMUNICATION, 0) + both
        comp = kt.get(COMPUTATION, 0) + both
        pct = round(100.0 * both / comm, 2) if comm > 0 else None
        return pl.DataFrame(
            {
                "rank": [t.meta.rank],
                "comp_comm_overlap_pctg": [pct],
                "communication_time(us)": [comm / 1000.0],
                "computation_time(us)": [comp / 1000.0],
                "overlap_time(us)": [both / 1000.0],
            },
            schema=OVERLAP_SCHEMA,
        )

    return per_rank(traces, one_rank, OVERLAP_SCHEMA).sort("rank", nulls_last=True)


register(
    AnalysisSpec(
        name="comm_comp_overlap",
        func=comm_comp_overlap,
        combine="concat_by_rank",
        reads=CORE_READS,
        description="Share of communication-kernel time overlapped by computation kernels, per rank.",
        order=40,
    )
)
