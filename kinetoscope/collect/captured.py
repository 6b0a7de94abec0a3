"""What a finished trace request captured: iterations per rank against those asked, windows,
empty files, fall-backs, and whether the set can carry a cross-rank verdict.

Why: a trace request can "succeed" (every file complete) and still be useless: files taken while
the job was starting, windows that do not overlap, a rank that traced 0 events, a rank whose
iteration trace fell back to a 500 ms duration trace. ``kscope trace`` reads the files it
waited for with the diagnosis' own evidence, so it says so at once, in the table, in ``--json``
(``captured``) and with exit status 3 (docs/collect.md).

This module holds the judgement's structs and the exit rule; the reading itself needs the
analysis engine, which collection does not import (the ``collect-engine`` contract): it is a
:data:`CapturedCheck` that the caller gives the workflow (``Delivery.captured``), in ``kscope
trace`` ``kinetoscope.readback.check_captured``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec

from kinetoscope.collect.trigger import TraceResult
from kinetoscope.protocol.structinfo import prime_structs

UNUSABLE_EXIT = 3  # ``kscope trace``: the files are there, but cannot carry a cross-rank verdict


class CapturedFile(msgspec.Struct, kw_only=True):
    """One complete file as read back."""

    rank: int | None
    pid: int
    path: str
    events: int
    iterations: int  # steps found in the file (analysis.steps.detect_steps)
    iterations_asked: int | None
    window_ms: float | None
    empty: bool
    fell_back_to_duration: bool
    timestamp_anomalies: int


class Captured(msgspec.Struct, kw_only=True):
    """The ``captured`` key of ``kscope trace --json``."""

    checked: bool
    why_not: str | None = None  # why the files were not read back
    usable: bool = True
    reason: str | None = None  # why the set cannot carry a cross-rank verdict
    command: str | None = None  # what to run instead
    warming_up: str | None = None
    steps_in_common: int | None = None
    windows_overlap: bool | None = None
    windows_aligned: bool | None = None
    files: list[CapturedFile] = []
    evidence: list[str] = []  # the evidence lines, as ``kscope analyze`` prints them

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = msgspec.to_builtins(self)
        return out


# Reads back the complete local files of a waited result and judges the set (module docstring).
CapturedCheck = Callable[[TraceResult], Captured]


def unusable(captured: dict[str, Any] | None) -> bool:
    """Whether ``kscope trace`` exits with ``UNUSABLE_EXIT`` (``captured``: ``Captured.to_json``)."""
    return bool(captured and captured.get("checked") and not captured.get("usable"))


prime_structs(globals())
