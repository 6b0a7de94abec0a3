"""Rich tables of the diagnosis for ``kscope analyze`` human output (from the typed document,
``kinetoscope.document``, so the CLI needs nothing but the document and reads no dict)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rich.console import Console

from kinetoscope.document import AnalysisDocument, as_document
from kinetoscope.document.parts import Job, Mfu, Pipeline, Recommendation, Recompilation, UnevenInputs
from kinetoscope.document.stragglers import StragglerRankRow, Stragglers
from kinetoscope.termtext import Col, num, per_rank, print_table, print_wrapped, table

MAX_ROWS = 25


def _f(v: Any, digits: int = 2) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:,.{digits}f}"
    if isinstance(v, list):
        return ",".join(map(str, v)) or "-"
    return str(v)


def _p(v: Any) -> str:
    return "-" if v is None else f"{float(v):.2g}"


def _ms(v: Any) -> str:
    return "-" if v is None else f"{float(v) / 1000.0:,.2f}"


def _line(console: Console, name: str, what: str) -> None:
    """``name — what`` (``name`` in bold on a terminal), wrapped between words at the width."""
    print_wrapped(console, f"{name} — {what}", indent="", subsequent="  ")


def _table(
    console: Console, title: tuple[str, str], cols: list[Col], rows: list[list[str]], more: int = 0
) -> None:
    """A titled table whose numbers and ids stay whole at the console's width (see termtext)."""
    _line(console, *title)
    shown = [i for i, c in enumerate(cols) if c.kind != "value" or any(r[i] != "-" for r in rows)]
    print_table(console, table(None, [cols[i] for i in shown], [[r[i] for i in shown] for r in rows]))
    if more > 0:
        console.print(f"  … {more:,} more rows (all of them with --json)", highlight=False)


def render_rich(console: Console, document: AnalysisDocument | Mapping[str, Any]) -> None:
    """Print the diagnosis tables of a ``kscope analyze`` document (no-op without them)."""
    doc = as_document(document)
    strag, job, recs = doc.stragglers, doc.job, doc.recommendations
    if strag is None and job is None and not recs:
        return
    if strag is not None and strag.per_rank:
        _stragglers(console, strag)
    if strag is not None and strag.per_step:
        _per_step(console, strag)
    if job is not None:
        _job(console, job)
    if doc.mfu is not None:
        _mfu(console, doc.mfu)
    render_seed_keys(console, doc)
    if recs:
        _recommendations(console, recs)


def _stragglers(console: Console, strag: Stragglers) -> None:
    """The per-rank straggler table, named stragglers first."""

    def key(r: StragglerRankRow) -> tuple[int, float]:
        return (0 if r.role else 1, -(r.imposed_share or r.score or 0))

    rows = [
        [
            _f(r.rank),
            _f(r.host),
            _f(r.role),
            f"{_f(r.last_count)}/{_f(r.instances)}",
            _p(r.p_value),
            _ms(r.imposed_wait_us),
            _f(r.imposed_share, 3),
            _ms(r.whatif_saving_us),
            f"{_f(r.late_steps)}/{_f(r.steps)}",
            _ms(r.mean_lateness_us),
            _f(r.compute_vs_median),
        ]
        for r in sorted(strag.per_rank, key=key)[:MAX_ROWS]
    ]
    extra = f"; {strag.dropped_steps} step(s) not held by every rank left out" if strag.dropped_steps else ""
    _table(
        console,
        (
            "stragglers",
            f"{strag.kind} ({strag.reason or ''}{extra}); imposed = how much "
            "earlier the collectives would end had the rank arrived like the next-latest one; share = of "
            "the waiting imposed in the round the rank was named; what-if = step time saved per step had "
            "only this rank arrived like the typical rank; lateness = mean lateness; compute = compute "
            "time over the median rank's",
        ),
        [
            num("rank"),
            Col("host"),
            Col("role"),
            num("last at"),
            num("p"),
            num("imposed ms"),
            num("share"),
            num("what-if ms/step"),
            num("late steps"),
            num("mean late ms"),
            num("compute vs median"),
        ],
        rows,
        len(strag.per_rank) - MAX_ROWS,
    )


def _per_step(console: Console, strag: Stragglers) -> None:
    """The what-if per step: waiting, time saved, the rank most waited for."""
    steps = strag.per_step
    rows = [
        [
            _f(s.step),
            _ms(s.step_time_us),
            _f(s.n_instances),
            _ms(s.lost_us),
            _ms(s.excess_us),
            _ms(s.est_step_time_us),
            _f(s.last_rank),
            _ms(s.max_imposed_us),
            _ms(s.threshold_us),
            _f(s.late_ranks),
        ]
        for s in steps[:MAX_ROWS]
    ]
    wi = strag.what_if
    now = wi.mean_step_time_us if wi else None
    without = wi.est_step_time_without_stragglers_us if wi else None
    _table(
        console,
        (
            "what-if per step",
            f"without stragglers {_ms(now)} -> {_ms(without)} ms per step, "
            f"{100 * (strag.lost_fraction or 0):.1f}% of time lost; last rank = the rank most "
            "waited for, its imposed = the waiting it imposed; coll = collectives; thresh = the event threshold",
        ),
        [
            num("step"),
            num("step ms"),
            num("coll"),
            num("waiting ms"),
            num("saved ms"),
            num("est. step ms"),
            num("last rank"),
            num("its imposed ms"),
            num("thresh ms"),
            Col("late ranks"),
        ],
        rows,
        len(steps) - MAX_ROWS,
    )


