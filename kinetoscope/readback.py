"""Reading trace files back for collection: what a finished trace request captured
(:func:`check_captured`) and the step spans of a ``--when-stepping`` probe (:func:`probe_steps`).

Why here, above ``collect/``: collection does not depend on the analysis engine (the
``collect-engine`` contract, docs/architecture.md); reading a file back needs it (``trace``,
``analysis.steps``, ``diagnosis``). ``collect/`` takes these two readers as plain callables
(``collect.workflow.Delivery.captured``, ``collect.stepping.wait_until_stepping(steps_of=...)``)
and ``kscope trace`` passes them in.

``check_captured`` reads the files it waited for with the diagnosis' own evidence
(``diagnosis.evidence``), so ``kscope trace`` says at once whether the set can carry a cross-rank
verdict (docs/collect.md; the judgement's structs: ``collect.captured``). Only files on this
machine are read, and at most ``MAX_FILES`` of them (a large request is checked by
``kscope analyze``).
"""

from __future__ import annotations

import os
from typing import Any

from kinetoscope.collect.captured import Captured, CapturedFile
from kinetoscope.collect.trigger import TraceFile, TraceResult

MAX_FILES = 64


def probe_steps(path: str) -> list[tuple[int, int]]:
    """(start, end) in ns of each complete step of one probe file, in the file's order
    (``analysis.steps.detect_steps``): ``collect.stepping.StepReader``."""
    from kinetoscope.analysis.steps import detect_steps
    from kinetoscope.trace import load_trace

    steps = detect_steps(load_trace(path, cache=False))
    return [(int(s), int(e)) for s, e in zip(steps["start"].to_list(), steps["end"].to_list())]


def _local_complete(result: TraceResult) -> list[TraceFile]:
    return [f for f in result.files if f.complete and os.path.isfile(f.path)]


def check_captured(result: TraceResult, max_files: int = MAX_FILES) -> Captured:
    """Read back the complete local files of ``result`` and judge the set (module docstring):
    ``collect.captured.CapturedCheck``."""
    files = _local_complete(result)
    if not files:
        return Captured(checked=False, why_not="no complete file on this machine to read back")
    if len(files) > max_files:
        return Captured(
            checked=False, why_not=f"{len(files)} files (more than {max_files}): run kscope analyze"
        )
    if len(files) < len([f for f in result.files if f.complete]):
        return Captured(
            checked=False, why_not="some files are on other hosts: run kscope analyze on the stored set"
        )
    from kinetoscope.diagnosis import diagnose
    from kinetoscope.diagnosis.evidence import fell_back_to_duration

    d = diagnose([f.path for f in files])
    ev = d.evidence
    if ev is None:  # pragma: no cover - diagnose always sets it
        return Captured(checked=False, why_not="no evidence")
    by_path = {os.path.realpath(r.path): r for r in ev.ranks}
    asked = result.options.iterations
    fell = {r.rank for r in ev.ranks if fell_back_to_duration(r, asked or r.asked_steps)}
    out = Captured(
        checked=True,
        usable=_usable(ev, asked is not None),
        reason=ev.reason,
        command=_command(result) if not ev.assessed and asked is not None else None,
        steps_in_common=ev.steps_in_common if len(ev.ranks) > 1 else None,
        windows_overlap=ev.windows_overlap,
        windows_aligned=ev.windows_aligned,
        evidence=ev.lines(),
    )
    for f in files:
        r = by_path.get(os.path.realpath(f.path))
        if r is None:  # a file of another job (assembly keeps the largest job)
            continue
        window = (
            None
            if r.window_start_ms is None or r.window_end_ms is None
            else r.window_end_ms - r.window_start_ms
        )
        out.files.append(
            CapturedFile(
                rank=f.rank if f.rank is not None else r.rank,
                pid=f.pid,
                path=f.path,
                events=r.events,
                iterations=r.steps,
                iterations_asked=asked,
                window_ms=None if window is None else round(window, 1),
                empty=r.empty,
                fell_back_to_duration=r.rank in fell,
                timestamp_anomalies=r.timestamps.total,
            )
        )
    out.warming_up = _warming_up(ev, asked, fell)
    if out.warming_up and out.command is None and not out.usable:
        out.command = _command(result)
    return out


def _usable(ev: Any, iterations: bool) -> bool:
    """Whether the set can carry a verdict: no empty file; for an iteration trace (a training
    job's steps were asked for), also what the evidence needs for a cross-rank verdict. A
    duration trace without steps (an inference server, a data pipeline) is usable as it is."""
    if any(r.empty for r in ev.ranks):
        return False
    return bool(ev.assessed) or not iterations


def _warming_up(ev: Any, asked: int | None, fell: set[int]) -> str | None:
    """Why the job looks like it is still starting (a start-up step, a request that reached some
    rank before its first optimizer step: the ranks ``fell``, fewer steps than asked)."""
    slow = [r for r in ev.ranks if r.startup_step_ratio is not None]
    short = [r for r in ev.ranks if asked and 0 < r.steps < asked and r.rank not in fell]
    idle = [r for r in ev.ranks if r.steps == 0]
    parts = []
    if idle:
        parts.append(f"{len(idle)} of {len(ev.ranks)} file(s) hold no step: it may not be stepping yet")
    if fell:
        parts.append(
            f"the request reached {len(fell)} rank(s) before their first optimizer step: "
            "traced as duration traces, from when each config arrived"
        )
    if slow:
        r = max(slow, key=lambda r: r.startup_step_ratio or 0.0)
        parts.append(f"rank {r.rank}'s first traced step lasts {r.startup_step_ratio:g}x its later ones")
    if short:
        parts.append(f"{len(short)} rank(s) traced fewer iterations than the {asked} asked")
    if not parts:
        return None
    return "the job looks like it is still warming up (" + "; ".join(parts) + ")"


def _command(result: TraceResult) -> str:
    t = result.target
    if t.job_id_text or t.job_id is not None:
        target = f"--job-id {t.job_id_text or t.job_id}"
    elif t.pids:
        target = "-p " + ",".join(map(str, t.pids))
    else:
        target = "--all"
    n = max(20, result.options.iterations or 0)
    return f"kscope trace {target} --iterations {n} --when-stepping --wait"
