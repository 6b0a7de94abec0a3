"""The analysis document -> the report's sections (tables, Plotly figures, notes).

Every section reads the typed document (``kinetoscope.document``, decoded once in
``build_view``): a part that is missing or had an unexpected shape is ``None`` there, and its
section says what is missing instead of failing the report. Strings from traces
stay plain ``str`` in table cells (Jinja2 autoescapes them) and go through ``plotly_text`` when
they become chart labels.
"""

from __future__ import annotations

import re
import statistics
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec

from kinetoscope.analysis.names import display_name as short_name
from kinetoscope.document import DIAGNOSIS_KEYS, AnalysisDocument, Summary, as_document, summarize
from kinetoscope.document.analyses import IdleRow, KernelRow, KernelTypeRow, StepDurationRow, TemporalRow
from kinetoscope.document.parts import Clock, Job, Mfu, StepRow
from kinetoscope.document.stragglers import Stragglers
from kinetoscope.report.escape import plotly_text
from kinetoscope.units import finite as _num
from kinetoscope.units import fmt_bytes, fmt_ms, fmt_num, fmt_pct
from kinetoscope.units import us_to_ms as _ms

MAX_NAME = 90
MAX_CHART_BARS = 400
TOP_KERNELS = 15

# One colour per step-time category, shared by every chart (colour-blind friendly set).
COLORS = {
    "compute": "#4c78a8",
    "comm_transfer": "#f58518",
    "comm_wait": "#e45756",
    "memory": "#72b7b2",
    "host": "#eeca3b",
    "idle": "#bab0ac",
    "non_compute": "#f58518",
    "host_wait": "#eeca3b",
    "kernel_wait": "#9d755d",
    "other": "#bab0ac",
}

NAV_LABELS = {
    "recommendations": "Recommendations",
    "overview": "Step time",
    "stragglers": "Stragglers",
    "mfu": "MFU",
    "temporal": "Temporal",
    "idle": "Idle time",
    "kernels": "Kernels",
    "overlap": "Overlap",
    "launch": "Launches & queues",
    "job": "Job & clocks",
    "other": "Other analyses",
}

LEAD_COLUMNS = [
    "rank",
    "host",
    "step",
    "source",
    "stream",
    "kernel_type",
    "idle_category",
    "name",
    "count",
    "steps",
    "sum (us)",
    "mean (us)",
    "min (us)",
    "max (us)",
    "stddev",
    "p50 (us)",
    "p90 (us)",
    "p99 (us)",
    "start(us)",
    "end(us)",
    "duration(us)",
    "step_time(us)",
]

HEAT = [[0.0, "#fff7ec"], [0.25, "#fdd49e"], [0.5, "#fc8d59"], [0.75, "#d7301f"], [1.0, "#7f0000"]]

BREAKDOWN_PARTS = [
    ("compute", "Compute", "compute"),
    ("comm_transfer", "Communication: transfer (exposed)", "comm_transfer"),
    ("comm_wait", "Communication: waiting for peers (exposed)", "comm_wait"),
    ("memory", "Memory copies / other device work", "memory"),
    ("host", "Idle: host-bound (kernel launch gap)", "host"),
    ("idle", "Idle: other", "idle"),
]


# ---------------------------------------------------------------------------------------
# View model
# ---------------------------------------------------------------------------------------
@dataclass
class Cell:
    text: str
    title: str | None = None  # full text when ``text`` is shortened
    num: bool = False
    cls: str | None = None


@dataclass
class TableView:
    id: str
    title: str
    columns: list[str]
    numeric: list[bool]
    rows: list[list[Cell]]
    total: int
    caption: str | None = None
    collapsed: bool = False

    @property
    def hidden(self) -> int:
        return max(0, self.total - len(self.rows))


@dataclass
class ChartView:
    id: str
    figure: dict[str, Any]
    caption: str | None = None
    height: int = 380


@dataclass
class Kpi:
    label: str
    value: str
    hint: str | None = None
    cls: str | None = None


@dataclass
class Section:
    id: str
    title: str
    intro: str | None = None
    kpis: list[Kpi] = field(default_factory=list)
    charts: list[ChartView] = field(default_factory=list)
    tables: list[TableView] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    missing: str | None = None  # why the section has no data
    items: list[dict[str, Any]] = field(default_factory=list)  # section-specific (recommendations)

    @property
    def nav(self) -> str:
        return NAV_LABELS.get(self.id, self.title.split(":")[0])


@dataclass
class ReportView:
    title: str
    verdict: dict[str, Any]
    sections: list[Section]
    traces: TableView | None
    inputs: list[str]
    notes: list[str]
    errors: list[str]


# ---------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------
def _cell(v: Any, col: str = "") -> Cell:
    if isinstance(v, (dict, list)):
        import orjson

        text = orjson.dumps(v, default=str).decode()
        if len(text) > MAX_NAME:
            return Cell(text[: MAX_NAME - 1] + "…", title=text)
        return Cell(text)
    if isinstance(v, str):
        shown = v
        if col in ("name", "launch_name", "user_annotation", "kernel", "op"):
            shown = short_name(v)
        if len(shown) > MAX_NAME:
            shown = shown[: MAX_NAME - 1] + "…"
        return Cell(shown, title=v if shown != v else None, cls="name" if len(v) > 40 else None)
    if isinstance(v, bool):
        return Cell("yes" if v else "no")
    if isinstance(v, (int, float)):
        if isinstance(v, int) and col in (
            "rank",
            "stream",
            "step",
            "pid",
            "tid",
            "correlation",
            "idx",
            "device",
        ):
            return Cell(str(v), num=True)
        return Cell(fmt_num(v), num=True)
    return Cell("–" if v is None else str(v))


