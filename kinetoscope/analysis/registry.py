"""Name -> analysis spec: the one list the CLI, the JSON document, the report and the web app use.

Each entry produces **one** DataFrame under **one** key (the key of ``kscope analyze --json``).
A module with several outputs (e.g. kernel breakdown -> ``kernel_type_breakdown`` and
``kernel_breakdown``) registers several entries.

The built-in analyses are known without importing them: ``kinetoscope.analysis.builtins`` lists
each one's metadata and ``"module:function"``, and the registry holds a *lazy* spec for it whose
``func`` (a :class:`LazyFunc`) imports the module on its first call. Listing, validating
``--only`` and planning therefore import no analysis module; running one imports its module,
whose own registration then replaces the lazy spec (the registry checks they agree).

Adding an analysis (other modules do this at import time, see ``_BUILTIN_MODULES``)::

    from kinetoscope.analysis.registry import AnalysisSpec, register

    register(AnalysisSpec(
        name="my_analysis",                # JSON key, --only NAME
        func=my_analysis,                  # (traces: list[Trace], **options) -> pl.DataFrame
        description="One line for --help and the report.",
        default=True,                      # runs without --only
        needs_gpu=True,                    # skipped with "no GPU events" when no trace has any
        options={"num_kernels": 10},       # keyword options the func accepts, with defaults
        empty_note="no X events",          # note shown when it returns no rows
        combine="concat",                  # how the map/reduce path (kinetoscope.scale) runs it
    ))

``func`` receives the traces as a list and only the options it declares; it must return a
Polars DataFrame with a ``rank`` column (times in µs) and must cope with traces lacking the
events it needs (return an empty frame with the right schema rather than raising).

``combine`` tells the map/reduce path (``kinetoscope.scale``, thousands of ranks) how the
analysis splits over ranks (see docs/scale.md):

* ``"concat"``: per-rank decomposable: the result over all ranks equals the per-rank results
  concatenated in input order; each rank is analysed on a worker.
* ``"concat_by_rank"``: the same, for an analysis that sorts its output by ``rank`` first
  (nulls last): the per-rank results concatenated in rank order.
* ``"reduce"``: per-rank partials on the workers and a cross-rank reducer on the driver
  (``kinetoscope.scale.reduce.REDUCERS[name]``; the plan refuses a missing one).
* ``"driver"`` (the default, for analyses that declare nothing): the whole trace of every rank
  comes back to the driver and the analysis runs there, as in one process: correct, not
  memory-scalable.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # Polars only names the return type: listing analyses must not import it
    import polars as pl

AnalysisFunc = Callable[..., "pl.DataFrame"]
COMBINE_STRATEGIES = ("concat", "concat_by_rank", "reduce", "driver")


class LazyFunc:
    """An analysis function named by ``"module:function"``; the module is imported on the first
    call (or :meth:`resolve`). Picklable (it holds only the name), and it answers
    ``__module__`` / ``__name__`` like the function it stands for."""

    def __init__(self, target: str) -> None:
        module, sep, name = target.partition(":")
        if not sep or not module or not name:
            raise ValueError(f"analysis target {target!r}: expected 'module:function'")
        self.target = target
        self.__module__ = module
        self.__name__ = self.__qualname__ = name

    def resolve(self) -> AnalysisFunc:
        """The real function (imports its module, which registers its analyses)."""
        func: AnalysisFunc = getattr(importlib.import_module(self.__module__), self.__name__)
        return func

    def __call__(self, *args: Any, **kwargs: Any) -> pl.DataFrame:
        return self.resolve()(*args, **kwargs)

    def __reduce__(self) -> tuple[type[LazyFunc], tuple[str]]:
        return (LazyFunc, (self.target,))

    def __repr__(self) -> str:
        return f"LazyFunc({self.target!r})"


def func_target(func: AnalysisFunc) -> str:
    """``"module:function"`` of an analysis function (or of a :class:`LazyFunc`)."""
    if isinstance(func, LazyFunc):
        return func.target
    return f"{func.__module__}:{getattr(func, '__qualname__', getattr(func, '__name__', '?'))}"


@dataclass(frozen=True)
class AnalysisSpec:
    name: str
    func: AnalysisFunc
    description: str
    default: bool = True
    needs_gpu: bool = True
    options: Mapping[str, Any] = field(default_factory=dict)
    # Display order in human output and in the JSON document (lower first; ties by name).
    order: int = 100
    # Loose grouping for display ("core", "steps", "annotations", "launch", "counters", ...).
    group: str = "core"
    # Shown (in ``notes``) when the analysis ran but produced no rows, e.g. "no steps found".
    empty_note: str | None = None
    # How the map/reduce path splits it over ranks: one of COMBINE_STRATEGIES (see above).
    combine: str = "driver"
    # The tables and columns it reads, as ``kinetoscope.trace.compact.Columns`` (table name ->
    # columns; a table not named is not read). None: not declared, every table and column is
    # kept. A map task loads only the union of what its analyses read (see ``reads_of``).
    reads: Mapping[str, tuple[str, ...]] | None = None

    def resolve_options(self, options: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """The declared options with the caller's values for the keys this analysis takes."""
        opts = dict(self.options)
        if options:
            opts.update({k: v for k, v in options.items() if k in self.options})
        return opts

    def call(self, traces: list[Any], options: Mapping[str, Any] | None = None) -> pl.DataFrame:
        return self.func(traces, **self.resolve_options(options))

    @property
    def is_lazy(self) -> bool:
        """True while the analysis's module has not been imported (``func`` is a LazyFunc)."""
        return isinstance(self.func, LazyFunc)


