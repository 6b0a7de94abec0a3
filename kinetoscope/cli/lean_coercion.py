"""Typer's parameter coercion without Pydantic for values that are already of their type.

Typer 0.29 coerces every parameter of a command through a Pydantic ``TypeAdapter`` that it
builds on each invocation (``typer._coercion.build_runtime_param``): importing Pydantic and
building ~15 adapters costs ~0.1 s of every ``kscope analyze``, more than the analyses of a
small trace. Yet almost every value a command line gives is a ``str`` for a ``str``
parameter, a tuple of ``str`` for a ``list[str]`` one, or ``None``/a ``bool`` default, for
which Typer's adapter returns the value unchanged (a list for a list). :func:`install`
swaps in a runtime parameter that returns those values directly and hands every other value
(numbers, choices, paths, files, custom parsers) to the adapter Typer would have built, built
on first use: results and error messages stay Typer's own. ``tests/cli/test_lean_coercion.py``
checks both paths give the same values for every parameter of every command.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, get_args, get_origin

from typer import _coercion, core
from typer._click import Context
from typer._coercion import RuntimeParam, TypeDescriptor

_typer_build = _coercion.build_runtime_param


def _plain_str(desc: TypeDescriptor) -> bool:
    """A ``str`` parameter Typer coerces with ``str(value)`` only (no parser, no file)."""
    return desc.annotation is str and desc.parameter_info.parser is None and desc.file_annotation is None


def _plain_str_list(desc: TypeDescriptor) -> bool:
    """A ``list[str]`` parameter whose items Typer coerces with ``str(item)`` only."""
    origin: object = get_origin(desc.annotation)  # typeshed's overloads type an Any argument as a ParamSpec's
    return (
        origin is list
        and get_args(desc.annotation) == (str,)
        and desc.parameter_info.parser is None
        and desc.file_annotation is None
    )


@dataclass(frozen=True)
class LeanRuntimeParam(RuntimeParam):
    """Typer's ``RuntimeParam`` contract (``None`` and multi-value handling are the base
    class's); values already of the declared type pass through, the rest go to Typer's own
    runtime parameter, built once on first need."""

    descriptor: TypeDescriptor
    _typer: list[RuntimeParam] = field(default_factory=list, compare=False, repr=False)

    def _coerce_value(self, value: Any, param: core._TyperParameter, ctx: Context) -> Any:
        desc = self.descriptor
        if type(value) is str and _plain_str(desc):
            return value
        if isinstance(value, (list, tuple)) and all(type(v) is str for v in value) and _plain_str_list(desc):
            return list(value)
        if not self._typer:
            self._typer.append(_typer_build(desc))
        return self._typer[0]._coerce_value(value, param=param, ctx=ctx)


def lean_runtime_param(descriptor: TypeDescriptor) -> RuntimeParam:
    """What ``typer.core`` calls instead of ``build_runtime_param``."""
    return LeanRuntimeParam(
        parameter_info=descriptor.parameter_info, annotation=descriptor.annotation, descriptor=descriptor
    )


def install() -> None:
    """Make every Typer parameter of this process coerce through :class:`LeanRuntimeParam`."""
    vars(core)["build_runtime_param"] = lean_runtime_param  # typer.core re-exports it implicitly
