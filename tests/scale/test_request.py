"""One request type, one discovery with pluggable resolvers, and no import cycle in the layers
this issue untangled (``scale`` <-> ``pipeline``, ``scale.mapper`` <-> ``scale.reduce``)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import kinetoscope
from kinetoscope.errors import UsageError
from kinetoscope.scale.request import AnalyzeRequest
from kinetoscope.trace.discover import InputError, PathResolver, discover

PKG = Path(kinetoscope.__file__).parent


def test_only_splits_analyses_from_diagnosis_keys() -> None:
    keys = ("stragglers", "mfu")
    r = AnalyzeRequest.from_only(["kernel_breakdown", "mfu"], keys)
    assert (r.names, r.only_diagnosis, r.analyses, r.diagnosis) == (
        ("kernel_breakdown",),
        ("mfu",),
        True,
        True,
    )
    r = AnalyzeRequest.from_only(["mfu"], keys)
    assert (r.analyses, r.diagnosis) == (False, True)
    r = AnalyzeRequest.from_only(["kernel_breakdown"], keys)
    assert (r.analyses, r.diagnosis) == (True, False)
    assert AnalyzeRequest.from_only([], keys) == AnalyzeRequest()


def test_request_checks_its_backend_and_workers() -> None:
    with pytest.raises(UsageError, match="'spark' is not one of auto, single, local, ray"):
        AnalyzeRequest(backend="spark")
    with pytest.raises(UsageError, match="--workers: 0"):
        AnalyzeRequest(workers=0)
    assert AnalyzeRequest(model_flops=1e12).diagnosis_options() == {"model_flops": 1e12}


class _Ids:
    """A resolver for ids of the form ``id:NAME`` -> files of a folder (a stand-in catalog)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def resolve(self, raw: str) -> list[Path] | None:
        return sorted(self.folder.glob(raw.removeprefix("id:") + "*.json")) if raw.startswith("id:") else None


def test_discovery_tries_resolvers_in_order(tmp_path: Path) -> None:
    for name in ("a-0.json", "a-1.json", "manifest.json", ".hidden.json", "notes.txt"):
        (tmp_path / name).write_text("{}")
    chain = [PathResolver(), _Ids(tmp_path)]
    folder = discover([str(tmp_path)], chain)
    assert [p.name for p in folder] == ["a-0.json", "a-1.json"]  # no manifest, no hidden file
    # an id and a file it also names: each file once, first mention kept
    assert [p.name for p in discover(["id:a-1", str(tmp_path / "a-0.json"), str(tmp_path)], chain)] == [
        "a-1.json",
        "a-0.json",
    ]
    with pytest.raises(InputError, match="nope.json: no such file or folder"):
        discover([str(tmp_path / "nope.json")], chain)
    with pytest.raises(InputError, match="kst-1: no such file or folder"):
        discover(["kst-1"])  # paths only: nothing claims a bare id
    (tmp_path / "empty").mkdir()
    with pytest.raises(InputError, match="no trace files"):
        discover([str(tmp_path / "empty")])


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
    return out


def test_no_import_cycle_between_scale_and_pipeline() -> None:
    """Every import, at module level or inside a function, counts: scale must not import the
    pipeline (the layer above it), and the map must not import the reduce nor the reverse."""
    for f in (PKG / "scale").glob("*.py"):
        assert "kinetoscope.orchestration" not in _imports(f), f"{f.name} imports kinetoscope.orchestration"
    assert "kinetoscope.scale.reduce" not in _imports(PKG / "scale" / "mapper.py")
    assert "kinetoscope.scale.mapper" not in _imports(PKG / "scale" / "reducers.py")
    assert not any(m.startswith("kinetoscope.scale") for m in _imports(PKG / "trace" / "discover.py"))


def test_trace_suffixes_are_defined_once() -> None:
    defined = [f for f in PKG.rglob("*.py") if "TRACE_SUFFIXES =" in f.read_text()]
    assert defined == [PKG / "protocol" / "defaults.py"]
