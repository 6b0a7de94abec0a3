"""The human tables of the seed keys (pipeline, uneven_inputs, recompilation) in kscope analyze."""

from __future__ import annotations

from rich.console import Console

from kinetoscope.cli.diagnosis_text import render_rich

DOC = {
    "recommendations": [
        {"id": "pipeline-bubble", "severity": "medium", "evidence": {}, "action": "more micro-batches"}
    ],
    "pipeline": {
        "schedule": "GPipe",
        "num_stages": 2,
        "microbatches": 4,
        "bubble_fraction": 0.31,
        "expected_bubble_fraction": 0.2,
        "step_time_ms": 100.0,
        "stages": [
            {
                "stage": 0,
                "ranks": [0],
                "compute_ms": 60.0,
                "bubble_fraction": 0.4,
                "fwd_ms_per_microbatch": 5.0,
                "bwd_ms_per_microbatch": 10.0,
            }
        ],
        "imbalance": {"slowest_stage": 1, "excess_fraction": 0.3, "est_step_time_balanced_ms": 90.0},
    },
    "uneven_inputs": {
        "mode": "join",
        "short_ranks": [1],
        "steps_per_rank": {"0": 6, "1": 3},
        "waiting_ranks": [],
    },
    "recompilation": {
        "compiles": 2,
        "recompiles": 1,
        "recompile_time_ms": 12.5,
        "events": [{"rank": 0, "compile_id": "0/1", "recompile": True, "step": 3, "duration_ms": 12.5}],
    },
}


def test_seed_keys_rendered():
    c = Console(width=200, record=True)
    render_rich(c, DOC)
    out = c.export_text()
    assert "pipeline — GPipe, 2 stages, 4 micro-batches" in out and "slowest stage 1" in out
    assert "uneven inputs — join: short rank(s) 1" in out
    assert "compilations — 2 in the window, 1 recompiles" in out and "0/1" in out


def test_null_seed_keys_print_nothing():
    c = Console(width=200, record=True)
    render_rich(
        c,
        {
            "recommendations": [{"id": "x", "severity": "low", "evidence": {}, "action": "a"}],
            "pipeline": None,
            "uneven_inputs": None,
            "recompilation": None,
        },
    )
    out = c.export_text()
    assert "pipeline —" not in out and "uneven inputs" not in out and "compilations" not in out
