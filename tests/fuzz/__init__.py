"""Fuzzing suite (issue 16): property-based and mutation fuzzing of every input surface.

Budget and reproducibility: each test asks for ``fuzz_settings(n)`` - ``n`` examples scaled by
the environment variable ``KSCOPE_FUZZ_BUDGET`` (default 1; ``make fuzz`` uses 20) - with
Hypothesis ``derandomize=True`` (a fixed seed per test: CI runs the same inputs every time)
unless ``KSCOPE_FUZZ_RANDOM=1`` (``make fuzz``: fresh inputs; a failure prints the blob that
reproduces it). No example database is written. Inputs tried per surface are counted through
the ``fuzz_counts`` fixture (``conftest.py``) and printed at the end of the run.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings


def budget() -> float:
    """The ``KSCOPE_FUZZ_BUDGET`` multiplier (a positive number; bad values mean 1)."""
    try:
        value = float(os.environ.get("KSCOPE_FUZZ_BUDGET", "1"))
    except ValueError:
        return 1.0
    return value if value > 0 else 1.0


def fuzz_settings(n: int) -> settings:
    """Hypothesis settings for ``n`` examples at budget 1 (see the module docstring)."""
    return settings(
        max_examples=max(1, int(n * budget())),
        derandomize=os.environ.get("KSCOPE_FUZZ_RANDOM") != "1",
        database=None,
        deadline=None,
        print_blob=True,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
    )
