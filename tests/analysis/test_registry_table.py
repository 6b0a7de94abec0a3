"""The lazy analysis registry (issue 14): every analysis is listed from the static table of
``kinetoscope.analysis.builtins`` without importing its module, the table agrees with what the
modules register (so the two cannot drift), and running an analysis imports only its module."""

from __future__ import annotations

import importlib
import inspect
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

from kinetoscope.analysis import registry
from kinetoscope.analysis.builtins import BUILTIN_ANALYSES

REPO = Path(__file__).resolve().parents[2]
SMALL = REPO / "tests" / "data" / "traces" / "hta" / "trace_file_list" / "inference_rank_1.json.gz"
ANALYSIS_MODULES = {target.partition(":")[0] for target, _ in BUILTIN_ANALYSES}


def _registered_by_modules() -> dict[str, registry.AnalysisSpec]:
    """The specs the modules of ``_BUILTIN_MODULES`` register themselves (real functions)."""
    for mod in registry._BUILTIN_MODULES:
        importlib.import_module(mod)
    return {
        s.name: s
        for s in registry.all_specs()
        if not s.is_lazy and s.func.__module__ in registry._BUILTIN_MODULES
    }


def _entry(spec: registry.AnalysisSpec) -> str:
    """The table entry for ``spec``, to paste into kinetoscope/analysis/builtins.py."""
    meta = registry.metadata(spec)
    target = meta.pop("target")
    return f"({target!r}, {meta!r}),"


def test_the_table_lists_exactly_what_the_modules_register() -> None:
    real = _registered_by_modules()
    table = {s.name: s for s in registry.builtin_specs()}
    missing = [_entry(real[n]) for n in sorted(set(real) - set(table))]
    assert not missing, "add to kinetoscope/analysis/builtins.py:\n" + "\n".join(missing)
    assert sorted(set(table) - set(real)) == [], "listed in the table but registered by no module"
    for name, spec in table.items():
        assert registry.metadata(spec) == registry.metadata(real[name]), (
            f"{name}: the table differs from its module; the entry should be:\n{_entry(real[name])}"
        )


def test_every_module_of_the_table_is_a_builtin_module() -> None:
    """A table entry whose module is missing from ``_BUILTIN_MODULES`` would never be checked."""
    assert ANALYSIS_MODULES <= set(registry._BUILTIN_MODULES)


@pytest.mark.parametrize(("target", "meta"), BUILTIN_ANALYSES, ids=[m["name"] for _, m in BUILTIN_ANALYSES])
def test_every_target_imports_and_takes_its_options(target: str, meta: dict[str, object]) -> None:
    """The function the table names exists, is the one its module registers, and accepts every
    declared option as a keyword with the declared default (``spec.call`` passes them all)."""
    func = registry.LazyFunc(target).resolve()
    assert registry.get(meta["name"]).func is func  # type: ignore[arg-type]
    params = inspect.signature(func).parameters
    for key, default in dict(meta.get("options", {})).items():  # type: ignore[call-overload]
        assert key in params, f"{target}: option {key!r} is not a parameter"
        assert params[key].default == default, f"{target}: option {key!r} defaults differ"


def test_a_module_registration_that_differs_from_the_table_is_refused() -> None:
    """The registry checks a module's registration against its lazy entry (not only this test)."""
    from kinetoscope.analysis.temporal import temporal_breakdown

    lazy = registry.AnalysisSpec(
        name="_lazy_probe",
        func=registry.LazyFunc("kinetoscope.analysis.temporal:temporal_breakdown"),
        description="as in the table",
        combine="concat",
    )
    registry._REGISTRY[lazy.name] = lazy
    try:
        with pytest.raises(registry.RegistryMismatch, match="description"):
            registry.register(
                registry.AnalysisSpec(
                    name=lazy.name, func=temporal_breakdown, description="changed", combine="concat"
                )
            )
        assert registry.get(lazy.name).is_lazy
        same = registry.AnalysisSpec(
            name=lazy.name, func=temporal_breakdown, description="as in the table", combine="concat"
        )
        registry.register(same)
        assert registry.get(lazy.name) is same and not same.is_lazy
    finally:
        registry._REGISTRY.pop(lazy.name, None)


def test_lazy_func_pickles_by_name_and_rejects_a_bad_target() -> None:
    lazy = registry.LazyFunc("kinetoscope.analysis.idle_time:idle_time_breakdown")
    back = pickle.loads(pickle.dumps(lazy))
    assert back.target == lazy.target and back.__module__ == "kinetoscope.analysis.idle_time"
    with pytest.raises(ValueError, match="module:function"):
        registry.LazyFunc("kinetoscope.analysis.idle_time")


def _fresh(code: str) -> str:
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip().splitlines()[-1]


def test_listing_imports_no_analysis_module_nor_polars() -> None:
    code = (
        "import sys\n"
        "from kinetoscope.analysis import registry\n"
        "specs = registry.all_specs(); registry.names(); registry.get('critical_path')\n"
        "assert len(specs) >= 27 and all(s.is_lazy for s in specs), specs\n"
        f"mods = {sorted(ANALYSIS_MODULES)!r} + ['polars', 'numpy', 'kinetoscope.analysis.runner']\n"
        "print('LOADED:' + ','.join(m for m in mods if m in sys.modules))\n"
    )
    assert _fresh(code) == "LOADED:"


def test_running_an_analysis_imports_its_module_only() -> None:
    code = (
        "import sys\n"
        "from kinetoscope.analysis import registry, run_analyses\n"
        "from kinetoscope.trace import load_trace\n"
        f"res = run_analyses([load_trace({str(SMALL)!r}, cache=False)], ['temporal_breakdown'], raise_errors=True)\n"
        "assert res['temporal_breakdown'].height == 1 and not registry.get('temporal_breakdown').is_lazy\n"
        "assert registry.get('critical_path').is_lazy\n"
        f"mods = {sorted(ANALYSIS_MODULES - {'kinetoscope.analysis.temporal', 'kinetoscope.analysis.steps'})!r}\n"
        "print('LOADED:' + ','.join(m for m in mods if m in sys.modules))\n"
    )
    assert _fresh(code) == "LOADED:"