def _columns(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """The columns of row objects in first-seen order, identity columns first: documents read
    back from the catalog (JSON with sorted keys) have lost the analyses' column order."""
    seen: list[str] = []
    for r in rows[:200]:
        for k in r:
            if k not in seen:
                seen.append(k)
    return [c for c in LEAD_COLUMNS if c in seen] + [c for c in seen if c not in LEAD_COLUMNS]


def table_from_rows(
    tid: str,
    title: str,
    rows: Sequence[Mapping[str, Any]],
    *,
    columns: Sequence[str] | None = None,
    labels: Mapping[str, str] | None = None,
    max_rows: int = 50,
    caption: str | None = None,
    collapsed: bool = False,
    formatters: Mapping[str, Any] | None = None,
) -> TableView:
    """A table of display rows (row objects; columns: given, else the keys in first-seen
    order). A generic renderer: a missing cell shows as a dash."""
    cols = list(columns) if columns is not None else _columns(rows)
    labels = labels or {}
    formatters = formatters or {}
    out_rows = []
    numeric = [False] * len(cols)
    for r in rows[:max_rows]:
        cells = []
        for i, c in enumerate(cols):
            v = r[c] if c in r else None
            cell = formatters[c](v) if c in formatters else _cell(v, c)
            if not isinstance(cell, Cell):
                cell = Cell(str(cell), num=isinstance(v, (int, float)))
            numeric[i] = numeric[i] or cell.num
            cells.append(cell)
        out_rows.append(cells)
    return TableView(
        id=tid,
        title=title,
        columns=[labels.get(c, c) for c in cols],
        numeric=numeric,
        rows=out_rows,
        total=len(rows),
        caption=caption,
        collapsed=collapsed,
    )


def _ms_table(tid: str, title: str, rows: Sequence[Mapping[str, Any]], max_rows: int, **kw: Any) -> TableView:
    """``table_from_rows`` with every ``(us)`` column (of the first row) shown in ms."""
    ms_cols = [c for c in rows[0] if c.endswith("(us)")] if rows else []
    fm = {c: (lambda v: Cell(fmt_num(_ms(v)), num=True)) for c in ms_cols}
    labels = {c: c.replace("(us)", "(ms)") for c in ms_cols}
    return table_from_rows(tid, title, rows, max_rows=max_rows, labels=labels, formatters=fm, **kw)


def _rank_label(r: Any) -> str:
    return f"rank {r}" if r is not None else "rank ?"


def _key(v: Any) -> tuple[bool, Any]:
    """Sort key that puts None last."""
    return (v is None, v)


def _base_layout(title: str | None = None, **extra: Any) -> dict[str, Any]:
    layout: dict[str, Any] = {
        # The legend sits above the plot: below it, it collided with the axis title of a
        # two-row (rank / step) category axis.
        "margin": {"l": 60, "r": 20, "t": 70 if title else 50, "b": 50},
        "font": {"family": "system-ui, -apple-system, 'Segoe UI', Roboto, sans-serif", "size": 12},
        "legend": {
            "orientation": "h",
            "x": 0,
            "xanchor": "left",
            "y": 1.02,
            "yanchor": "bottom",
            "traceorder": "normal",
        },
        "paper_bgcolor": "rgba(0,0,0,0)",
        "plot_bgcolor": "rgba(0,0,0,0)",
        "hoverlabel": {"namelength": -1},
    }
    if title:
        layout["title"] = {"text": plotly_text(title), "x": 0, "xanchor": "left", "font": {"size": 14}}
    layout.update(extra)
    return layout


def _narrow(layout: dict[str, Any], n: int, axis: str = "xaxis", slots: int = 5) -> dict[str, Any]:
    """Keep bars of a category axis with few categories from filling the whole width."""
    if 0 < n < slots:
        pad = (slots - n) / 2
        layout.setdefault(axis, {})["range"] = [-0.5 - pad, n - 0.5 + pad]
    return layout


def _bars(name: str, x: list[Any], y: list[Any], color: str, hover: str, **extra: Any) -> dict[str, Any]:
    """One bar trace of a chart."""
    return {
        "type": "bar",
        "name": name,
        "x": x,
        "y": y,
        **extra,  # (before the marker: the charts' JSON keeps its key order)
        "marker": {"color": color},
        "hovertemplate": hover,
    }


# ---------------------------------------------------------------------------------------
# Verdict
# ---------------------------------------------------------------------------------------
def _missing_verdict(doc: AnalysisDocument) -> str:
    if "diagnosis" in doc.errors:
        return f"The job diagnosis failed: {doc.errors['diagnosis']}"
    have = [k for k in DIAGNOSIS_KEYS if doc.has(k)]
    return (
        "No diagnosis summary in this document"
        + (f" (it has {', '.join(have)})" if have else " (the diagnosis was not run)")
        + "."
    )


def verdict_view(document: AnalysisDocument | Mapping[str, Any]) -> dict[str, Any]:
    """The verdict box: the headline, the other summary lines, the straggler kind and its
    colour (``cls``), or why there is no verdict (``missing``)."""
    doc = as_document(document)
    strag = doc.stragglers
    kind = strag.kind if strag is not None and strag.kind else None
    lines = [s for s in doc.summary_lines or [] if not s.startswith("Recommendation (")]
    missing = None if lines else _missing_verdict(doc)
    headline, rest = (lines[0], lines[1:]) if lines else (None, [])
    cls = {"persistent": "bad", "intermittent": "warn", "none": "good"}.get(kind or "", "neutral")
    ev = doc.evidence
    if ev is not None and (not ev.assessed or ev.anomalous):
        cls = "warn"  # the verdict does not rest on good data: never shown as a clean bill
    return {"headline": headline, "lines": rest, "kind": kind, "cls": cls, "missing": missing}


def evidence_section(doc: AnalysisDocument, max_rows: int) -> Section | None:
    """The evidence card (``report.evidence``): status, figures, per-rank and anomaly tables."""
    from kinetoscope.report.evidence import evidence_view

    v = evidence_view(doc)
    if v is None:
        return None
    sec = Section(
        "evidence",
        "Evidence",
        intro=f"{v['status']}."
        + (f" For a trace that can be assessed: {v['command']}" if v["command"] else ""),
    )
    sec.kpis = [
        Kpi(label, value, cls=v["cls"] if i == 0 else None) for i, (label, value) in enumerate(v["facts"])
    ]
    sec.notes = list(v["lines"])
    if v["ranks"]:
        sec.tables.append(table_from_rows("table-evidence-ranks", "Per rank", v["ranks"], max_rows=max_rows))
    if v["anomalies"]:
        sec.tables.append(
            table_from_rows("table-evidence-anomalies", "Anomalies", v["anomalies"], max_rows=max_rows)
        )
    return sec


def _step_kpis(doc: AnalysisDocument, s: Summary) -> list[Kpi]:
    out = []
    if s.step_time_ms is not None:
        mean = _mean_step_ms(doc)
        differs = mean is not None and abs(mean - s.step_time_ms) > 0.005 * max(abs(mean), 1e-9)
        out.append(
            Kpi(
                "Step time (median)",
                f"{s.step_time_ms:,.1f} ms",
                f"mean {mean:,.1f} ms (slow steps weigh in)" if differs else None,
            )
        )
    parts = step_parts_by_rank_step(doc)
    if parts:
        tot: defaultdict[str, float] = defaultdict(float)
        for p in parts:
            for k, _, _ in BREAKDOWN_PARTS:
                tot[k] += p[k]
        step = sum(p["step_time"] for p in parts) or 1.0
        out.append(Kpi("Compute", f"{100 * tot['compute'] / step:.1f} %", "share of step time"))
        out.append(
            Kpi(
                "Exposed communication",
                f"{100 * (tot['comm_transfer'] + tot['comm_wait']) / step:.1f} %",
                "communication not overlapped by compute",
            )
        )
        out.append(Kpi("Idle", f"{100 * (tot['idle'] + tot['host']) / step:.1f} %", "nothing running"))
    return out


def _kpis(document: AnalysisDocument | Mapping[str, Any]) -> list[Kpi]:
    """The headline cards: step time, its parts, ranks, stragglers and MFU."""
    doc = as_document(document)
    s = summarize(doc)
    out = _step_kpis(doc, s)
    job = doc.job
    if job is not None:
        found, ws = job.num_ranks_found, job.world_size
        out.append(
            Kpi(
                "Ranks",
                f"{found if found is not None else '?'} / {ws if ws is not None else '?'}",
                "traced / world size",
                "warn" if job.num_missing_ranks else None,
            )
        )
    if s.straggler_kind is not None:
        ranks = s.straggler_ranks or []
        named = f"{'rank' if len(ranks) == 1 else 'ranks'} {', '.join(map(str, ranks[:8]))}"
        out.append(
            Kpi(
                "Stragglers",
                s.straggler_kind + (f": {named}" if ranks else ""),
                None,
                {"persistent": "bad", "intermittent": "warn"}.get(s.straggler_kind),
            )
        )
    if doc.mfu is not None:
        value = _num(doc.mfu.mfu)
        out.append(
            Kpi(
                "MFU",
                fmt_pct(value) if value is not None else "n/a",
                None if value is not None else _short_reason(doc.mfu.reason),
            )
        )
    return out


def _mean_step_ms(doc: AnalysisDocument) -> float | None:
    """The mean step time the diagnosis headline quotes (its what-if), else the mean over steps of
    the median over ranks: shown beside the median card so the two numbers reconcile."""
    what_if = doc.stragglers.what_if if doc.stragglers is not None else None
    if what_if is not None and _num(what_if.mean_step_time_us) is not None:
        return _ms(what_if.mean_step_time_us)
    per_step: dict[Any, list[float]] = defaultdict(list)
    for row in doc.steps or []:
        if _num(row.step_time_us) is not None:
            per_step[row.step].append(float(row.step_time_us or 0.0))
    if not per_step:
        return None
    return statistics.fmean(statistics.median(v) for v in per_step.values()) / 1000.0


def _short_reason(reason: Any) -> str | None:
    """A card-sized reason: the text before its first explanation (``no FLOPs: pass ...`` ->
    ``no FLOPs``), pointing at the section that has the whole of it."""
    text = str(reason or "").strip()
    if not text:
        return None
    head = re.split(r"[:;(]", text, maxsplit=1)[0].strip()
    return f"{head or text[:40]} — see the MFU section"


def plural(n: int, word: str, many: str | None = None) -> str:
    """``1 rank``, ``4 ranks``."""
    return f"{n:,} {word if n == 1 else (many or word + 's')}"


# ---------------------------------------------------------------------------------------
# Recommendations
# ---------------------------------------------------------------------------------------
# Unit suffixes of evidence keys (the diagnosis' naming convention) -> how the value prints.
_EVIDENCE_UNITS: tuple[tuple[str, str], ...] = (
    ("_fraction", "pct"),
    ("_share", "pct"),
    ("_pct", "pct_already"),
    ("_ms", "ms"),
    ("_us", "us"),
    ("(us)", "us"),
    ("(ms)", "ms"),
    ("(bytes)", "bytes"),
    ("_s", "s"),
    ("_bytes", "bytes"),
    ("_flops", "flops"),
)
# Words of evidence keys spelt out in their labels.
_EVIDENCE_WORDS = {
    "est": "estimated",
    "comm": "communication",
    "mfu": "MFU",
    "cpu": "CPU",
    "gpu": "GPU",
    "ddp": "DDP",
    "vs": "vs.",
    "num": "number of",
    "bw": "bandwidth",
    "h2d": "host-to-device",
    "d2h": "device-to-host",
    "nccl": "NCCL",
}


def evidence_label(key: str) -> tuple[str, str]:
    """``mean_step_time_ms`` -> ``("Mean step time", "ms")``: a readable label and the unit kind
    its suffix names (``""`` when none)."""
    unit = ""
    for suffix, kind in _EVIDENCE_UNITS:
        if key.endswith(suffix) and len(key) > len(suffix):
            key, unit = key[: -len(suffix)], kind
            break
    if not unit and "fraction" in key.split("_"):  # overlap_fraction_of_comm: a share all the same
        unit = "pct"
    words = [
        _EVIDENCE_WORDS.get(w.lower(), w) for w in key.replace("(", " ").replace(")", " ").split("_") if w
    ]
    text = " ".join(" ".join(words).split())
    return (text[:1].upper() + text[1:]) if text else key, unit


def evidence_value(v: Any, unit: str) -> str:
    """An evidence value with its unit: fractions as percentages, times in ms/s, bytes in KiB/MiB."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return fmt_num(v) if isinstance(v, bool) else str(v)
    if unit == "pct":
        return fmt_pct(v)
    if unit == "pct_already":
        return f"{v:.1f} %"
    if unit == "ms":
        return f"{fmt_num(float(v), 2)} ms"
    if unit == "us":
        return fmt_ms(v)
    if unit == "s":
        return f"{fmt_num(float(v), 3)} s"
    if unit == "bytes":
        return fmt_bytes(v)
    if unit == "flops":
        return f"{v:.3g} FLOPs"
    return fmt_num(v, 3) if isinstance(v, float) else fmt_num(v)


def _evidence_rows(ev: Any, prefix: str = "") -> list[tuple[str, str, str]]:
    """``(label, value with unit, raw key)`` per evidence entry; nested mappings flatten as
    ``Label · sub-label``. The raw key stays available (a tooltip) to find it in the JSON."""
    out: list[tuple[str, str, str]] = []
    if isinstance(ev, Mapping):
        for k, v in ev.items():
            label, unit = evidence_label(str(k))
            raw = f"{prefix}{k}"
            if isinstance(v, Mapping):
                out.extend((f"{label} · {sub}", val, key) for sub, val, key in _evidence_rows(v, raw + "."))
            elif isinstance(v, list):
                shown = ", ".join(evidence_value(x, unit) for x in v[:20]) + (" …" if len(v) > 20 else "")
                out.append((label, shown, raw))
            else:
                out.append((label, evidence_value(v, unit), raw))
    elif ev is not None:
        out.append(("", str(ev), ""))
    return out


def recommendations_section(document: AnalysisDocument | Mapping[str, Any]) -> Section:
    """What to change, most important first, each with the evidence that triggered it."""
    doc = as_document(document)
    sec = Section(
        "recommendations",
        "Recommendations",
        "What to change, most important first, each with the measurements that triggered it.",
    )
    recs = doc.recommendations
    if recs is None:
        sec.missing = "the document has no 'recommendations' (the diagnosis was not run or failed)"
        return sec
    if not recs:
        sec.notes.append("No recommendation: nothing in these traces crossed a threshold.")
        return sec
    order = {"high": 0, "medium": 1, "low": 2, "info": 3}
    for r in sorted(recs, key=lambda r: order.get(r.severity, 9)):
        sev = r.severity or "info"
        sec.items.append(
            {
                "id": r.id,
                "severity": sev,
                "cls": {"high": "bad", "medium": "warn", "low": "neutral"}.get(sev, "neutral"),
                "title": r.title or r.id or "recommendation",
                "action": r.action,
                "evidence": _evidence_rows(r.evidence),
            }
        )
    return sec


# ---------------------------------------------------------------------------------------
# Overview: step-time breakdown
# ---------------------------------------------------------------------------------------
def step_parts(row: StepRow | Mapping[str, Any]) -> dict[str, Any] | None:
    """One per-rank, per-step row of the diagnosis ``steps`` table split into categories that
    add up to the step time (ms)."""
    if not isinstance(row, StepRow):
        row = msgspec.convert(row, StepRow, strict=False)
    st = _ms(row.step_time_us)
    if st is None:
        return None
    comp = _ms(row.compute_us) or 0.0
    exposed = _ms(row.exposed_comm_us) or 0.0
    sync = _ms(row.sync_wait_us) or 0.0
    idle = _ms(row.idle_us) or 0.0
    gap = _ms(row.launch_gap_us)
    wait = min(sync, exposed)
    host = min(idle, gap) if gap is not None else 0.0
    return {
        "rank": row.rank,
        "step": row.step,
        "step_time": st,
        "compute": comp,
        "comm_transfer": exposed - wait,
        "comm_wait": wait,
        "memory": max(0.0, st - comp - exposed - idle),
        "host": host,
        "idle": max(0.0, idle - host),
        "dataloader": _ms(row.dataloader_us),
        "lateness": _ms(row.lateness_us),
        "self_time": _ms(row.self_time_us),
        "sync_wait": sync,
    }


def step_parts_by_rank_step(doc: AnalysisDocument) -> list[dict[str, Any]]:
    """``step_parts`` of every row of the diagnosis ``steps`` table that has a step time."""
    return [p for r in doc.steps or [] if (p := step_parts(r)) is not None]


def _stacked(
    x: list[Any],
    series: dict[str, list[float]],
    *,
    xtitle: str,
    ytitle: str = "ms",
    hover_x: str = "%{x}",
    customdata: Any = None,
    multicategory: bool = False,
) -> dict[str, Any]:
    data = []
    for key, label, color in BREAKDOWN_PARTS:
        if key not in series:
            continue
        tr: dict[str, Any] = {
            "type": "bar",
            "name": label,
            "x": x,
            "y": [round(v, 4) for v in series[key]],
            "marker": {"color": COLORS[color]},
            "hovertemplate": f"{hover_x}<br>{label}: %{{y:.2f}} ms<extra></extra>",
        }
        data.append(tr)
    layout = _base_layout(
        barmode="stack",
        xaxis={"title": {"text": xtitle}, "type": "multicategory" if multicategory else "category"},
        yaxis={"title": {"text": ytitle}},
    )
    if multicategory:  # two rows of tick labels, then the axis title: room for all three
        layout["margin"]["b"] = 95
    return {"data": data, "layout": layout}


def _temporal_by_step_chart(tb: list[TemporalRow]) -> ChartView:
    """The analysis engine's per-step temporal breakdown (the overview's first fallback)."""
    x = [[_rank_label(r.rank) for r in tb], [str(r.step) for r in tb]]
    data = [
        _bars(
            label,
            x,
            [_ms(getattr(r, attr)) for r in tb],
            COLORS[color],
            f"%{{x}}<br>{label}: %{{y:.2f}} ms<extra></extra>",
        )
        for attr, label, color in (
            ("compute_time_us", "Compute", "compute"),
            ("non_compute_time_us", "Non-compute (communication, memory)", "non_compute"),
            ("idle_time_us", "Idle", "idle"),
        )
    ]
    layout = _base_layout(barmode="stack", xaxis={"type": "multicategory"}, yaxis={"title": {"text": "ms"}})
    return ChartView("chart-overview-temporal", {"data": data, "layout": layout})


def _durations_chart(sd: list[StepDurationRow]) -> ChartView:
    """Step durations per rank (the overview's last fallback)."""
    by_rank: dict[Any, list[StepDurationRow]] = defaultdict(list)
    for r in sd:
        by_rank[r.rank].append(r)
    data = [
        {
            "type": "scatter",
            "mode": "lines+markers",
            "name": _rank_label(rk),
            "x": [str(r.step) for r in rows],
            "y": [_ms(r.duration_us) for r in rows],
        }
        for rk, rows in sorted(by_rank.items(), key=lambda kv: _key(kv[0]))
    ]
    layout = _base_layout(
        xaxis={"title": {"text": "step"}, "type": "category"},
        yaxis={"title": {"text": "step time (ms)"}},
    )
    return ChartView("chart-overview-durations", {"data": data, "layout": layout})


def _overview_fallback(doc: AnalysisDocument, sec: Section) -> Section:
    """Without a per-step diagnosis: the per-step temporal breakdown, else step durations."""
    tb = doc.temporal_breakdown_by_step or []
    sd = doc.step_durations or []
    reason = "the document has no per-step diagnosis ('steps')"
    if doc.steps is not None and not doc.rows("steps"):
        reason = "no training steps were found (neither ProfilerStep#N nor Optimizer.step annotations)"
    if tb:
        sec.notes.append(reason + "; showing the GPU temporal breakdown per step instead.")
        sec.charts.append(_temporal_by_step_chart(tb))
    elif sd:
        sec.notes.append(reason + "; showing step durations only.")
        sec.charts.append(_durations_chart(sd))
    else:
        sec.missing = reason + (" and no step durations" if doc.has("step_durations") else "")
    return sec


def _mean_of(ps: Sequence[Mapping[str, Any]], k: str) -> float:
    return sum(p[k] for p in ps) / len(ps) if ps else 0.0


def _overview_charts(parts: list[dict[str, Any]], sec: Section) -> None:
    """Per step (mean over ranks), per rank (mean over steps) and every rank and step."""
    keys = [k for k, _, _ in BREAKDOWN_PARTS]
    steps = sorted({p["step"] for p in parts}, key=_key)
    ranks = sorted({p["rank"] for p in parts}, key=_key)
    by_step: dict[Any, list[dict[str, Any]]] = defaultdict(list)
    by_rank: dict[Any, list[dict[str, Any]]] = defaultdict(list)
    for p in parts:
        by_step[p["step"]].append(p)
        by_rank[p["rank"]].append(p)
    series = {k: [_mean_of(by_step[s], k) for s in steps] for k in keys}
    fig = _stacked([str(s) for s in steps], series, xtitle="step", hover_x="step %{x}")
    _narrow(fig["layout"], len(steps))
    sec.charts.append(ChartView("chart-steps", fig, f"Per step, mean over {plural(len(ranks), 'rank')}."))
    if len(ranks) > 1:
        series_r = {k: [_mean_of(by_rank[r], k) for r in ranks] for k in keys}
        fig = _stacked([_rank_label(r) for r in ranks], series_r, xtitle="rank")
        _narrow(fig["layout"], len(ranks))
        sec.charts.append(
            ChartView(
                "chart-ranks",
                fig,
                f"Per rank, mean over {plural(len(steps), 'step')} (the distributed view: ranks that compute less and "
                "wait more are waiting for a straggler).",
            )
        )
    if 1 < len(ranks) and len(parts) <= MAX_CHART_BARS:
        ordered = sorted(parts, key=lambda p: (_key(p["rank"]), _key(p["step"])))
        x = [[_rank_label(p["rank"]) for p in ordered], [str(p["step"]) for p in ordered]]
        series_rs = {k: [p[k] for p in ordered] for k in keys}
        sec.charts.append(
            ChartView(
                "chart-rank-steps",
                _stacked(x, series_rs, xtitle="rank / step", multicategory=True),
                "Every rank and step.",
                height=420,
            )
        )
    elif len(parts) > MAX_CHART_BARS:
        sec.notes.append(
            f"{len(parts):,} rank-steps: the per rank and step chart is left out; see the table."
        )


# the per rank and step table's columns: label -> step_parts key
_STEP_COLUMNS = {
    "rank": "rank",
    "step": "step",
    "step (ms)": "step_time",
    "compute": "compute",
    "comm transfer": "comm_transfer",
    "comm wait": "comm_wait",
    "memory/other": "memory",
    "idle host-bound": "host",
    "idle other": "idle",
    "dataloader": "dataloader",
    "sync wait (all)": "sync_wait",
    "lateness": "lateness",
}


def _steps_table(parts: list[dict[str, Any]], max_rows: int) -> TableView:
    ordered = sorted(parts, key=lambda p: (_key(p["rank"]), _key(p["step"])))
    rows = [{label: p[k] for label, k in _STEP_COLUMNS.items()} for p in ordered]
    return table_from_rows(
        "table-steps",
        "Per rank and step (ms)",
        rows,
        max_rows=max_rows,
        collapsed=True,
        caption="'sync wait (all)' is all time spent in collectives waiting for the last rank, overlapped or not; "
        "'lateness' is how much later than the typical rank this rank arrived at the collectives.",
    )


def overview_section(document: AnalysisDocument | Mapping[str, Any], max_rows: int) -> Section:
    """Where each step's time went (the diagnosis ``steps`` table), with fallbacks."""
    doc = as_document(document)
    sec = Section(
        "overview",
        "Overview: step-time breakdown",
        "Where each training step's time went, per step and per rank: compute, communication not "
        "hidden behind compute (split into the transfer itself and waiting for slower ranks), memory "
        "copies and other device work, and idle time (on GPUs, the part where the next kernel had not "
        "been launched yet is host-bound). The parts add up to the step time. On CPU-only traces "
        "compute is the host's operators and communication the gloo collectives.",
    )
    parts = step_parts_by_rank_step(doc)
    if not parts:
        return _overview_fallback(doc, sec)
    _overview_charts(parts, sec)
    sec.tables.append(_steps_table(parts, max_rows))
    return sec


# ---------------------------------------------------------------------------------------
# Stragglers
# ---------------------------------------------------------------------------------------
def _heatmap(parts: list[dict[str, Any]]) -> dict[str, Any] | None:
    ranks = sorted({p["rank"] for p in parts}, key=lambda r: (r is None, r))
    steps = sorted({p["step"] for p in parts}, key=lambda s: (s is None, s))
    if len(ranks) < 1 or len(steps) < 1:
        return None
    idx_r = {r: i for i, r in enumerate(ranks)}
    idx_s = {s: i for i, s in enumerate(steps)}
    mats: dict[str, list[list[float | None]]] = {}
    for key in ("lateness", "sync_wait", "self_time", "step_time"):
        m: list[list[float | None]] = [[None] * len(steps) for _ in ranks]
        for p in parts:
            v = p[key]
            m[idx_r[p["rank"]]][idx_s[p["step"]]] = None if v is None else round(v, 4)
        mats[key] = m
    labels = {
        "lateness": "arrival lateness (ms)",
        "sync_wait": "waiting for peers (ms)",
        "self_time": "step time without waiting (ms)",
        "step_time": "step time (ms)",
    }
    x = [str(s) for s in steps]
    y = [_rank_label(r) for r in ranks]

    def zmax(m: list[list[float | None]]) -> float:
        return max([v for row in m for v in row if v is not None] + [0.001])

    trace = {
        "type": "heatmap",
        "z": mats["lateness"],
        "x": x,
        "y": y,
        "colorscale": HEAT,
        "zmin": 0,
        "zmax": zmax(mats["lateness"]),
        "colorbar": {"title": {"text": "ms"}},
        "xgap": 1,
        "ygap": 1,
        "hovertemplate": "%{y}, step %{x}<br>%{z:.2f} ms<extra></extra>",
    }
    buttons = [
        {
            "label": labels[k],
            "method": "restyle",
            "args": [{"z": [mats[k]], "zmin": [0], "zmax": [zmax(mats[k])]}],
        }
        for k in ("lateness", "sync_wait", "self_time", "step_time")
    ]
    layout = _base_layout(
        xaxis={"title": {"text": "step"}, "type": "category"},
        yaxis={"title": {"text": ""}, "type": "category", "autorange": "reversed"},
        updatemenus=[
            {
                "type": "buttons",
                "direction": "right",
                "x": 0,
                "y": 1.18,
                "xanchor": "left",
                "showactive": True,
                "buttons": buttons,
            }
        ],
        margin={"l": 70, "r": 20, "t": 60, "b": 50},
    )
    return {"data": [trace], "layout": layout}


def _straggler_kpis(s: Stragglers) -> list[Kpi]:
    """The verdict, time lost, the what-if, steps with a late rank and confidence."""
    kind = s.kind or "unknown"
    named = f"{'rank' if len(s.ranks) == 1 else 'ranks'} {', '.join(map(str, s.ranks[:10]))}"
    out = [
        Kpi(
            "Verdict",
            kind + (f": {named}" if s.ranks else ""),
            None,
            {"persistent": "bad", "intermittent": "warn", "none": "good"}.get(kind),
        )
    ]
    if _num(s.lost_fraction) is not None:
        out.append(Kpi("Time lost to stragglers", fmt_pct(s.lost_fraction), "share of step time"))
    wi = s.what_if
    if wi is not None and _num(wi.mean_step_time_us) is not None:
        if _num(wi.est_step_time_without_stragglers_us) is not None:
            out.append(
                Kpi(
                    "What-if",
                    f"{fmt_ms(wi.mean_step_time_us)} → {fmt_ms(wi.est_step_time_without_stragglers_us)}",
                    "mean step time now → without stragglers",
                )
            )
    if s.steps_analysed is not None:
        out.append(Kpi("Steps with a late rank", f"{s.straggled_steps or 0} / {s.steps_analysed}"))
    if s.confidence not in (None, "n/a"):
        out.append(Kpi("Confidence", str(s.confidence)))
    return out


def _straggler_tables(s: Stragglers, max_rows: int) -> list[TableView]:
    out = []
    per_rank = msgspec.to_builtins(s.per_rank_by_score())
    if per_rank:
        out.append(
            _ms_table(
                "table-straggler-ranks",
                "Per rank (highest straggler score first)",
                per_rank,
                max_rows,
                caption="score = share of job time the other ranks spent waiting for this rank; late share = "
                "share of steps in which it arrived late.",
            )
        )
    if s.per_step:
        out.append(
            _ms_table(
                "table-straggler-steps",
                "Per step: what-if without stragglers",
                msgspec.to_builtins(s.per_step),
                max_rows,
                collapsed=True,
                caption="est. step time = step time minus the excess caused by the flagged ranks.",
            )
        )
    return out


def stragglers_section(document: AnalysisDocument | Mapping[str, Any], max_rows: int) -> Section:
    """The lateness heatmap (rank x step), the verdict's figures and its tables."""
    doc = as_document(document)
    sec = Section(
        "stragglers",
        "Stragglers",
        "Arrival skew at the collectives, rank × step: how much later than the typical rank each rank "
        "arrived (lateness). A persistent straggler is a dark row; intermittent stragglers are scattered "
        "dark cells. The buttons switch to the time each rank waited for its peers, and to the step time "
        "without that waiting (what differs between a straggler and the others, since DDP's all-reduce "
        "makes every rank's wall step time equal).",
    )
    parts = step_parts_by_rank_step(doc)
    n_ranks = len({p["rank"] for p in parts})
    if n_ranks > 1 and (fig := _heatmap(parts)) is not None:
        sec.charts.append(
            ChartView("chart-straggler-heatmap", fig, height=max(260, min(900, 110 + 28 * n_ranks)))
        )
    elif n_ranks == 1:
        sec.notes.append("One rank only: there is no other rank to compare arrival times with.")
    s = doc.stragglers
    if s is None:
        if not parts:
            sec.missing = "the document has no 'stragglers' result (the diagnosis was not run or failed)"
        else:
            sec.notes.append(
                "The straggler verdict is missing from the document; the heatmap comes from the per-step table."
            )
        return sec
    sec.kpis.extend(_straggler_kpis(s))
    for label, text in (("Why", s.reason), ("Cause", s.cause)):
        if text:
            sec.notes.append(f"{label}: {text}")
    sec.tables.extend(_straggler_tables(s, max_rows))
    if not parts and not s.per_rank:
        sec.notes.append("No per-step data to draw the heatmap.")
    return sec


# ---------------------------------------------------------------------------------------
# MFU
# ---------------------------------------------------------------------------------------
def _mfu_kpis(m: Mfu) -> list[Kpi]:
    value = _num(m.mfu)
    out = [
        Kpi(
            "MFU",
            fmt_pct(value, 2) if value is not None else "n/a",
            None,
            None if value is None else ("bad" if value < 0.2 else "warn" if value < 0.4 else "good"),
        )
    ]
    if m.flops_per_step is not None:
        out.append(Kpi("FLOPs per step", f"{m.flops_per_step:.3g}", f"from {m.flops_source or '?'}"))
    if m.step_time_s is not None:
        out.append(Kpi("Step time", f"{1000 * m.step_time_s:,.2f} ms"))
    if m.achieved_flops_per_chip is not None:
        out.append(Kpi("Achieved per device", f"{m.achieved_flops_per_chip / 1e12:,.3f} TFLOP/s"))
    if m.peak_flops_per_chip is not None:
        out.append(
            Kpi("Peak per device", f"{m.peak_flops_per_chip / 1e12:,.1f} TFLOP/s", str(m.peak_source or ""))
        )
    if m.chips is not None:
        out.append(Kpi("Devices", str(m.chips)))
    return out


def mfu_section(document: AnalysisDocument | Mapping[str, Any]) -> Section:
    """MFU and what it rests on (FLOPs, step time, peak), or why it was not computed."""
    doc = as_document(document)
    sec = Section(
        "mfu",
        "Model FLOPs utilisation (MFU)",
        "Achieved model FLOP/s per device divided by the device's peak FLOP/s.",
    )
    m = doc.mfu
    if m is None:
        sec.missing = "the document has no 'mfu' result (the diagnosis was not run or failed)"
        return sec
    sec.kpis.extend(_mfu_kpis(m))
    if _num(m.mfu) is None and m.reason:
        sec.notes.append(f"Not computed: {m.reason}")
    if m.formula:
        sec.notes.append(m.formula)
    sec.notes.extend(f"Assumption: {a}" for a in m.assumptions)
    if m.device or m.precision:
        sec.notes.append(f"Device: {m.device or '?'}; precision: {m.precision or '?'}.")
    return sec


# ---------------------------------------------------------------------------------------
# GPU views (HTA analyses)
# ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class RankBars:
    """One bar series of a per-rank chart (:func:`_per_rank_section`): ``attr``, a time in us
    of each row (drawn in ms); ``share``, the attribute of its percentage, shown on hover."""

    attr: str
    label: str
    color: str
    hover: str
    share: str | None = None


def _per_rank_section(
    sec: Section, doc: AnalysisDocument, key: str, bars: Sequence[RankBars], barmode: str, table: TableView
) -> Section:
    """The shape of the per-rank analyses (temporal breakdown, overlap): one bar chart, ranks on
    the x axis, a series per :class:`RankBars`, then ``table``; ``sec.missing`` when the
    analysis ``key`` has no rows. Ids follow the section: ``chart-<id>``."""
    rows = getattr(doc, key) or []
    if not rows:
        sec.missing = doc.note_for(key) or "no rows"
        return sec
    x = [_rank_label(r.rank) for r in rows]
    data = [
        _bars(
            b.label,
            x,
            [_ms(getattr(r, b.attr)) for r in rows],
            b.color,
            b.hover,
            **({"customdata": [_num(getattr(r, b.share)) for r in rows]} if b.share else {}),
        )
        for b in bars
    ]
    layout = _base_layout(barmode=barmode, xaxis={"type": "category"}, yaxis={"title": {"text": "ms"}})
    sec.charts.append(ChartView(f"chart-{sec.id}", {"data": data, "layout": _narrow(layout, len(x))}))
    sec.tables.append(table)
    return sec


def _share_bars(attr: str, label: str, color: str) -> RankBars:
    """A temporal-breakdown series: ``attr`` (us) with its ``*_pctg`` share on hover."""
    hover = f"%{{x}}<br>{label}: %{{y:.2f}} ms (%{{customdata:.1f}} %)<extra></extra>"
    return RankBars(f"{attr}_us", label, COLORS[color], hover, share=f"{attr}_pctg")


def temporal_section(document: AnalysisDocument | Mapping[str, Any], max_rows: int) -> Section:
    doc = as_document(document)
    sec = Section(
        "temporal",
        "Temporal breakdown per rank",
        "GPU time per rank split into compute kernels, non-compute kernels (communication, memory) and "
        "idle time (HTA's temporal breakdown).",
    )
    bars = [
        _share_bars("compute_time", "Compute", "compute"),
        _share_bars("non_compute_time", "Non-compute", "non_compute"),
        _share_bars("idle_time", "Idle", "idle"),
    ]
    rows = doc.rows("temporal_breakdown")
    table = table_from_rows("table-temporal", "Temporal breakdown", rows, max_rows=max_rows, collapsed=True)
    return _per_rank_section(sec, doc, "temporal_breakdown", bars, "stack", table)


def _idle_chart(rows: list[IdleRow]) -> ChartView:
    keys = sorted({(r.rank, r.stream) for r in rows}, key=lambda k: (_key(k[0]), _key(k[1])))
    cats: list[str | None] = []
    for r in rows:
        if r.idle_category not in cats:
            cats.append(r.idle_category)
    x = [f"rank {r} / stream {s}" for r, s in keys]
    data = []
    for c in cats:
        vals = {(r.rank, r.stream): r for r in rows if r.idle_category == c}
        data.append(
            _bars(
                plotly_text(str(c).replace("_", " ")),
                x,
                [_ms(vals[k].idle_time) if k in vals else None for k in keys],
                COLORS.get(str(c), "#bab0ac"),
                "%{x}<br>"
                + plotly_text(str(c))
                + ": %{y:.2f} ms (%{customdata:.1f} % of idle)<extra></extra>",
                customdata=[(_num(vals[k].idle_time_ratio) or 0) * 100 if k in vals else None for k in keys],
            )
        )
    layout = _base_layout(barmode="stack", xaxis={"type": "category"}, yaxis={"title": {"text": "idle ms"}})
    return ChartView("chart-idle", {"data": data, "layout": _narrow(layout, len(x))})


def idle_section(document: AnalysisDocument | Mapping[str, Any], max_rows: int) -> Section:
    doc = as_document(document)
    sec = Section(
        "idle",
        "Idle time",
        "GPU idle time per rank and stream: host wait (the GPU waited for the CPU to launch work), "
        "kernel wait (short gaps between back-to-back kernels) and other.",
    )
    rows = doc.idle_time_breakdown or []
    if not rows:
        sec.missing = doc.note_for("idle_time_breakdown") or "no rows"
        return sec
    sec.charts.append(_idle_chart(rows))
    sec.tables.append(
        table_from_rows(
            "table-idle",
            "Idle time by category",
            doc.rows("idle_time_breakdown"),
            max_rows=max_rows,
            collapsed=True,
            labels={"idle_time": "idle_time (us)"},
        )
    )
    return sec


def _kernel_types_chart(kt: list[KernelTypeRow]) -> ChartView:
    tot: dict[str, float] = defaultdict(float)
    for r in kt:
        tot[str(r.kernel_type)] += _num(r.sum) or 0.0
    items = sorted(tot.items(), key=lambda kv: -kv[1])
    allsum = sum(v for _, v in items) or 1.0
    trace = {
        "type": "bar",
        "orientation": "h",
        "y": [plotly_text(k, 60) for k, _ in items],
        "x": [v / 1000.0 for _, v in items],
        "customdata": [100 * v / allsum for _, v in items],
        "marker": {"color": COLORS["compute"]},
        "hovertemplate": "%{y}<br>%{x:.2f} ms (%{customdata:.1f} %)<extra></extra>",
    }
    layout = _base_layout(
        yaxis={"type": "category", "autorange": "reversed", "automargin": True},
        xaxis={"title": {"text": "ms (all ranks)"}},
        showlegend=False,
    )
    return ChartView(
        "chart-kernel-types",
        {"data": [trace], "layout": layout},
        "GPU time by kernel type (overlapping kinds are counted once, under their combination).",
        height=max(220, 60 + 28 * len(items)),
    )


def _top_kernels(src: list[KernelRow]) -> list[dict[str, Any]]:
    """Kernels summed over ranks, the ``TOP_KERNELS`` longest (``others`` left out)."""
    agg: dict[str, dict[str, Any]] = {}
    for r in src:
        name = str(r.name)
        a = agg.setdefault(name, {"name": name, "kernel_type": r.kernel_type, "sum": 0.0, "count": 0})
        a["sum"] += _num(r.sum_us) or 0.0
        a["count"] += int(_num(r.count) or 0)
    return sorted((a for a in agg.values() if a["name"] != "others"), key=lambda a: -a["sum"])[:TOP_KERNELS]


def _kernel_color(kernel_type: Any) -> str:
    kind = str(kernel_type)
    if kind.startswith("COMM"):
        return COLORS["comm_transfer"]
    return COLORS["memory"] if kind.startswith("MEM") else COLORS["compute"]


def _top_kernels_chart(top: list[dict[str, Any]]) -> ChartView:
    trace = {
        "type": "bar",
        "orientation": "h",
        "y": [plotly_text(f"{i + 1}. {short_name(a['name'])}", 70) for i, a in enumerate(top)],
        "x": [a["sum"] / 1000.0 for a in top],
        "customdata": [[plotly_text(a["name"], 300), a["count"], plotly_text(a["kernel_type"])] for a in top],
        "marker": {"color": [_kernel_color(a["kernel_type"]) for a in top]},
        "hovertemplate": "%{customdata[0]}<br>%{customdata[2]}, %{customdata[1]} calls<br>%{x:.2f} ms<extra></extra>",
    }
    layout = _base_layout(
        yaxis={"type": "category", "autorange": "reversed", "automargin": True},
        xaxis={"title": {"text": "total ms (all ranks)"}},
        showlegend=False,
        margin={"l": 20, "r": 20, "t": 20, "b": 50},
    )
    return ChartView(
        "chart-top-kernels",
        {"data": [trace], "layout": layout},
        f"Top {len(top)} kernels by total time.",
        height=max(260, 60 + 26 * len(top)),
    )


def _kernel_tables(doc: AnalysisDocument, max_rows: int) -> list[TableView]:
    kb, kd, kt = (
        doc.rows("kernel_breakdown"),
        doc.rows("kernel_distribution"),
        doc.rows("kernel_type_breakdown"),
    )
    out = []
    if kb:
        ms_cols = [c for c in kb[0] if c.endswith("(us)")] + (["stddev"] if "stddev" in kb[0] else [])
        out.append(
            table_from_rows(
                "table-kernels",
                "Top kernels per rank and type",
                kb,
                max_rows=max_rows,
                labels={c: c.replace("(us)", "(ms)") if c.endswith("(us)") else f"{c} (ms)" for c in ms_cols},
                formatters={c: (lambda v: Cell(fmt_num(_ms(v), 3), num=True)) for c in ms_cols},
            )
        )
    if kd:
        out.append(
            table_from_rows(
                "table-kernel-distribution",
                "Kernel duration distribution (µs)",
                kd,
                max_rows=max_rows,
                collapsed=True,
            )
        )
    if kt:
        out.append(
            table_from_rows(
                "table-kernel-types",
                "Kernel types per rank",
                kt,
                max_rows=max_rows,
                collapsed=True,
                labels={"sum": "sum (us)", "percentage": "%"},
            )
        )
    return out


def kernels_section(document: AnalysisDocument | Mapping[str, Any], max_rows: int) -> Section:
    doc = as_document(document)
    sec = Section(
        "kernels",
        "Kernels",
        "GPU time by kernel type, and the kernels that take the most time (summed over ranks). Names "
        "are shortened (templates and arguments removed); hover or expand for the full name.",
    )
    if not (
        doc.rows("kernel_type_breakdown") or doc.rows("kernel_breakdown") or doc.rows("kernel_distribution")
    ):
        sec.missing = doc.note_for("kernel_breakdown", "kernel_type_breakdown") or "no rows"
        return sec
    if doc.kernel_type_breakdown:
        sec.charts.append(_kernel_types_chart(doc.kernel_type_breakdown))
    top = _top_kernels(doc.kernel_breakdown or doc.kernel_distribution or [])
    if top:
        sec.charts.append(_top_kernels_chart(top))
    sec.tables.extend(_kernel_tables(doc, max_rows))
    return sec


def overlap_section(document: AnalysisDocument | Mapping[str, Any], max_rows: int) -> Section:
    doc = as_document(document)
    sec = Section(
        "overlap",
        "Communication–computation overlap",
        "Share of communication-kernel time during which computation kernels also ran, per rank. Low "
        "overlap means communication adds directly to step time.",
    )
    bars = [
        RankBars(
            "communication_time_us",
            "communication time",
            COLORS["comm_transfer"],
            "%{x}<br>communication %{y:.2f} ms<extra></extra>",
        ),
        RankBars(
            "overlap_time_us",
            "overlapped by computation",
            COLORS["compute"],
            "%{x}<br>overlapped %{y:.2f} ms (%{customdata:.1f} %)<extra></extra>",
            share="comp_comm_overlap_pctg",
        ),
    ]
    table = table_from_rows(
        "table-overlap", "Overlap per rank", doc.rows("comm_comp_overlap"), max_rows=max_rows
    )
    return _per_rank_section(sec, doc, "comm_comp_overlap", bars, "group", table)


def launch_section(document: AnalysisDocument | Mapping[str, Any], max_rows: int) -> Section:
    doc = as_document(document)
    sec = Section(
        "launch",
        "Kernel launches, queues and memory bandwidth",
        "CPU-side kernel launch statistics (short kernels, launch-delay outliers), launch-queue length "
        "per stream, time blocked on a full queue, and memory copy/set bandwidth.",
    )
    names = [
        ("kernel_launch_summary", "Kernel launches"),
        ("queue_length_summary", "Launch-queue length"),
        ("time_blocked_on_full_queue", "Time blocked on a full launch queue"),
        ("memory_bw_summary", "Memory bandwidth (GB/s)"),
    ]
    for key, title in names:
        rows = doc.rows(key)
        if rows:
            sec.tables.append(table_from_rows(f"table-{key}", title, rows, max_rows=max_rows))
    if not sec.tables:
        sec.missing = doc.note_for(*[k for k, _ in names]) or "no rows"
    return sec


# ---------------------------------------------------------------------------------------
# Job and clocks
# ---------------------------------------------------------------------------------------
def _job_kpis(job: Job) -> list[Kpi]:
    ws, found = job.world_size, job.num_ranks_found
    out = [
        Kpi(
            "Ranks found",
            f"{found if found is not None else '?'} / {ws if ws is not None else '?'}",
            f"world size from {job.world_size_source or '?'}",
        )
    ]
    if job.steps_found is not None:
        out.append(Kpi("Steps", str(job.steps_found), f"from {job.step_source or '?'}"))
    if job.job_id:
        out.append(Kpi("Job id", job.job_id))
    if job.device_types:
        out.append(Kpi("Devices", ", ".join(job.device_types)))
    if job.backends:
        out.append(Kpi("Backend", ", ".join(job.backends)))
    return out


def _job_notes(job: Job) -> list[str]:
    out = []
    missing = job.missing_ranks
    if missing:
        shown = ", ".join(map(str, missing[:40])) + (
            f" … ({len(missing)} in all)" if len(missing) > 40 else ""
        )
        out.append(f"Missing ranks: {shown}.")
    if job.duplicate_ranks:
        out.append(f"Several files claim ranks {', '.join(map(str, job.duplicate_ranks))}.")
    if job.unranked_files:
        out.append(f"Files without a rank: {', '.join(job.unranked_files[:10])}.")
    out.extend(job.notes)
    return out


def _clock_notes(clock: Clock) -> list[str]:
    residual = _num(clock.residual_us)
    head = (
        f"Clock reference rank {clock.reference_rank}, matched on {clock.match_method}"
        + (f", residual {fmt_num(residual, 1)} µs" if residual is not None else "")
        + "."
    )
    return [head, *clock.notes]


def job_section(document: AnalysisDocument | Mapping[str, Any], max_rows: int) -> Section:
    doc = as_document(document)
    sec = Section(
        "job",
        "Job and clocks",
        "Which ranks were found, and how their clocks were aligned (on collective ends) before comparing "
        "them.",
    )
    job = doc.job
    if job is None:
        sec.missing = "the document has no 'job' result (the diagnosis was not run or failed)"
        return sec
    sec.kpis.extend(_job_kpis(job))
    sec.notes.extend(_job_notes(job))
    if job.clock is not None:
        sec.notes.extend(_clock_notes(job.clock))
        offs = job.clock.offsets
        if offs:
            sec.tables.append(
                table_from_rows(
                    "table-clock",
                    "Clock offsets (add offset to a rank's times)",
                    msgspec.to_builtins(offs),
                    max_rows=max_rows,
                    collapsed=len(offs) > 8,
                )
            )
    for o in job.other_jobs:
        sec.notes.append(f"Other job in the inputs (not diagnosed): {o.key} with ranks {o.ranks}.")
    return sec


KNOWN_KEYS = {
    "traces",
    "evidence",
    "diagnosis_summary",
    "job",
    "steps",
    "stragglers",
    "mfu",
    "recommendations",
    "notes",
    "errors",
    "temporal_breakdown",
    "idle_time_breakdown",
    "kernel_breakdown",
    "kernel_type_breakdown",
    "kernel_distribution",
    "comm_comp_overlap",
    "kernel_launch_summary",
    "queue_length_summary",
    "time_blocked_on_full_queue",
    "memory_bw_summary",
    "summary",
}


def other_section(document: AnalysisDocument | Mapping[str, Any], max_rows: int) -> Section:
    doc = as_document(document)
    sec = Section("other", "Other analyses", "Every other result in the document, as tables.")
    for key in doc.keys:
        if key in KNOWN_KEYS:
            continue
        if key in doc.tables:
            if doc.tables[key]:
                sec.tables.append(
                    table_from_rows(
                        f"table-other-{key}", key, doc.tables[key], max_rows=max_rows, collapsed=True
                    )
                )
            else:
                sec.notes.append(f"{key}: {(doc.notes[key] if key in doc.notes else '') or 'no rows'}")
        elif key in doc.objects:
            sec.tables.append(
                table_from_rows(f"table-other-{key}", key, [doc.objects[key]], max_rows=1, collapsed=True)
            )
    if not sec.tables and not sec.notes:
        sec.missing = "nothing else in the document"
    return sec


def traces_table(document: AnalysisDocument | Mapping[str, Any]) -> TableView | None:
    rows = as_document(document).rows("traces")
    if not rows:
        return None
    cols = [
        c
        for c in (
            "rank",
            "world_size",
            "rank_source",
            "device_type",
            "num_trace_events",
            "hostname",
            "path",
            "warnings",
        )
        if any(c in r for r in rows)
    ]
    return table_from_rows(
        "table-traces",
        "Traces",
        rows,
        columns=cols,
        max_rows=500,
        formatters={"warnings": lambda v: Cell("; ".join(map(str, v)) if v else "–")},
    )


def build_view(
    document: AnalysisDocument | Mapping[str, Any],
    *,
    title: str | None = None,
    inputs: Sequence[str] = (),
    max_rows: int = 50,
) -> ReportView:
    """The report's view model of a document (decoded once; every section reads typed parts)."""
    doc = as_document(document)  # a TypeError for anything but a JSON object
    evidence = evidence_section(doc, max_rows)
    sections = [
        *([evidence] if evidence is not None else []),
        recommendations_section(doc),
        overview_section(doc, max_rows),
        stragglers_section(doc, max_rows),
        mfu_section(doc),
        temporal_section(doc, max_rows),
        idle_section(doc, max_rows),
        kernels_section(doc, max_rows),
        overlap_section(doc, max_rows),
        launch_section(doc, max_rows),
        job_section(doc, max_rows),
        other_section(doc, max_rows),
    ]
    verdict = verdict_view(doc)
    verdict["kpis"] = _kpis(doc)
    return ReportView(
        title=title or "Kinetoscope report",
        verdict=verdict,
        sections=sections,
        traces=traces_table(doc),
        inputs=[str(i) for i in inputs],
        notes=[f"{k}: {v}" for k, v in doc.notes.items()],
        errors=[f"{k}: {v}" for k, v in doc.errors.items()],
    )
