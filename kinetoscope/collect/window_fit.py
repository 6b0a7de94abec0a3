"""An aligned iteration roundup that fits the wait (``kscope trace --iterations N --wait``).

Ranks pick a request up at their own polls, up to one poll interval apart (the *pickup spread*),
and Kineto starts each at the next multiple of ``PROFILE_START_ITERATION_ROUNDUP`` (R) after its
pickup. Two figures pull R in opposite directions:

* **alignment**: the ranks start together unless a multiple of R passes during the pickup
  spread; the odds of that are ``spread_steps / R`` (spread_steps: steps the job does in a
  pickup spread). The safe R is ``ALIGN_SAFETY`` times the spread (odds 1 in 10).
* **the wait**: the first multiple of R can be up to R steps away: the trace starts up to one
  poll interval plus ``R / rate`` seconds after the trigger, and ends ``N / rate`` seconds later.

With Kineto's 5 s poll and the assumed 10 steps/s the safe R is 1,000: up to 100 s before
tracing starts, beyond a 60 s ``--timeout``. ``fit_roundup`` keeps the safe R when the expected
end fits in ``WAIT_SHARE`` of the wait, else the largest R (1, 2, 5 x 10^k) that fits and still
has at least ``MIN_SAFETY`` times the spread; when none fits it says so, with the figures, before
anything is triggered (the trigger then uses that smallest R).
"""

from __future__ import annotations

from dataclasses import dataclass

WAIT_SHARE = 0.5  # the expected end of the trace must fit in this share of --timeout
MIN_SAFETY = 2.0  # the smallest R considered: twice the pickup spread (odds 1 in 2 at worst)
WRITE_S = 2.0  # Kineto's trace export and the file check after the last traced step


def nice_values(lo: float, hi: float) -> list[int]:
    """1, 2, 5, 10, 20, 50, ... between ``lo`` and ``hi`` (inclusive), largest first."""
    out: list[int] = []
    scale = 1
    while scale <= hi:
        for m in (1, 2, 5):
            v = m * scale
            if lo <= v <= hi:
                out.append(v)
        scale *= 10
    return sorted(out, reverse=True)


@dataclass(frozen=True)
class RoundupFit:
    """The chosen roundup and its figures (``note`` says them in one line)."""

    roundup: int
    safe_roundup: int
    expected_end_s: float  # worst case: a poll, R steps to the start, N traced steps, the export
    wait_s: float | None
    misalign_odds: float  # spread_steps / R, at the assumed rate
    fits: bool

    def note(self, rate: float, interval: float, iterations: int) -> str | None:
        """A line for the user when R was lowered to fit the wait or cannot fit it; None otherwise."""
        if self.wait_s is None or self.roundup == self.safe_roundup and self.fits:
            return None
        figures = (
            f"at {rate:.3g} steps/s and a {interval:.0f} s poll interval the start can be up to "
            f"{interval + self.roundup / rate:.0f} s away and {iterations} iterations end by "
            f"~{self.expected_end_s:.0f} s"
        )
        if self.fits:
            return (
                f"--iteration-roundup {self.roundup} (not the safest {self.safe_roundup}) so the trace fits "
                f"--timeout {self.wait_s:g}: {figures}; ranks may start one roundup apart (odds "
                f"{100 * self.misalign_odds:.0f}%): --when-stepping measures the job's rate for a tighter choice"
            )
        need = self.expected_end_s / WAIT_SHARE
        return (
            f"aligned windows cannot fit --timeout {self.wait_s:g}: {figures} even with --iteration-roundup "
            f"{self.roundup}; give --timeout {need:.0f} or more, --when-stepping (measures the job's rate), "
            "or --no-align"
        )


def expected_end_s(roundup: int, rate: float, interval: float, iterations: int) -> float:
    """Worst-case seconds from the trigger to the trace file: a poll, up to R steps, N steps, the export."""
    return interval + (roundup + iterations) / rate + WRITE_S


def fit_roundup(
    safe_roundup: int, rate: float, interval: float, slack_s: float, iterations: int, wait_s: float | None
) -> RoundupFit:
    """The roundup for ``iterations`` traced steps at ``rate`` steps/s by ranks polling every
    ``interval`` s (``slack_s``: pickup spread beyond it), within ``wait_s`` (None: no wait)."""
    spread = rate * (interval + slack_s)

    def fit(r: int, ok: bool) -> RoundupFit:
        return RoundupFit(
            roundup=r,
            safe_roundup=safe_roundup,
            expected_end_s=expected_end_s(r, rate, interval, iterations),
            wait_s=wait_s,
            misalign_odds=min(1.0, spread / r),
            fits=ok,
        )

    if wait_s is None:
        return fit(safe_roundup, True)
    budget = WAIT_SHARE * wait_s
    if expected_end_s(safe_roundup, rate, interval, iterations) <= budget:
        return fit(safe_roundup, True)
    floor = max(1.0, MIN_SAFETY * spread)
    candidates = nice_values(floor, safe_roundup)
    for r in candidates:
        if expected_end_s(r, rate, interval, iterations) <= budget:
            return fit(r, True)
    return fit(candidates[-1] if candidates else safe_roundup, False)
