"""The ``Diagnosis`` object: tables, JSON form and the short human verdict."""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import polars as pl

from kinetoscope.diagnosis import builders
from kinetoscope.diagnosis.assembly import Job
from kinetoscope.diagnosis.clock import ClockAlignment
from kinetoscope.diagnosis.evidence import Evidence, headline
from kinetoscope.diagnosis.extras import pipeline_line, uneven_lines
from kinetoscope.diagnosis.mfu import MFUResult
from kinetoscope.diagnosis.stragglers.model import StragglerReport
from kinetoscope.diagnosis.stragglers.reconcile import rotating_line

# A sentence ends at ". " before a capital letter (so "e.g. the" does not end one).
_SENTENCE_END = re.compile(r"(?<=\.)\s+(?=[A-Z])")


def _pct(x: float | None) -> str:
    if x is None:
        return "n/a"
    return f"{100 * x:.1f}%" if abs(x) >= 0.001 else f"{100 * x:.2g}%"


def _ms(us: float | None) -> str:
    """A duration given in µs, as ms (one decimal), or as µs below 0.1 ms (a GPU job's noise
    sigma of a few µs is not "0.0 ms")."""
    if us is None:
        return "n/a"
    return f"{us / 1000.0:.1f} ms" if abs(us) >= 100.0 or us == 0 else f"{us:.0f} µs"


def _n(k: int, noun: str) -> str:
    return f"{k} {noun}" + ("" if k == 1 else "s")


def short_cause(cause: dict[str, Any] | None) -> str:
    """A named rank's cause in a few words, with its own numbers (``stragglers.rank_cause``)."""
    if not cause or not cause.get("components"):
        return "cause unknown"
    by = cause.get("explained_by")
    comp = cause["components"]
    if by == "compute":
        c = comp["compute"]
        peers = "its stage peers'" if cause.get("cohort") is not None else "the peers'"
        return f"its compute {c['ratio']:.2f}x {peers} median" if c.get("ratio") else "its compute is slower"
    if by == "slow_link":
        c = comp["slow_link"]
        return (
            f"slow link / its collectives' transfer: ends {c['excess_ms']:.1f} ms per step after its peers' "
            f"at {c['late_ends']}/{c['instances']} collectives"
        )
    label = {"dataloader": "data loading", "host_gap": "host gaps", "transfer": "transfer"}.get(str(by))
    if label:
        return f"{label} +{comp[by]['excess_ms']:.1f} ms per late step vs peers"
    return "not explained by profiled work (suspect its host or link)"


def _behind(steady: dict[str, Any] | None) -> str:
    """The verdict line's "behind the others in K/N steps" for a rank judged persistent for its
    steady lateness (``stragglers.steady``): last in only some steps, behind its peers in nearly
    all, which its "late in" count alone would not show."""
    if not steady or not steady.get("steadily_late"):
        return ""
    return f", behind the others in {steady['behind_steps']}/{steady['steps']} steps"


