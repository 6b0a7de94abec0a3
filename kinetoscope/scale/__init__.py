"""Scale-out analysis: thousands of rank traces as a map/reduce, in this process, on a process
pool or on Ray; the one orchestration every analysis goes through.

    from kinetoscope.scale import AnalyzeRequest, run_analysis
    run = run_analysis(AnalyzeRequest(inputs=paths, backend="local", workers=8))  # or "ray", "auto"
    run.document    # the ``kscope analyze --json`` document, whatever the backend (tests/scale)

map (``mapper.map_rank``, one task per rank file, on a worker): load, run the per-rank analyses,
return small results. reduce (``reduce.reduce_document``, driver): concatenate / reduce across
ranks, diagnose the job, build the document. ``plan`` checks the split before any work starts;
``executors`` runs the tasks; ``run`` ties them together. See docs/scale.md.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from kinetoscope.lazy import lazy_exports

if TYPE_CHECKING:
    from kinetoscope.scale.reduce import ScaleRun
    from kinetoscope.scale.request import AnalyzeRequest

# Lazy (PEP 562): ``kinetoscope.orchestration`` imports the request type at start-up, and that must not
# import Polars and every analysis.
_names, __getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "BACKENDS": "request",
        "AnalyzeRequest": "request",
        "REDUCERS": "reducers",
        "Plan": "plan",
        "make_plan": "plan",
        "RankResult": "mapper",
        "RankTask": "mapper",
        "map_rank": "mapper",
        "ScaleRun": "reduce",
        "reduce_document": "reduce",
        "choose_backend": "executors",
        "make_executor": "executors",
        "run_analysis": "run",
    },
)
__all__ = [
    "BACKENDS",
    "REDUCERS",
    "AnalyzeRequest",
    "Plan",
    "RankResult",
    "RankTask",
    "ScaleRun",
    "analyze_files",
    "choose_backend",
    "make_executor",
    "make_plan",
    "map_rank",
    "reduce_document",
    "run_analysis",
]


def analyze_files(
    paths: Sequence[str | os.PathLike[str]],
    request: AnalyzeRequest | None = None,
    *,
    progress: Callable[[int, int, int], None] | None = None,
    **fields: Any,
) -> ScaleRun:
    """``run_analysis`` over ``paths`` with ``request`` (or one built from ``fields``, the
    ``AnalyzeRequest`` fields, e.g. ``backend="local", workers=2``)."""
    from kinetoscope.scale.request import AnalyzeRequest
    from kinetoscope.scale.run import run_analysis

    req = request if request is not None else AnalyzeRequest(**fields)
    return run_analysis(req, paths, progress=progress)
