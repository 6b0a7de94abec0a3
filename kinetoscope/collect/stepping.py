"""``kscope trace --when-stepping``: trigger once the job steps steadily, at its measured rate.

Why: a trace taken while the job starts (process groups forming, the first iterations compiling
or warming caches) holds few, uneven steps, and iteration windows that the ranks start at
different times; no verdict can rest on it. Kineto does not report its iteration count to the
daemon (the IPC poll carries the job id, the pids and the config type only: docs/protocol.md
§2), so the job's progress is measured with **probes**: short duration traces (``PROBE_MS``)
of one process per host, read back here with a :data:`StepReader` that the caller passes
(``kinetoscope.readback.probe_steps`` in ``kscope trace``: reading a trace file needs the
analysis engine, which collection does not import). The job steps steadily once a probe holds
at least ``STEADY_STEPS`` complete steps whose durations are within ``STEADY_SPREAD`` of their median;
the probe's step rate then sets the aligned roundup (``TraceOptions.steps_per_s``).

Each probe is one more profiling run of that process: on GPUs, profiling a process again and
again can corrupt kernel timestamps (PyTorch issues #192021, #175790); the evidence block of
the analysis counts such anomalies (``diagnosis.timestamps``).
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from kinetoscope.collect.trigger import TraceOptions, TraceRequest, trigger_trace, wait_for_trace

PROBE_MS = 1500
STEADY_STEPS = 3
STEADY_SPREAD = 0.5  # every one of the last STEADY_STEPS steps within +-50% of their median
PROBE_PAUSE_S = 2.0

# (start, end) in ns of each complete step in one trace file, in the file's order.
StepReader = Callable[[str], list[tuple[int, int]]]


@dataclass
class Probe:
    """One probe's reading: steps found, their rate (steps/s) and whether they are steady."""

    trace_id: str
    steps: int
    rate: float | None
    steady: bool
    problem: str | None = None


def read_probe(path: str, steps_of: StepReader) -> tuple[int, float | None, bool]:
    """(complete steps, steps per second, steady) of one probe file, its steps read by ``steps_of``."""
    spans = steps_of(path)
    if len(spans) < 2:
        return len(spans), None, False
    d = [float(end - start) for start, end in spans]
    span_s = (max(end for _, end in spans) - min(start for start, _ in spans)) / 1e9
    rate = len(spans) / span_s if span_s > 0 else None
    last = sorted(d[-STEADY_STEPS:])
    med = last[len(last) // 2]
    steady = len(d) >= STEADY_STEPS and med > 0 and all(abs(x - med) <= STEADY_SPREAD * med for x in last)
    return len(spans), rate, steady


def probe_once(
    request: TraceRequest, k: int, token: str | None, timeout: float, steps_of: StepReader
) -> Probe:
    """Trace one process per host for ``PROBE_MS`` and read the first file back (``steps_of``)."""
    base = request.trace_id or "kst"
    probe_req = replace(
        request,
        options=TraceOptions(duration_ms=PROBE_MS, process_limit=1),
        trace_id=f"{base[:48]}-probe{k}",
    )
    res = trigger_trace(probe_req, token=token, write_manifest_file=False)
    if not res.files:
        return Probe(
            res.trace_id,
            0,
            None,
            False,
            problem="; ".join(e.message for e in res.errors) or "nothing matched",
        )
    res = wait_for_trace(res, timeout=timeout, token=token, write_manifest_file=False)
    done = [f for f in res.files if f.complete]
    if not done:
        return Probe(
            res.trace_id, 0, None, False, problem="; ".join(e.message for e in res.errors) or "no file"
        )
    try:
        steps, rate, steady = read_probe(done[0].path, steps_of)
    except Exception as exc:  # noqa: BLE001 - a probe that cannot be read is one more probe, not an error
        return Probe(res.trace_id, 0, None, False, problem=f"{done[0].path}: {exc}")
    finally:
        _remove_probe_dirs(res.output_dirs, res.trace_id)
    return Probe(res.trace_id, steps, rate, steady)


def _remove_probe_dirs(dirs: list[str], trace_id: str) -> None:
    """Delete the probe's own local folders (named by its trace id, nothing else)."""
    for d in dirs:
        p = Path(d)
        if p.name == trace_id and p.is_dir():
            shutil.rmtree(p, ignore_errors=True)


def wait_until_stepping(
    request: TraceRequest,
    *,
    token: str | None,
    deadline_s: float,
    steps_of: StepReader,
    say: Callable[[str], None] = lambda _line: None,
) -> Probe | None:
    """Probe until the job steps steadily or ``deadline_s`` seconds pass; the last probe (None
    when not even one could run). ``steps_of`` reads a probe's steps (:data:`StepReader`);
    ``say`` gets one line per probe."""
    end = time.monotonic() + deadline_s
    last: Probe | None = None
    k = 0
    while time.monotonic() < end:
        k += 1
        left = end - time.monotonic()
        last = probe_once(request, k, token, max(5.0, min(left, PROBE_MS / 1000.0 + 20.0)), steps_of)
        rate = f", {last.rate:.3g} steps/s" if last.rate else ""
        state = "steady" if last.steady else "not steady yet"
        say(
            f"probe {k}: {last.steps} step(s) in {PROBE_MS} ms{rate}: {state}"
            + (f" ({last.problem})" if last.problem else "")
        )
        if last.steady:
            return last
        if last.problem and not last.steps and k >= 2:
            return last
        time.sleep(min(PROBE_PAUSE_S, max(0.0, end - time.monotonic())))
    return last