def single_process_lines(bd: pl.DataFrame, recommendations: list[dict[str, Any]]) -> list[str]:
    """The headline of a one-process job: where its step time goes, what bounds it, and the top
    recommendation with its evidence. Shares are of the summed step time (GPU: device busy
    computing, idle waiting for the host, memory copies; CPU: host ops, idle; both: data
    loading, exposed communication); data loading overlaps the host compute it runs."""
    total = float(bd["step_time(us)"].sum()) or 1.0
    gpu = bd["launch_gap(us)"].null_count() < bd.height

    def f(col: str) -> float:
        return float(bd[col].fill_null(0).sum()) / total

    comp, dl, comm, idle = f("compute(us)"), f("dataloader(us)"), f("exposed_comm(us)"), f("idle(us)")
    parts = [("GPU busy computing" if gpu else "host compute", comp)]
    if gpu:
        lg = f("launch_gap(us)")
        mem = max(0.0, 1.0 - comp - comm - idle)
        parts += [("GPU idle waiting for the host", lg), ("memory copies", mem)]
    parts += [("data loading", dl), ("exposed communication", comm), ("idle", idle)]
    if dl >= 0.15:
        bound = "input-bound"
    elif gpu and f("launch_gap(us)") >= 0.30:
        bound = "launch-bound"
    elif comm >= 0.25:
        bound = "communication-bound"
    elif comp >= 0.5:
        bound = "compute-bound"
    else:
        bound = f"not bound by one part (idle {_pct(idle)})"
    med = float(bd["step_time(us)"].median())  # type: ignore[arg-type]
    shares = ", ".join(f"{name} {_pct(v)}" for name, v in parts if v >= 0.005)
    line1 = f"SINGLE PROCESS: {bound}; median step {_ms(med)} over {bd.height} steps: {shares}."
    if not recommendations:
        return [line1, "No recommendation: no detector fired."]
    r = recommendations[0]
    ev = ", ".join(
        f"{k} {v}"
        for k, v in r["evidence"].items()
        if isinstance(v, (int, float)) and not isinstance(v, bool)
    )
    return [line1, f"Top recommendation ({r['severity']}): {r['title']}" + (f" ({ev})." if ev else ".")]


class SummaryLines(list[str]):
    """The summary's lines; prints (and shows in a notebook) as text, one line each, and is
    still the JSON list of ``diagnosis_summary``."""

    def __str__(self) -> str:
        return "\n".join(self)

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:  # IPython / Jupyter
        p.text(str(self))


