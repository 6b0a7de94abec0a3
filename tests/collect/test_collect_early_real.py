"""A real 4-rank CPU job traced 5 s after launch (issue 28): never a wrong headline.

The field failure: `kscope trace --iterations 10 --wait` right after a 4-rank job started gave
files that were all "complete" and an `UNEVEN INPUTS` headline, while rank 1 was a persistent
straggler. Each run here (``benchmarks/bench_early_trace.one_run``: a private daemon, a real
torchrun job with rank 1 sleeping 30 ms every step, the real CLI) must end with the right
verdict or `NOT ASSESSED` with its reason; `kscope trace` exits 3 exactly when its read-back
says the set is unusable. The 10-run figures are in docs/validation-evidence.md.
"""

from __future__ import annotations

import pytest

pytestmark = [pytest.mark.torch, pytest.mark.slow]


@pytest.mark.parametrize("seed", [201, 202, 203])
def test_early_trace_is_right_or_not_assessed(tmp_path, seed):
    pytest.importorskip("torch")
    from benchmarks.bench_early_trace import one_run

    r = one_run(tmp_path, delay_s=5.0, timeout_s=90.0, straggler_ms=30.0, seed=seed)
    if r["outcome"] == "no-verdict" and "STRAGGLERS NOT ASSESSED: " in str(r["headline"]):
        # the files were usable (exit 0) but the straggler analysis had no arrivals to compare, and
        # says so with its reason: a NOT ASSESSED of the analysis, not of the read-back. NO STRAGGLER
        # (a miss) still fails below.
        assert r["exit"] == 0 and r["captured"]["usable"] is True, r
        return
    assert r["outcome"] in ("right", "not-assessed"), f"{r['outcome']}: {r['headline']!r} ({r})"
    if r["outcome"] == "not-assessed":
        assert r["headline"].startswith("NOT ASSESSED: ") and len(r["headline"]) > len("NOT ASSESSED: ") + 10
        assert r["exit"] == 3 and r["captured"]["usable"] is False and r["captured"]["reason"], r
    else:
        assert r["exit"] == 0 and r["captured"]["usable"] is True, r
