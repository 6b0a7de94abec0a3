"""Diagnosis in the map: the job diagnosis over rank digests (``diagnosis.extract.DigestTrace``:
metadata + per-rank figures, no events) equals the diagnosis over the full traces, exactly, on
real jobs (a GPU DLRM job of 8 V100 ranks, the 128-GPU sampled pair, a CPU gloo rank, an AMD
trace, MTIA, a compiled model); and a digest pickles small (what a worker sends the driver)."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest

from kinetoscope.diagnosis import diagnose
from kinetoscope.diagnosis.extract import DigestTrace, digest_trace
from kinetoscope.trace import load_trace
from tests.conftest import HTA_TRACES as HTA
from tests.scale.conftest import PAIR

DLRM8 = Path("/work/shared/traces/param_dlrm8")
JOBS = {
    "pair_128gpu": PAIR,
    "cpu_gloo": sorted((HTA / "cpu_only").glob("*.json.gz")),
    "amd": sorted((HTA / "amd_trace").glob("*.json.gz")),
    "mtia": sorted((HTA / "mtia_trace_single_rank").glob("*.json.gz")),
    "triton": sorted((HTA / "triton_example").glob("*.json.gz")),
    "gpu_user_annotation": sorted((HTA / "with_gpu_user_annotation").glob("*.json.gz")),
}


def _both(files: list[Path], **opts: float) -> tuple[dict, dict]:
    full = [load_trace(f, cache=False) for f in files]
    digests = [digest_trace(load_trace(f, cache=False)) for f in files]
    assert all(isinstance(d, DigestTrace) and d.events.is_empty() for d in digests)
    return diagnose(full, **opts).to_dict(), diagnose(digests, **opts).to_dict()


@pytest.mark.parametrize("name", sorted(JOBS))
def test_digest_diagnosis_equals_full(name: str) -> None:
    files = JOBS[name]
    assert files, f"no trace files for {name}"
    full, dig = _both(files)
    assert list(dig) == list(full)
    for key in full:
        assert dig[key] == full[key], f"{name}: diagnosis key {key!r} differs"


@pytest.mark.skipif(not DLRM8.is_dir(), reason="the shared DLRM traces are not on this machine")
def test_digest_diagnosis_equals_full_dlrm8_with_mfu() -> None:
    files = sorted(DLRM8.glob("*.json"))
    full, dig = _both(files, peak_flops=125e12)
    assert full["stragglers"] and full["mfu"]
    assert dig == full


def test_a_digest_is_small() -> None:
    """O(steps + collectives): a sampled rank of the 128-GPU job pickles to a few tens of KB, far less than its events."""
    t = load_trace(PAIR[0], cache=False)
    size = len(pickle.dumps(digest_trace(t)))
    events = t.events.estimated_size()
    assert size < events / 20, (size, events)