@dataclass
class Diagnosis(Mapping[str, Any]):
    """Result of ``kinetoscope.diagnosis.diagnose``.

    Tables (Polars): ``steps`` (per rank, per step), ``collectives`` (per matched collective
    instance), ``stragglers.per_rank``, ``stragglers.per_step``, ``clock.table``.
    ``to_dict()`` is the JSON contract, built by ``builders.BUILDERS``; as a Mapping it yields
    the ``kscope analyze`` diagnosis keys (``summary``, then ``protocol.document_keys``'s).
    ``pipeline``, ``uneven_inputs`` and ``recompilation`` are the optional analyses of
    docs/diagnosis.md section 11 in their JSON form, ``None`` when the job does not show the
    problem."""

    job: Job
    clock: ClockAlignment
    steps: pl.DataFrame
    collectives: pl.DataFrame
    stragglers: StragglerReport
    mfu: MFUResult
    recommendations: list[dict[str, Any]] = field(default_factory=list)
    step_source: str | None = None
    other_jobs: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    # what the verdict rests on (``evidence.gather_evidence``); the headline follows it
    evidence: Evidence | None = None
    pipeline: dict[str, Any] | None = None
    uneven_inputs: dict[str, Any] | None = None
    recompilation: dict[str, Any] | None = None
    # per collective type (``bandwidth.collective_bandwidth``): a rule's measurement, not a key
    collective_bandwidth: dict[str, Any] | None = None
    _mapping: dict[str, Any] | None = field(default=None, init=False, repr=False, compare=False)

    # ---- JSON ------------------------------------------------------------------------------------
    def job_dict(self) -> dict[str, Any]:
        """The ``job`` part alone (``builders.job_part``), JSON-ready."""
        part: dict[str, Any] = builders.encode(builders.job_part(builders.DiagnosisContext(self)))
        return part

    def to_dict(self) -> dict[str, Any]:
        """The diagnosis keys of the document, every builder of ``builders.BUILDERS`` in order."""
        return builders.build_parts(builders.DiagnosisContext(self))

    # Mapping interface: what the analysis runner's diagnosis hook consumes. Built once, on first
    # access (``dict(diagnosis)`` reads every key; ``to_dict()`` is not cheap).
    def _hook(self) -> dict[str, Any]:
        if self._mapping is None:
            d = self.to_dict()
            d["steps"] = self.steps
            self._mapping = d
        return self._mapping

    def __getitem__(self, key: str) -> Any:
        return self._hook()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(b.key for b in builders.BUILDERS)

    def __len__(self) -> int:
        return len(builders.BUILDERS)

    # ---- human output ------------------------------------------------------------------------------------
    def verdict(self) -> str:
        """The verdict as the evidence allows (``headline``), lines joined by a newline."""
        return "\n".join(self.headline_lines())

    def headline_lines(self) -> list[str]:
        """``verdict_lines`` as the evidence allows (``evidence.headline``): ``NOT ASSESSED`` when
        the traces cannot carry a cross-rank verdict, the first line naming anomalous data under
        it, then the evidence lines."""
        return headline(self.verdict_lines(), self.evidence, multi_rank=len(self.job.traces) > 1)

    def verdict_lines(self) -> list[str]:
        """At most two lines: the kind with the named ranks (each with its share of the waiting,
        its evidence and its cause, every number that rank's own), then the what-if. A
        single-process job gets its own headline (``single_process_lines``). A job's own problem
        leads: ranks that ran out of data first (their collectives are not a straggler's), else
        the pipeline's bubble and imbalance in place of the straggler line."""
        if self.uneven_inputs:
            return uneven_lines(self.uneven_inputs)
        lines = self._straggler_lines()
        return [pipeline_line(self.pipeline), lines[0]] if self.pipeline else lines

    def _straggler_lines(self) -> list[str]:
        if len(self.job.traces) == 1 and self.steps.height:
            return single_process_lines(self.steps, self.recommendations)
        s = self.stragglers
        if s.kind == "rotating":
            return [rotating_line(s, s.whatif or {}), self._what_if_line()]
        if s.kind in ("persistent", "intermittent", "mixed"):
            return [self._named_line(), self._what_if_line()]
        if s.skew_fraction is None:  # no arrival was compared: no verdict either way
            return [f"STRAGGLERS NOT ASSESSED: {s.reason or 'nothing to compare'}."]
        head = f"NO STRAGGLER: {s.reason or 'nothing to compare'}."
        return [
            head,
            f"Arrival jitter costs {_pct(s.skew_fraction)} of step time (noise sigma {_ms(s.sigma_us)}).",
        ]

    def _named_line(self) -> str:
        s = self.stragglers
        plural = (
            "S" if len(s.ranks) > 1 or s.kind == "intermittent" else ""
        )  # (the intermittent head has always been plural)
        head = f"{s.kind.upper()} STRAGGLER{plural}"
        segs = []
        for r in s.ranks:
            row = s.rank_row(r)
            host = f" (host {s.hosts.get(r)})" if s.hosts.get(r) else ""
            share = (
                f"{_pct(row.get('lost_share'))} of the time lost"
                if len(s.ranks) > 1
                else f"{_pct(row.get('imposed_share'))} of the imposed wait"
            )
            if (s.causes.get(r) or {}).get("explained_by") == "slow_link" and not row.get("last_count"):
                segs.append(f"rank {r}{host}: {short_cause(s.causes.get(r))}")
                continue
            segs.append(
                f"rank {r}{host}: {share}, last at "
                f"{row.get('last_count')}/{row.get('instances')} collectives, late in "
                f"{row.get('late_steps')}/{row.get('steps')} steps{_behind(s.steady.get(r))}, "
                f"{short_cause(s.causes.get(r))}"
            )
        pattern = f" ({s.pattern})" if s.pattern and s.pattern != "steady" else ""
        return f"{head}{pattern}: " + "; ".join(segs) + "."

    def _what_if_line(self) -> str:
        s = self.stragglers
        who = ", ".join(map(str, s.ranks))
        line = (
            f"What-if: rank{'s' if len(s.ranks) > 1 else ''} {who} arriving like the typical rank: "
            f"{_ms(s.mean_step_time_us)} -> {_ms(s.est_step_time_us)} per step "
            f"({_pct(s.lost_fraction)} of step time lost; {_n(s.steps_analysed, 'step')}, {_n(s.instances, 'collective')}, "
            f"confidence {s.confidence})"
        )
        if s.next_ranks:
            nxt = s.next_ranks[0]
            line += f"; next to hold the job back: rank {nxt['rank']} ({_ms(nxt['imposed_per_step_us'])} per step)"
        return line + "."

    def summary(self) -> SummaryLines:
        """The verdict (two lines), the job line, MFU and the top three recommendations: a list
        of lines that ``print`` shows as text."""
        j = self.job
        lines = self.headline_lines()
        ws = j.world_size
        found = len(j.traces)
        miss = f", {len(j.missing_ranks)} missing" if j.missing_ranks else ""
        dup = f", duplicates for ranks {sorted(j.duplicates)}" if j.duplicates else ""
        nsteps = int(self.steps["step"].n_unique()) if self.steps.height else 0
        devices = "/".join(sorted({t.meta.device_type for t in j.traces.values()}))
        resid = self.clock.residual_us()
        methods = set(self.clock.table["method"].to_list()) if self.clock.table.height else set()
        if len(j.traces) < 2:
            clock = "one rank: no clock alignment needed"
        elif resid is None or self.clock.match_method == "none":
            clock = "clocks not aligned (no collective matched across ranks)"
        elif methods <= {"reference", "same_host"}:
            clock = f"one host, one clock (collective ends agree within {resid:.0f} us)"
        else:
            clock = f"clocks aligned on collective {self.clock.match_method.replace('_', ' ')}s (residual {resid:.0f} us)"
        if not j.traces:
            lines.append("Job: no traces.")
        else:
            lines.append(
                f"Job: {found}/{ws if ws is not None else '?'} ranks{miss}{dup}; {_n(nsteps, 'step')} "
                f"({self.step_source or 'none'}); {devices}; {clock}."
            )
        m = self.mfu
        if m.mfu is not None:
            lines.append(f"MFU: {_pct(m.mfu)} ({m.peak_source}; FLOPs from {m.flops_source}).")
        else:
            lines.append(f"MFU: n/a ({m.reason}).")
        for r in self.recommendations[:3]:
            first = _SENTENCE_END.split(r["action"], maxsplit=1)[0].rstrip(".")
            lines.append(f"Recommendation ({r['severity']}): {r['title']} -> {first}.")
        return SummaryLines(lines)

    def render_text(self, max_rows: int = 20) -> str:
        """Short diagnosis first, then the tables."""
        out = ["Diagnosis", "========="]
        out += self.summary()
        with pl.Config(
            tbl_rows=max_rows,
            tbl_cols=20,
            tbl_width_chars=160,
            fmt_str_lengths=40,
            tbl_hide_dataframe_shape=True,
        ):
            if self.stragglers.per_rank.height:
                out += [
                    "",
                    (
                        "Per rank (imposed = how much earlier the collectives would end had the rank arrived like the "
                        "next-latest one; whatif_saving = per step, had only this rank arrived like the typical rank)"
                    ),
                ]
                out.append(
                    str(
                        self.stragglers.per_rank.select(
                            "rank",
                            "host",
                            "role",
                            "last_count",
                            "instances",
                            "p_value",
                            "imposed_wait(us)",
                            "imposed_share",
                            "whatif_saving(us)",
                            "late_steps",
                            "mean_lateness(us)",
                            "compute_vs_median",
                        )
                    )
                )
            if self.stragglers.per_step.height:
                out += [
                    "",
                    "Per step (what-if: est_step_time = step_time - excess saved had the named ranks arrived like the typical rank)",
                ]
                out.append(str(self.stragglers.per_step))
            if self.clock.table.height:
                out += [
                    "",
                    f"Clock alignment (reference rank {self.clock.reference}; add offset_us to a rank's times)",
                ]
                out.append(str(self.clock.table))
            if self.recommendations:
                out += ["", "Recommendations"]
                for r in self.recommendations:
                    out.append(f"- [{r['severity']}] {r['id']}: {r['title']}")
                    out.append(f"    evidence: {r['evidence']}")
                    out.append(f"    action: {r['action']}")
        return "\n".join(out)
