"""Matching a trace's optimizer steps to the job's own step log (``daemon_runs``), the ground
truth of the real-job tests. With ``--step-sleep-ms`` a step ends well after its optimizer step,
so the log's step end is the wrong time to match: on a loaded box (a step's compute over the
tolerance) nothing matched, and on a quiet one the block one step off matched."""

from __future__ import annotations

import pytest

from tests.diagnosis.daemon_runs import CollectFailed, _logged_optimizer_end, _match_logged_steps

SLEEP_S, COMPUTE_S = 0.060, 0.025  # a loaded box's tiny step: 25 ms of compute, then the sleep


def _log(steps: int) -> list[dict[str, float]]:
    t, out = 100.0, []
    for s in range(steps):
        out.append(
            {
                "step": s,
                "t0": t,
                "dur_ms": (COMPUTE_S + SLEEP_S) * 1000,
                "straggle_ms": 0.0,
                "opt_end": t + COMPUTE_S,
            }
        )
        t += COMPUTE_S + SLEEP_S
    return out


def test_traced_steps_match_the_logged_optimizer_ends() -> None:
    log = _log(40)
    traced = [line["opt_end"] + 0.0004 for line in log[12:17]]  # the trace's clock, µs off
    ends = sorted((_logged_optimizer_end(line), int(line["step"])) for line in log)
    assert _match_logged_steps(0, traced, ends) == [12, 13, 14, 15, 16]


def test_a_log_without_optimizer_ends_falls_back_to_the_step_end() -> None:
    log = [{k: v for k, v in line.items() if k != "opt_end"} for line in _log(40)]
    traced = [line["t0"] + COMPUTE_S for line in log[12:17]]
    ends = sorted((_logged_optimizer_end(line), int(line["step"])) for line in log)
    # the step ends are a sleep later than the optimizer's: no block within 20 ms
    with pytest.raises(CollectFailed, match="match no run"):
        _match_logged_steps(0, traced, ends)