def metadata(spec: AnalysisSpec) -> dict[str, Any]:
    """Every field of ``spec`` but ``func``, plus ``target`` (``"module:function"``): what the
    static table of ``kinetoscope.analysis.builtins`` must match."""
    out = {f.name: getattr(spec, f.name) for f in fields(spec) if f.name != "func"}
    out["options"] = dict(spec.options)
    out["target"] = func_target(spec.func)
    return out


_REGISTRY: dict[str, AnalysisSpec] = {}

# Modules whose import registers built-in analyses. Their analyses are listed, without importing
# them, in kinetoscope.analysis.builtins; a module listed here but absent from that table is
# imported on the first look-up (correct, only slower; tests/analysis/test_registry_table.py fails
# until its entries are added). Another helper's module adds itself here.
_BUILTIN_MODULES: tuple[str, ...] = (
    "kinetoscope.analysis.temporal",
    "kinetoscope.analysis.idle_time",
    "kinetoscope.analysis.kernel_breakdown",
    "kinetoscope.analysis.kernel_distribution",
    "kinetoscope.analysis.comm_overlap",
    "kinetoscope.analysis.user_annotation",
    "kinetoscope.analysis.launch_stats",
    "kinetoscope.analysis.counters",
    "kinetoscope.analysis.steps",
    # heavier analyses (call graph, kernel sequences, critical path, memory, ...) append here
    "kinetoscope.analysis.call_graph",
    "kinetoscope.analysis.frequent_sequences",
    "kinetoscope.analysis.critical_path",
    "kinetoscope.analysis.memory_timeline",
    "kinetoscope.analysis.aten_op_kernels",
    "kinetoscope.analysis.cupti_counters",
)
_loaded = False


class RegistryMismatch(ValueError):
    """A module registered a built-in analysis differently from its entry in
    ``kinetoscope.analysis.builtins`` (a programming error: update the table)."""


def _check_same(table: AnalysisSpec, real: AnalysisSpec) -> None:
    want, got = metadata(table), metadata(real)
    diff = [k for k in want if want[k] != got[k]]
    if diff:
        k = diff[0]
        raise RegistryMismatch(
            f"analysis {real.name!r}: {k} is {got[k]!r} in {func_target(real.func)} but "
            f"{want[k]!r} in kinetoscope/analysis/builtins.py; update the table"
        )


def register(spec: AnalysisSpec, *, replace: bool = False) -> AnalysisSpec:
    """Add an analysis. Registering the same name twice is an error unless ``replace``; a
    module's registration of a built-in analysis replaces its lazy spec once checked against it."""
    if spec.combine not in COMBINE_STRATEGIES:
        raise ValueError(
            f"analysis {spec.name!r}: combine must be one of {COMBINE_STRATEGIES}, got {spec.combine!r}"
        )
    old = _REGISTRY.get(spec.name)
    if (
        old is not None
        and old.is_lazy
        and not spec.is_lazy
        and func_target(old.func) == func_target(spec.func)
    ):
        _check_same(old, spec)
    elif old is not None and not replace and old.func is not spec.func:
        raise ValueError(f"analysis {spec.name!r} is already registered")
    _REGISTRY[spec.name] = spec
    return spec


def builtin_specs() -> list[AnalysisSpec]:
    """The lazy specs of the static table (``kinetoscope.analysis.builtins``), in table order."""
    from kinetoscope.analysis.builtins import BUILTIN_ANALYSES

    return [AnalysisSpec(func=LazyFunc(target), **meta) for target, meta in BUILTIN_ANALYSES]


def _load_builtins() -> None:
    """Make every built-in analysis known: a lazy spec for each entry of the table (a module
    imported already has registered its real one: checked against the entry), then the
    modules of ``_BUILTIN_MODULES`` that the table does not cover."""
    global _loaded
    if _loaded:
        return
    _loaded = True
    tabled = set()
    for spec in builtin_specs():
        tabled.add(spec.func.__module__)
        real = _REGISTRY.get(spec.name)
        if real is None:
            _REGISTRY[spec.name] = spec
        elif not real.is_lazy and func_target(real.func) == func_target(spec.func):
            _check_same(spec, real)
    for mod in _BUILTIN_MODULES:
        if mod in tabled:
            continue
        try:
            importlib.import_module(mod)
        except ModuleNotFoundError as exc:  # a module not written yet must not break the rest
            if exc.name != mod:
                raise


def get(name: str) -> AnalysisSpec:
    """The spec of ``name``: lazy (its module not imported) until the analysis first runs."""
    _load_builtins()
    try:
        return _REGISTRY[name]
    except KeyError:
        raise KeyError(f"unknown analysis {name!r}; known: {', '.join(names())}") from None


def all_specs() -> list[AnalysisSpec]:
    """Every registered analysis in display order (imports no analysis module)."""
    _load_builtins()
    return sorted(_REGISTRY.values(), key=lambda s: (s.order, s.name))


def names(*, default_only: bool = False) -> list[str]:
    return [s.name for s in all_specs() if s.default or not default_only]


def default_names() -> list[str]:
    return names(default_only=True)


def reads_of(analyses: Iterable[str]) -> dict[str, set[str]] | None:
    """The union of what the named analyses read (``AnalysisSpec.reads``), or None when one of
    them does not declare it (then everything must be loaded)."""
    out: dict[str, set[str]] = {}
    for name in analyses:
        reads = get(name).reads
        if reads is None:
            return None
        for table, cols in reads.items():
            out.setdefault(table, set()).update(cols)
    return out
