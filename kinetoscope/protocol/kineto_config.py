"""Kineto on-demand config text: built exactly as ``dyno gputrace`` builds it, and inspected.

Why a module of its own: the daemon (``kscopeTrace``) and the trigger (``kscope trace``) must
produce byte-identical configs to what the real ``dyno`` CLI sends (docs/protocol.md §4.2), and the daemon
must look inside configs it did not build (``setKinetOnDemandRequest`` from ``dyno``) to
enforce the trace root. Everything here is a pure function of its arguments.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

from kinetoscope.protocol.trace_options import TraceOptions, decode_options

ACTIVITIES_LOG_FILE = "ACTIVITIES_LOG_FILE"
PROFILE_START_TIME = "PROFILE_START_TIME"
REQUEST_TRACE_ID = "REQUEST_TRACE_ID"

# dyno's `--duration-ms` default, and Kineto's own default duration.
DEFAULT_DURATION_MS = 500


def _flag(value: bool) -> str:
    return "true" if value else "false"


def build_config(options: TraceOptions | None = None, *, log_file: str | None, **fields: Any) -> str:
    """The Kineto config text ``dyno gputrace`` sends (docs/protocol.md §4.2), byte for byte.

    ``options`` says what to record; without it, ``fields`` are the same options as keywords
    (:class:`~kinetoscope.protocol.trace_options.TraceOptions`' names, checked as the RPC checks
    them). ``iterations`` set selects iteration mode (``PROFILE_START_ITERATION=0``, then
    ``PROFILE_START_ITERATION_ROUNDUP`` and ``ACTIVITIES_ITERATIONS``), otherwise duration mode
    (``PROFILE_START_TIME`` and ``ACTIVITIES_DURATION_MSECS``). Option flags follow in dyno's
    order, as ``true``/``false``; no trailing newline. ``log_file=None`` leaves out the
    ``ACTIVITIES_LOG_FILE`` line (used to describe the part shared by every process of a
    request; never send such a config: Kineto would write to its default path).

    Raises ValueError for combinations dyno rejects (``profile_memory`` with iterations panics
    the CLI) or that Kineto cannot parse (numbers out of range: the message names the field).
    """
    if options is None:
        options = decode_options(fields)
    else:
        options.check()
    if log_file is not None:
        _check_value(ACTIVITIES_LOG_FILE, log_file)
    duration_ms = options.duration_ms if options.duration_ms is not None else DEFAULT_DURATION_MS
    parts: list[str] = []
    if log_file is not None:
        parts.append(f"{ACTIVITIES_LOG_FILE}={log_file}\n")
    if options.iterations is not None:
        parts.append(
            "PROFILE_START_ITERATION=0"
            f"\nPROFILE_START_ITERATION_ROUNDUP={options.iteration_roundup or 1}"
            f"\nACTIVITIES_ITERATIONS={options.iterations}"
        )
    else:
        start = options.profile_start_time_ms or 0
        parts.append(f"{PROFILE_START_TIME}={start}\nACTIVITIES_DURATION_MSECS={duration_ms}")
    parts.append(f"\nPROFILE_REPORT_INPUT_SHAPES={_flag(options.record_shapes)}")
    if options.profile_memory:
        parts.append(
            f"\nPROFILE_PROFILE_MEMORY=true\nPROFILE_MEMORY=true\nPROFILE_MEMORY_DURATION_MSECS={duration_ms}"
        )
    parts.append(
        f"\nPROFILE_WITH_STACK={_flag(options.with_stack)}"
        f"\nPROFILE_WITH_FLOPS={_flag(options.with_flops)}"
        f"\nPROFILE_WITH_MODULES={_flag(options.with_modules)}"
    )
    return "".join(parts)


def _check_value(key: str, value: str) -> None:
    # A newline would start a new config line; '#' starts a comment and '=' splits the line
    # into three parts, which makes Kineto stop parsing there (docs/protocol.md §4.4). Kineto trims blanks
    # around the value, so a value with them would not be the file written (found by fuzzing).
    if not value or any(c in value for c in "\n\r#=\0") or any(ord(c) < 32 or c == "\x7f" for c in value):
        raise ValueError(
            f"{key} value {value!r} is empty or contains a newline, '#', '=' or a control character"
        )
    if value != value.strip(" \t"):
        raise ValueError(f"{key} value {value!r} has leading or trailing blanks (Kineto strips them)")


def wrap_with_trace_id(config: str, trace_id: str) -> str:
    """Dynolog's ``addTraceIdToConfigString`` (docs/protocol.md §2.3): what is stored as pending config.

    The daemon appends ``"\\n"`` when it hands the text to the process (§2.2).
    """
    return "\n    " + config + "\n    " + REQUEST_TRACE_ID + "=" + trace_id


def iter_options(config: str) -> Iterator[tuple[str, str, bool]]:
    """(key, value, well_formed) per non-blank line, parsed as Kineto's ``AbstractConfig::parse``.

    Kineto strips a ``#`` comment, splits on ``=`` and trims ``\\t\\n `` around each part; a line
    that does not split into exactly two parts stops Kineto's parser there (``well_formed`` is
    False for it, and the key is the text before the first ``=``).
    """
    for raw in config.split("\n"):
        line = raw.split("#", 1)[0]
        if not line.strip("\t\n "):
            continue
        parts = [p.strip("\t\n ") for p in line.split("=")]
        yield parts[0], "=".join(parts[1:]), len(parts) == 2


def is_duration_config(config: str) -> bool:
    """Whether Kineto runs ``config`` as a time-based (duration) trace: no
    ``PROFILE_START_ITERATION`` and no memory profiling (which Kineto runs on its own loop)."""
    if option_values(config, "PROFILE_START_ITERATION"):
        return False
    return not any(v.lower() == "true" for v in option_values(config, "PROFILE_PROFILE_MEMORY"))


def option_values(config: str, key: str) -> list[str]:
    """Every value given to ``key`` (Kineto keys are case-sensitive), malformed lines included."""
    return [value for k, value, _ok in iter_options(config) if k == key]


_JSON_SUFFIXES = (".pt.trace.json", ".json")


def kineto_output_path(log_file: str, pid: int) -> str:
    """The file Kineto really writes for ``ACTIVITIES_LOG_FILE=log_file`` (docs/protocol.md §4.3).

    The **first** ``.pt.trace.json`` becomes ``_<pid>.pt.trace.json``, else the first ``.json``
    becomes ``_<pid>.json``; a name without ``.json`` is used as is.
    """
    for suffix in _JSON_SUFFIXES:
        i = log_file.find(suffix)
        if i >= 0:
            return log_file[:i] + f"_{pid}" + log_file[i:]
    return log_file


_TRACE_ID_RE = re.compile(r"[A-Za-z0-9-]{1,128}")


def valid_trace_id(trace_id: object) -> bool:
    """``kscope`` trace ids: letters, digits and ``-`` (docs/architecture.md), at most 128."""
    return isinstance(trace_id, str) and _TRACE_ID_RE.fullmatch(trace_id) is not None
