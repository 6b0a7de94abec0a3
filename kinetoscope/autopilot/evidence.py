"""Is a sample's trace fit for the fleet ranking? The autopilot's judgement of one analysis
document (docs/autopilot.md, "Sample evidence").

A sample is **usable** when its trace can carry a cross-rank verdict: enough steps traced on
every rank, windows that overlap, and no timestamp anomalies. It is **unusable** (sample state
``unusable``, never ranked, the job traced again at its next due time) when any of these holds,
checked in this order, the first naming the reason:

* ``evidence`` — the analysis document's own evidence block (``evidence`` key, written by the
  analysis) says the set is not usable; its reason is kept;
* ``timestamp_anomalies`` — more than ``max_timestamp_anomalies`` device events stamped before
  their launch (the corruption repeated profiling of one process causes: PyTorch issues #192021
  and #175790), counted by the evidence block, else here from the trace files;
* ``unaligned`` — the evidence block says the ranks' windows do not overlap;
* ``too_few_steps`` — fewer than :data:`MIN_STEPS` steps traced in common by all ranks;
* ``not_assessed`` — a multi-rank job whose straggler verdict is ``NOT ASSESSED``.

Every field of the evidence block is read as optional: a document without it is judged from its
``steps`` and ``stragglers`` and from the files. Other producers' spellings of the block
(``cross_rank_usable``, ``judgement``, a ``timestamp_anomalies`` map...) are mapped by the
decoder (``kinetoscope.document.spellings``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import msgspec

from kinetoscope.document import AnalysisDocument, as_document
from kinetoscope.document.parts import Evidence
from kinetoscope.protocol.structinfo import prime_structs

MIN_STEPS = 3  # steps in common below which no cross-rank verdict is made (as the diagnosis)


class SampleEvidence(msgspec.Struct, frozen=True):
    """The judgement kept with a sample (``fleet_samples.evidence``).

    ``steps_in_common``: steps every rank traced (None: unknown). ``timestamp_anomalies``: device
    events stamped before their launch (None: not checked). ``source``: ``document`` when the
    analysis's evidence block decided, ``autopilot`` when this module's own checks did."""

    usable: bool
    reason: str | None = None  # a code of the module docstring; None when usable
    detail: str | None = None  # one line for people
    steps_in_common: int | None = None
    timestamp_anomalies: int | None = None
    source: str = "autopilot"

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = msgspec.to_builtins(self)
        return out


def _windows_apart(ev: Evidence) -> bool:
    """Whether the ranks' windows do not overlap. ``windows_overlap`` is the analysis' answer;
    ``windows_aligned`` (starts and ends close) is stricter, so it is read only without it:
    windows that are staggered but overlap still carry a verdict on the steps they share."""
    if ev.windows_overlap is not None:
        return ev.windows_overlap is False
    return ev.windows_aligned is False


def steps_in_common(document: AnalysisDocument | Mapping[str, Any]) -> int | None:
    """Steps present for every rank in the document's ``steps`` rows (None without rows)."""
    rows = as_document(document).steps
    by_rank: dict[int | None, set[int]] = {}
    for r in rows or []:
        if r.step is not None:
            by_rank.setdefault(r.rank, set()).add(r.step)
    if not by_rank:
        return None
    common = set.intersection(*by_rank.values())
    return len(common)


def _ranks(doc: AnalysisDocument) -> int:
    n = doc.job.world_size if doc.job is not None else None
    return max(n or 0, len(doc.traces))


def _not_assessed(doc: AnalysisDocument) -> str | None:
    strag = doc.stragglers
    if _ranks(doc) < 2 or strag is None:
        return None
    if strag.kind in (None, "none") and strag.skew_fraction is None:
        return f"stragglers NOT ASSESSED: {strag.reason or 'nothing to compare'}"
    return None


def kernels_before_launch(paths: Sequence[str | Path]) -> int:
    """Device events (kernels, copies) whose start is before the start of the launch call with
    the same correlation id, summed over the files: the signature of a later profiling run of the
    same process (PyTorch #192021, #175790). Files that cannot be read count nothing."""
    import polars as pl

    from kinetoscope.trace import load_traces
    from kinetoscope.trace.errors import TraceError
    from kinetoscope.trace.schema import DEVICE_KINDS, RUNTIME_KINDS

    try:
        traces = load_traces([str(p) for p in paths])
    except (TraceError, OSError, ValueError):
        return 0
    total = 0
    for t in traces:
        ev = t.events.filter(pl.col("correlation").is_not_null())
        kind = pl.col("kind").cast(pl.String)
        launches = (
            ev.filter(kind.is_in(sorted(RUNTIME_KINDS)))
            .group_by("correlation")
            .agg(pl.col("ts").min().alias("launch_ts"))
        )
        device = ev.filter(kind.is_in(sorted(DEVICE_KINDS))).select("correlation", "ts")
        joined = device.join(launches, on="correlation", how="inner")
        total += int(joined.filter(pl.col("ts") < pl.col("launch_ts")).height)
    return total


def judge(
    document: AnalysisDocument | Mapping[str, Any],
    paths: Sequence[str | Path] = (),
    *,
    max_timestamp_anomalies: int = 0,
) -> SampleEvidence:
    """The sample's :class:`SampleEvidence` (module docstring). ``paths``: the local trace files,
    read only when the document does not count timestamp anomalies itself."""
    doc = as_document(document)
    # the evidence part, its older spellings already mapped by the decoder (document.spellings)
    ev = doc.evidence if doc.evidence is not None else Evidence()
    steps = ev.steps_in_common
    if steps is None:
        steps = steps_in_common(doc)
    anomalies = ev.timestamp_anomalies
    source = "document" if doc.evidence is not None else "autopilot"
    if anomalies is None and paths:
        anomalies = kernels_before_launch(paths)

    def bad(reason: str, detail: str, src: str = "autopilot") -> SampleEvidence:
        return SampleEvidence(False, reason, detail, steps, anomalies, src)

    if ev.usable is False:
        return bad("evidence", ev.reason or "the analysis judged the trace unusable", "document")
    if anomalies is not None and anomalies > max_timestamp_anomalies:
        return bad(
            "timestamp_anomalies",
            f"{anomalies} device events stamped before their launch (repeated profiling corrupts "
            "timestamps: PyTorch #192021, #175790)",
        )
    if _windows_apart(ev):
        return bad("unaligned", "the ranks' traced windows do not overlap", "document")
    if steps is not None and steps < MIN_STEPS:
        return bad("too_few_steps", f"{steps} steps traced in common (at least {MIN_STEPS} needed)")
    why = _not_assessed(doc)
    if why:
        return bad("not_assessed", why)
    return SampleEvidence(True, None, None, steps, anomalies, source)


prime_structs(globals())
