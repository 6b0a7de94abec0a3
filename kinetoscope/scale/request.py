"""``AnalyzeRequest``: everything one analysis run needs, built once by its caller and passed whole.

The CLI (``kscope analyze``/``report``), the web app, the demo and the benchmarks build one and
hand it to ``kinetoscope.orchestration.analyze`` (inputs resolved to files) or
``kinetoscope.scale.run_analysis`` (files already known). Defining the options in one place
replaces the 11-15 keyword parameters each entry point used to spell out.

Terms: an *analysis* is a registered table (``kinetoscope.analysis.registry``); the *diagnosis*
is the job-level verdict (``kinetoscope.diagnosis``); a *backend* is where the per-rank work
runs (``auto``, ``single`` = this process, ``local`` = a process pool, ``ray``).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

BACKENDS = ("auto", "single", "local", "ray")


@dataclass(frozen=True)
class AnalyzeRequest:
    """One analysis run. ``inputs``: files, folders, storage URLs or catalog trace ids (see
    ``kinetoscope.orchestration.resolve_inputs``). ``names``: analyses to run (empty: the default
    ones). ``analyses=False`` / ``diagnosis=False`` skip the tables / the job diagnosis;
    ``only_diagnosis`` keeps only those diagnosis keys (plus the summary). ``ranks``: only
    these ranks (``--ranks``). ``model_flops``/``peak_flops`` feed MFU."""

    inputs: tuple[str, ...] = ()
    names: tuple[str, ...] = ()
    options: Mapping[str, Any] = field(default_factory=dict)
    analyses: bool = True
    diagnosis: bool = True
    only_diagnosis: tuple[str, ...] = ()
    ranks: frozenset[int] | None = None
    model_flops: float | None = None
    peak_flops: float | None = None
    cache: bool = True
    salvage: bool = False
    cache_dir: str | None = None  # the Parquet trace cache (None: the default one)
    fetch_cache_dir: str | None = None  # downloads of storage URLs (None: the default one)
    catalog_url: str | None = None  # for catalog trace ids (None: $KSCOPE_CATALOG or the default)
    backend: str = "auto"
    workers: int | None = None  # local pool size, or local Ray CPUs (None: CPU count)
    ray_address: str | None = None  # None: $RAY_ADDRESS, else a local Ray when backend="ray"

    def __post_init__(self) -> None:
        from kinetoscope.errors import UsageError

        # accept lists and paths from callers; store hashable, normalised values
        object.__setattr__(self, "inputs", tuple(os.fspath(i) for i in self.inputs))
        object.__setattr__(self, "names", tuple(self.names or ()))
        object.__setattr__(self, "only_diagnosis", tuple(self.only_diagnosis or ()))
        object.__setattr__(self, "options", dict(self.options or {}))
        if self.ranks is not None:
            object.__setattr__(self, "ranks", frozenset(self.ranks))
        for k in ("cache_dir", "fetch_cache_dir"):
            v = getattr(self, k)
            if v is not None:
                object.__setattr__(self, k, os.fspath(v))
        if self.backend not in BACKENDS:
            raise UsageError(f"--backend: {self.backend!r} is not one of {', '.join(BACKENDS)}")
        if self.workers is not None and self.workers < 1:
            raise UsageError(f"--workers: {self.workers} is not a positive number of workers")

    @classmethod
    def from_only(cls, only: Iterable[str], diagnosis_keys: Sequence[str], **kw: Any) -> AnalyzeRequest:
        """The request for ``--only`` names: analysis names go to ``names``, diagnosis keys to
        ``only_diagnosis``; naming only diagnosis keys skips the analyses, only analyses the
        diagnosis."""
        only = list(only)
        names = tuple(n for n in only if n not in diagnosis_keys)
        diag = tuple(n for n in only if n in diagnosis_keys)
        return cls(
            names=names,
            only_diagnosis=diag,
            analyses=not (only and not names),
            diagnosis=not only or bool(diag),
            **kw,
        )

    def with_inputs(self, inputs: Iterable[str | os.PathLike[str]]) -> AnalyzeRequest:
        """The same request over other inputs (e.g. the files its inputs resolved to)."""
        return replace(self, inputs=tuple(os.fspath(i) for i in inputs))

    def diagnosis_options(self) -> dict[str, float]:
        """The ``diagnose`` keywords the user gave (MFU inputs), unset ones left out."""
        pairs = {"model_flops": self.model_flops, "peak_flops": self.peak_flops}
        return {k: v for k, v in pairs.items() if v is not None}