def _job(console: Console, job: Job) -> None:
    """The job line (ranks found, missing, duplicates) and the clock alignment table."""
    clock = job.clock
    offs = clock.offsets if clock else []
    miss = job.missing_ranks
    _line(
        console,
        "job",
        f"ranks found {job.num_ranks_found}/{job.world_size}"
        + (f", missing {len(miss)}: {_f(miss[:40])}{' …' if len(miss) > 40 else ''}" if miss else "")
        + (f", duplicates {_f(job.duplicate_ranks)}" if job.duplicate_ranks else ""),
    )
    if clock and offs:
        rows = [
            [
                _f(o.rank),
                _f(o.host),
                _f(o.offset_us, 1),
                _f(o.measured_us, 1),
                _f(o.lower_bound_us, 1),
                _f(o.upper_bound_us, 1),
                _f(o.matched),
                _f(o.residual_us, 1),
                _f(o.method),
            ]
            for o in offs[:MAX_ROWS]
        ]
        _table(
            console,
            (
                "clock alignment",
                f"reference rank {clock.reference_rank}, matched on "
                f"{clock.match_method}; add offset to a rank's times",
            ),
            [
                num("rank"),
                Col("host"),
                num("offset us"),
                num("measured us"),
                num("lower bound us"),
                num("upper bound us"),
                num("matched"),
                num("residual us"),
                Col("method"),
            ],
            rows,
            len(offs) - MAX_ROWS,
        )


def _mfu(console: Console, mfu: Mfu) -> None:
    """The MFU line (or why there is none)."""
    if mfu.mfu is not None:
        _line(
            console,
            "mfu",
            f"{100 * mfu.mfu:.2f}% ({mfu.peak_source}; FLOPs/step "
            f"{mfu.flops_per_step:.3g} from {mfu.flops_source}, step {mfu.step_time_s:.4f} s, "
            f"{mfu.chips} chips)",
        )
    else:
        _line(console, "mfu", f"n/a: {mfu.reason}")


def _recommendations(console: Console, recs: list[Recommendation]) -> None:
    """Each recommendation as a wrapped paragraph, its evidence below."""
    console.print("recommendations", style="bold", highlight=False)
    for r in recs:  # prose: one wrapped paragraph each (a table column would be a sliver)
        ev = "; ".join(
            f"{k} {per_rank(v) if isinstance(v, dict) else _f(v, 3)}" for k, v in r.evidence.items()
        )
        print_wrapped(console, f"{r.severity} {r.id}: {r.action}", indent="  ", subsequent="    ")
        if ev:
            print_wrapped(console, f"evidence: {ev}", indent="    ", subsequent="      ")


def render_seed_keys(console: Console, document: AnalysisDocument | Mapping[str, Any]) -> None:
    """The ``pipeline``, ``uneven_inputs`` and ``recompilation`` keys, when not null."""
    doc = as_document(document)
    if doc.pipeline is not None:
        _pipeline(console, doc.pipeline)
    if doc.uneven_inputs is not None:
        _uneven(console, doc.uneven_inputs)
    if doc.recompilation is not None:
        _recompilation(console, doc.recompilation)


def _pipeline(console: Console, pp: Pipeline) -> None:
    """The pipeline line and its per-stage table."""
    im = pp.imbalance
    rows = [
        [
            _f(s["stage"]),
            _f(s["ranks"]),
            _f(s["compute_ms"]),
            _f(s["bubble_fraction"], 3),
            _f(s["fwd_ms_per_microbatch"] if "fwd_ms_per_microbatch" in s else None),
            _f(s["bwd_ms_per_microbatch"] if "bwd_ms_per_microbatch" in s else None),
        ]
        for s in pp.stages[:MAX_ROWS]
    ]
    _table(
        console,
        (
            "pipeline",
            f"{pp.schedule or 'schedule not recognised'}, {pp.num_stages} stages, "
            f"{pp.microbatches} micro-batches; bubble {_f(pp.bubble_fraction, 3)} (schedule alone "
            f"{_f(pp.expected_bubble_fraction, 3)}); slowest stage {im.slowest_stage if im else None} "
            f"(+{_f(im.excess_fraction if im else None, 3)}): step {_f(pp.step_time_ms)} ms -> "
            f"{_f(im.est_step_time_balanced_ms if im else None)} ms balanced",
        ),
        [
            num("stage"),
            Col("ranks"),
            num("compute ms/step"),
            num("bubble"),
            num("fwd ms/mb"),
            num("bwd ms/mb"),
        ],
        rows,
        len(pp.stages) - MAX_ROWS,
    )


def _uneven(console: Console, un: UnevenInputs) -> None:
    """The uneven-inputs line: which ranks ran out of data, steps per rank."""
    _line(
        console,
        "uneven inputs",
        f"{un.mode}: short rank(s) {_f(un.short_ranks)}; steps per rank: "
        f"{per_rank(un.steps_per_rank)}"
        + (f"; waiting rank(s) {_f(un.waiting_ranks)}" if un.waiting_ranks else ""),
    )


def _recompilation(console: Console, rc: Recompilation) -> None:
    """The compilations line and one row per compilation in the window."""
    rows = [
        [
            _f(e["rank"]),
            e["compile_id"],
            "yes" if e["recompile"] else "no",
            _f(e["step"]),
            _f(e["duration_ms"]),
        ]
        for e in rc.events[:MAX_ROWS]
    ]
    _table(
        console,
        (
            "compilations",
            f"{rc.compiles} in the window, {rc.recompiles} recompiles ({_f(rc.recompile_time_ms)} ms)",
        ),
        [num("rank"), Col("compile id"), Col("recompile"), num("step"), num("ms")],
        rows,
        len(rc.events) - MAX_ROWS,
    )
