"""Lazy package exports: ``from kinetoscope.store import TraceStore`` must not import SQLAlchemy,
and ``import kinetoscope.report`` must not import Plotly, so packages name their public objects
here and import the defining module on first use (PEP 562)."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_exports(
    package: str, exports: Mapping[str, str]
) -> tuple[list[str], Callable[[str], Any], Callable[[], list[str]]]:
    """``(__all__, __getattr__, __dir__)`` for ``package`` whose ``exports`` map a public name
    to the sub-module (relative to ``package``, or absolute when it starts with ``kinetoscope.``)
    that defines it."""
    names = sorted(exports)

    def getattr_(name: str) -> Any:
        mod = exports.get(name)
        if mod is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        target = mod if mod.startswith("kinetoscope.") else f"{package}.{mod}"
        return getattr(importlib.import_module(target), name)

    def dir_() -> list[str]:
        return list(names)

    return names, getattr_, dir_
