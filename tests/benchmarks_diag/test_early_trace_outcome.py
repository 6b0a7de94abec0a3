"""``bench_early_trace.classify``: a run's outcome read off its first summary line."""

from __future__ import annotations

import pytest

from benchmarks.bench_early_trace import classify

P1 = "PERSISTENT STRAGGLER: rank 1 (host vm): 100.0% of the imposed wait, last at 10/10 collectives."


@pytest.mark.parametrize(
    ("headline", "outcome"),
    [
        (P1, "right"),
        ("[partial] " + P1, "right"),
        ("PERSISTENT STRAGGLERS: rank 1: 60% of the time lost; rank 3: 40% of the time lost.", "wrong"),
        ("INTERMITTENT STRAGGLERS: rank 1: 70% ...; rank 3: 30% ...", "right"),
        ("INTERMITTENT STRAGGLERS: rank 3: 100% ...", "wrong"),
        # rank 1 persistent beside a rank the loaded host stalled: the verdict names both kinds
        ("MIXED STRAGGLERS: rank 1: 80% of the time lost; rank 2: 20% of the time lost.", "right"),
        ("MIXED STRAGGLERS: rank 0: 50% ...; rank 2: 50% ...", "wrong"),
        ("UNEVEN INPUTS (unmatched): ranks 0, 2 wait in an all-reduce rank 1 never joined.", "wrong"),
        ("NOT ASSESSED: the ranks' trace windows do not overlap.", "not-assessed"),
        ("NO STRAGGLER: nothing beyond the noise.", "no-verdict"),
    ],
)
def test_the_outcome_is_read_off_the_headline(headline: str, outcome: str) -> None:
    assert classify(headline) == outcome
