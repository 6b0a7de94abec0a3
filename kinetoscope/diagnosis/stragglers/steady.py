"""Steady lateness: a rank that arrives after the others in most steps by a consistent margin.

A small steady delay (a slower input shard, a rank a few percent slower at its compute) is often
not the *last* arrival on a noisy host: the others' jitter is as large as the delay, so the
rank is last in only some steps and the frequency route calls it arrival jitter. What tells it
from a loaded host's noise is consistency: its *per-step skew* (the mean, over the step's
collectives, of its arrival minus the other ranks' mean arrival) is positive step after step,
while a host that deschedules a rank now and then gives a few large skews and many small ones
of either sign. A one-sample t-test of the per-step skews measures that: its statistic is the
mean skew over its standard error, so a few long delays raise the spread with the mean
(``docs/diagnosis.md`` §5, "Steady lateness")."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kinetoscope.diagnosis.attribution import Matrix


@dataclass(frozen=True)
class SteadySkew:
    """Rank ``rank``'s per-step skews (``step_skews``): positive (behind the others) in
    ``behind`` of ``steps`` steps, their median ``median_share`` of a mean step, and ``p`` the
    one-sided t-test p-value that their mean is zero (the rank no later than its peers);
    ``late``: the verdict's steady-lateness test passed (``stragglers.naming.steadily_late``);
    ``skews``: the per-step skews themselves (ns), which the spike test of a steadily late rank
    reads (``stragglers.naming.spike_share``)."""

    rank: int
    behind: int
    steps: int
    median_share: float
    p: float
    late: bool = False
    skews: np.ndarray = field(default_factory=lambda: np.zeros(0), compare=False, repr=False)

    def to_dict(self) -> dict[str, Any]:
        """The JSON form (``stragglers.steady``, docs/diagnosis.md §8)."""
        return {
            "behind_steps": self.behind,
            "steps": self.steps,
            "median_skew_share": self.median_share,
            "p_value": self.p,
            "steadily_late": self.late,
        }


def step_skews(mx: Matrix, rank: int, fixed: set[int]) -> np.ndarray:
    """Per step (ns): the mean over the step's instances of ``rank``'s arrival minus the mean
    arrival of the other ranks not in ``fixed`` (the other named stragglers are left out: they
    must not move the reference). Against the others' *mean*, a rank no later than its peers
    has an expected skew of zero whatever the shape of the host's noise; against their median,
    or with a fixed rank arriving at the typical (median) arrival, a right-skewed noise (a few
    long descheduling delays) makes every rank's expected skew positive. No skews (an empty
    array) when fewer than half of the other ranks are left as peers: after several ranks are
    named, the few left can be the host's earliest ones (``docs/diagnosis.md`` §5)."""
    j = mx.ranks.index(rank)
    others = [k for k, r in enumerate(mx.ranks) if r != rank and r not in fixed]
    if not others or 2 * len(others) < len(mx.ranks) - 1 or mx.A.shape[0] == 0:
        return np.zeros(0)
    A = mx.A.astype(np.float64)
    skew = A[:, j] - A[:, others].mean(axis=1)
    n_steps = len(mx.steps)
    count = np.bincount(mx.step_idx, minlength=n_steps)
    total = np.bincount(mx.step_idx, weights=skew, minlength=n_steps)
    return total[count > 0] / count[count > 0]


def steady_skew(mx: Matrix, rank: int, fixed: set[int], mean_step_ns: float) -> SteadySkew:
    """``rank``'s steady-lateness evidence (module docstring)."""
    x = step_skews(mx, rank, fixed)
    share = float(np.median(x)) / mean_step_ns if x.size and mean_step_ns > 0 else 0.0
    return SteadySkew(rank, int((x > 0).sum()), int(x.size), share, mean_t_sf(x), skews=x)


def mean_t_sf(x: np.ndarray) -> float:
    """One-sided one-sample t-test that the mean of ``x`` is above zero: ``P(T >= t)`` for
    Student's t with ``n - 1`` degrees of freedom. With a right-skewed noise (a few long
    delays) a large mean comes with a large spread, so the upper tail is conservative: the
    bursts of a loaded host do not pass for a steady delay."""
    n = int(x.size)
    if n < 2:
        return 1.0
    sd = float(np.std(x, ddof=1))
    mean = float(np.mean(x))
    if sd <= 0:
        return 0.0 if mean > 0 else 1.0
    return student_t_sf(mean / (sd / math.sqrt(n)), n - 1)


def student_t_sf(t: float, df: int) -> float:
    """``P(T >= t)`` for Student's t with ``df`` degrees of freedom, from the regularized
    incomplete beta function: ``P(|T| >= |t|) = I_{df / (df + t^2)}(df / 2, 1 / 2)``."""
    tail = 0.5 * _betainc(df / 2.0, 0.5, df / (df + t * t))
    return tail if t >= 0 else 1.0 - tail


def _betainc(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta function ``I_x(a, b)`` by its continued fraction
    (DLMF 8.17.22, evaluated with the modified Lentz method), using the symmetry
    ``I_x(a, b) = 1 - I_{1-x}(b, a)`` where the fraction converges slowly."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    if x > (a + 1.0) / (a + b + 2.0):
        return 1.0 - _betainc(b, a, 1.0 - x)
    log_front = a * math.log(x) + b * math.log1p(-x) - (math.lgamma(a) + math.lgamma(b) - math.lgamma(a + b))
    tiny = 1e-300
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    frac = d
    for m in range(1, 300):
        for num in (
            m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
            -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1)),
        ):
            d = 1.0 + num * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + num / c
            c = c if abs(c) > tiny else tiny
            frac *= c * d
        if abs(c * d - 1.0) < 1e-12:
            break
    return math.exp(log_front) * frac / a
