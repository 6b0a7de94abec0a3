"""Rank sets for the scale tests: real vendored traces, copied into a temp dir as ranks."""

from __future__ import annotations

import os
from pathlib import Path

import orjson
import pytest
from isal import igzip

from tests.conftest import HTA_TRACES as HTA

PAIR = [HTA / "timeline_analysis" / "sampled_rank-0.json.gz", HTA / "trace_filter" / "sampled_rank-1.json.gz"]
CONTROL = HTA / "trace_diff" / "control" / "control.json.gz"


def write_ranks(out: Path, sources: list[Path], n: int) -> list[Path]:
    """``n`` rank files cycling over ``sources`` with distributedInfo.rank = 0..n-1 (as
    benchmarks/bench_analyze.py's make_ranks)."""
    out.mkdir(parents=True, exist_ok=True)
    docs = [orjson.loads(igzip.decompress(s.read_bytes())) for s in sources]
    paths = []
    for r in range(n):
        doc = docs[r % len(docs)]
        doc["distributedInfo"] = {**doc.get("distributedInfo", {}), "rank": r, "world_size": n}
        p = out / f"rank-{r}.json.gz"
        p.write_bytes(igzip.compress(orjson.dumps(doc), compresslevel=1))
        paths.append(p)
    return paths


@pytest.fixture(scope="session")
def mixed8(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """8 ranks alternating the two sampled ranks of the 128-GPU job: the top kernels differ
    between ranks, so the cross-rank reduce (kernel_distribution) matters."""
    return write_ranks(tmp_path_factory.mktemp("mixed8"), PAIR, 8)


@pytest.fixture(scope="session")
def control8(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """8 copies of trace_diff/control as ranks 0..7: benchmarks/bench_analyze.py --ranks 8."""
    return write_ranks(tmp_path_factory.mktemp("control8"), [CONTROL], 8)


@pytest.fixture(scope="module")
def ray_session():
    """A small local Ray for the module (2 CPUs, no dashboard), always shut down."""
    ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'kinetoscope[scale]')")
    from kinetoscope.scale.executors import local_ray_options

    saved = dict(os.environ)  # ray.init sets RAY_AUTH_MODE and more: later tests must not inherit them
    try:
        ray.init(**local_ray_options(2))
    except Exception as exc:  # noqa: BLE001 - as with PostgreSQL: no server here, say why and skip
        ray.shutdown()
        os.environ.clear()
        os.environ.update(saved)
        pytest.skip(f"a local Ray could not start on this machine ({type(exc).__name__}: {exc})")
    try:
        yield ray
    finally:
        ray.shutdown()
        os.environ.clear()
        os.environ.update(saved)


@pytest.fixture()
def undeclared_analysis(monkeypatch: pytest.MonkeyPatch) -> str:
    """An analysis registered without declared reads (a plug-in's, say): ``temporal_breakdown``
    under the name ``undeclared`` with ``reads=None``; its name."""
    import dataclasses

    from kinetoscope.analysis import registry

    spec = registry.get("temporal_breakdown")
    monkeypatch.setitem(
        registry._REGISTRY,
        "undeclared",
        dataclasses.replace(spec, name="undeclared", reads=None, default=False),
    )
    return "undeclared"
