"""Rich tables of the diagnosis for ``kscope analyze`` human output (from the JSON document, so
the CLI needs nothing but the document)."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table

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


def _table(console: Console, title: str, cols: list[str], rows: list[list[str]], more: int = 0) -> None:
    t = Table(title=title, title_justify="left")
    for c in cols:
        t.add_column(c, overflow="fold")
    for r in rows:
        t.add_row(*r)
    console.print(t)
    if more > 0:
        console.print(f"  … {more:,} more rows (all of them with --json)", highlight=False)


def render_rich(console: Console, doc: dict[str, Any]) -> None:
    """Print the diagnosis tables of a ``kscope analyze`` document (no-op without them)."""
    strag = doc.get("stragglers")
    job = doc.get("job")
    recs = doc.get("recommendations")
    if not (strag or job or recs):
        return
    if isinstance(strag, dict) and strag.get("per_rank"):

        def key(r: dict[str, Any]) -> tuple[int, float]:
            return (0 if r.get("role") else 1, -(r.get("imposed_share") or r.get("score") or 0))

        rows = [
            [
                _f(r["rank"]),
                _f(r.get("host")),
                _f(r.get("role")),
                f"{r.get('last_count', '-')}/{r.get('instances', '-')}",
                _p(r.get("p_value")),
                _ms(r.get("imposed_wait(us)")),
                _f(r.get("imposed_share"), 3),
                _ms(r.get("whatif_saving(us)")),
                f"{r['late_steps']}/{r['steps']}",
                _ms(r["mean_lateness(us)"]),
                _f(r.get("compute_vs_median")),
            ]
            for r in sorted(strag["per_rank"], key=key)[:MAX_ROWS]
        ]
        extra = (
            f"; {strag['dropped_steps']} step(s) not held by every rank left out"
            if strag.get("dropped_steps")
            else ""
        )
        _table(
            console,
            f"[bold]stragglers[/] — {strag['kind']} ({strag.get('reason', '')}{extra}); imposed = how much "
            "earlier the collectives would end had the rank arrived like the next-latest one; share = of the "
            "waiting imposed in the round the rank was named; what-if = step time saved per step had only "
            "this rank arrived like the typical rank",
            [
                "rank",
                "host",
                "role",
                "last at",
                "p",
                "imposed ms",
                "share",
                "what-if ms/step",
                "late steps",
                "lateness ms",
                "compute/median",
            ],
            rows,
            len(strag["per_rank"]) - MAX_ROWS,
        )
    if isinstance(strag, dict) and strag.get("per_step"):
        steps = strag["per_step"]
        rows = [
            [
                _f(s["step"]),
                _ms(s["step_time(us)"]),
                _f(s.get("n_instances")),
                _ms(s["lost(us)"]),
                _ms(s["excess(us)"]),
                _ms(s["est_step_time(us)"]),
                _f(s["last_rank"]),
                _ms(s.get("max_imposed(us)")),
                _ms(s["threshold(us)"]),
                _f(s["late_ranks"]),
            ]
            for s in steps[:MAX_ROWS]
        ]
        wi = strag.get("what_if") or {}
        _table(
            console,
            f"[bold]what-if per step[/] — without stragglers {_ms(wi.get('mean_step_time_us'))} -> "
            f"{_ms(wi.get('est_step_time_without_stragglers_us'))} ms per step, "
            f"{100 * (strag.get('lost_fraction') or 0):.1f}% of time lost",
            [
                "step",
                "step ms",
                "collectives",
                "waiting ms",
                "saved ms",
                "est. step ms",
                "most waited-for rank",
                "its imposed ms",
                "event threshold ms",
                "late ranks",
            ],
            rows,
            len(steps) - MAX_ROWS,
        )
    if isinstance(job, dict):
        clock = job.get("clock") or {}
        offs = clock.get("offsets") or []
        miss = job.get("missing_ranks") or []
        console.print(
            f"[bold]job[/] — ranks found {job.get('num_ranks_found')}/{job.get('world_size')}"
            + (f", missing {len(miss)}: {_f(miss[:40])}{' …' if len(miss) > 40 else ''}" if miss else "")
            + (f", duplicates {job.get('duplicate_ranks')}" if job.get("duplicate_ranks") else ""),
            highlight=False,
        )
        if offs:
            rows = [
                [
                    _f(o["rank"]),
                    _f(o.get("host")),
                    _f(o["offset_us"], 1),
                    _f(o.get("measured_us"), 1),
                    _f(o.get("lower_bound_us"), 1),
                    _f(o.get("upper_bound_us"), 1),
                    _f(o["matched"]),
                    _f(o.get("residual_us"), 1),
                    o["method"],
                ]
                for o in offs[:MAX_ROWS]
            ]
            _table(
                console,
                f"[bold]clock alignment[/] — reference rank {clock.get('reference_rank')}, matched on "
                f"{clock.get('match_method')}; add offset to a rank's times",
                [
                    "rank",
                    "host",
                    "offset us",
                    "measured us",
                    "lower bound us",
                    "upper bound us",
                    "matched",
                    "residual us",
                    "method",
                ],
                rows,
                len(offs) - MAX_ROWS,
            )
    mfu = doc.get("mfu")
    if isinstance(mfu, dict):
        if mfu.get("mfu") is not None:
            console.print(
                f"[bold]mfu[/] — {100 * mfu['mfu']:.2f}% ({mfu.get('peak_source')}; FLOPs/step "
                f"{mfu.get('flops_per_step'):.3g} from {mfu.get('flops_source')}, step {mfu.get('step_time_s'):.4f} s, "
                f"{mfu.get('chips')} chips)",
                highlight=False,
            )
        else:
            console.print(f"[bold]mfu[/] — n/a: {mfu.get('reason')}", highlight=False)
    render_seed_keys(console, doc)
    if recs:
        t = Table(title="[bold]recommendations[/]", title_justify="left", show_lines=True)
        for c in ("severity", "id", "evidence", "action"):
            t.add_column(c, overflow="fold")
        for r in recs:
            ev = (
                ", ".join(f"{k}={_f(v, 3)}" for k, v in r["evidence"].items() if not isinstance(v, dict))
                or "-"
            )
            t.add_row(r["severity"], r["id"], ev, r["action"])
        console.print(t)


def render_seed_keys(console: Console, doc: dict[str, Any]) -> None:
    """The ``pipeline``, ``uneven_inputs`` and ``recompilation`` keys, when not null."""
    pp = doc.get("pipeline")
    if isinstance(pp, dict):
        im = pp.get("imbalance") or {}
        rows = [
            [
                _f(s["stage"]),
                _f(s["ranks"]),
                _f(s["compute_ms"]),
                _f(s["bubble_fraction"], 3),
                _f(s.get("fwd_ms_per_microbatch")),
                _f(s.get("bwd_ms_per_microbatch")),
            ]
            for s in pp.get("stages", [])[:MAX_ROWS]
        ]
        _table(
            console,
            f"[bold]pipeline[/] — {pp.get('schedule') or 'schedule not recognised'}, {pp.get('num_stages')} stages, "
            f"{pp.get('microbatches')} micro-batches; bubble {_f(pp.get('bubble_fraction'), 3)} (schedule alone "
            f"{_f(pp.get('expected_bubble_fraction'), 3)}); slowest stage {im.get('slowest_stage')} "
            f"(+{_f(im.get('excess_fraction'), 3)}): step {_f(pp.get('step_time_ms'))} ms -> "
            f"{_f(im.get('est_step_time_balanced_ms'))} ms balanced",
            ["stage", "ranks", "compute ms/step", "bubble", "fwd ms/mb", "bwd ms/mb"],
            rows,
            len(pp.get("stages", [])) - MAX_ROWS,
        )
    un = doc.get("uneven_inputs")
    if isinstance(un, dict):
        console.print(
            f"[bold]uneven inputs[/] — {un['mode']}: short rank(s) {_f(un['short_ranks'])}, steps per rank "
            f"{un['steps_per_rank']}"
            + (f", waiting rank(s) {_f(un['waiting_ranks'])}" if un.get("waiting_ranks") else ""),
            highlight=False,
        )
    rc = doc.get("recompilation")
    if isinstance(rc, dict):
        rows = [
            [
                _f(e["rank"]),
                e["compile_id"],
                "yes" if e["recompile"] else "no",
                _f(e["step"]),
                _f(e["duration_ms"]),
            ]
            for e in rc.get("events", [])[:MAX_ROWS]
        ]
        _table(
            console,
            f"[bold]compilations[/] — {rc['compiles']} in the window, {rc['recompiles']} recompiles "
            f"({_f(rc['recompile_time_ms'])} ms)",
            ["rank", "compile id", "recompile", "step", "ms"],
            rows,
            len(rc.get("events", [])) - MAX_ROWS,
        )
