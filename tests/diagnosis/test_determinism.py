"""The diagnosis of the same traces is the same document every time, to the last bit: the
scale-out equality tests compare documents exactly, and a user comparing two runs must not see
noise. (A float sum over Polars groups in hash order once differed from run to run.)"""

from __future__ import annotations

import json
import math

from diag_synth import make_job

from kinetoscope.diagnosis import diagnose


def test_the_same_traces_give_the_same_document_every_time():
    steps = 60
    late = [
        [0.0] * steps,
        [3.0 + math.sin(i) * 1.37 for i in range(steps)],
        [0.0] * steps,
        [1.0 + math.cos(i) * 0.31 for i in range(steps)],
        [0.5] * steps,
        [0.0] * steps,
    ]
    traces = make_job(
        world=6, steps=steps, late_ms=late, period_ms=[100.0 + math.sqrt(i + 2) * 3.3 for i in range(steps)]
    )
    docs = {json.dumps(diagnose(traces).to_dict(), sort_keys=True, default=str) for _ in range(15)}
    assert len(docs) == 1
