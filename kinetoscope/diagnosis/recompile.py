"""Each torch.compile compilation inside the trace window: which frame, which step, how long.

PyTorch 2.x records a compilation as a ``dynamo`` cpu_op (``dynamo_timed``) holding
``entire_frame_compile`` / ``backend_compile`` / ``compile_fx_inner`` ..., and, at its start, a
zero-length ``user_annotation`` ``dynamo_data: compile_id=F/C`` (also ``entire_frame_compile_data:
... compile_id=F/C``). ``F`` is the frame (one compiled function), ``C`` its compile count: ``C``
> 0 is a *recompile* (a guard failed: new shapes, dtypes, Python values). Per compilation:

``start``/``duration_ms``
    the outermost compile span (``detectors._COMPILE_SPANS``) that contains the annotation's
    timestamp; when none does (an annotation without its span), the duration is ``None``.
``step``
    the step (job-wide label of ``breakdown.step_table``) whose window holds ``start``: the
    step that paid for the compilation.

The cross-check is ``torch._dynamo.utils.counters["frames"]["total"]`` (compilations in the
process) and ``counters["stats"]["unique_graphs"]``: see tests/diagnosis/test_recompile.py. The
per-rank part (``detectors.compile_regions``) is extracted with the rank's figures (``extract``).
"""

from __future__ import annotations

from typing import Any

import polars as pl

from kinetoscope.diagnosis.extract import figures_of
from kinetoscope.trace.model import Trace


def compile_events(trace: Trace, rank: int, steps: pl.DataFrame, offset: int = 0) -> list[dict[str, Any]]:
    """The compilations of one rank, in time order (module docstring). ``steps``: the job's step
    table (aligned clock); ``offset``: this rank's clock offset (ns). Reads the rank's figures
    (``compile_regions``, span), so a ``DigestTrace`` gives what its full trace gives."""
    fig = figures_of(trace)
    mine = steps.filter(pl.col("rank") == rank) if steps.height else steps
    out = []
    for c in fig.compile_regions:
        out.append(
            {
                "rank": rank,
                "compile_id": f"{c.frame}/{c.count}",
                "frame": c.frame,
                "recompile": c.count > 0,
                "step": _step_of(mine, c.start + offset),
                "start_ms": round((c.start - (fig.span or (c.start, 0))[0]) / 1e6, 3),
                "duration_ms": round((c.end - c.start) / 1e6, 3) if c.end is not None else None,
            }
        )
    return sorted(out, key=lambda e: float(e["start_ms"]))


def _step_of(steps: pl.DataFrame, t: int) -> int | None:
    if steps.is_empty():
        return None
    hit = steps.filter((pl.col("start") <= t) & (pl.col("end") > t))
    return int(hit["step"][0]) if hit.height else None


def recompilation_summary(events: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The ``recompilation`` key: every compilation in the window and the totals, or None when
    nothing was compiled inside it."""
    if not events:
        return None
    rec = [e for e in events if e["recompile"]]
    return {
        "compiles": len(events),
        "recompiles": len(rec),
        "compile_time_ms": round(sum(e["duration_ms"] or 0.0 for e in events), 3),
        "recompile_time_ms": round(sum(e["duration_ms"] or 0.0 for e in rec), 3),
        "recompile_steps": sorted({e["step"] for e in rec if e["step"] is not None}),
        "events": events,
    }
