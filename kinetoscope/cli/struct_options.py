"""Typer options generated from a msgspec Struct: one field, one flag.

Why: the trace options are defined once (:class:`kinetoscope.protocol.trace_options.TraceOptions`);
``kscope trace`` takes its flags from that struct's fields instead of writing them out again, so
a new option is one field there. A field becomes a flag as follows:

* name: ``duration_ms`` -> ``--duration-ms``; ``Meta(extra={"flags": (...)})`` adds spellings;
* type: ``bool`` (and ``bool | None``, "not asked" = off) -> an on/off flag; ``int``,
  ``float``, ``str`` (or ``... | None``) -> an option taking a value; the field's default is the
  flag's default;
* help: the field's ``Meta(description=...)`` as a sentence ("record N milliseconds" ->
  "Record N milliseconds."), or ``Meta(extra={"help": ...})`` where the command line needs
  more words; ``Meta(extra={"metavar": "R"})`` names the value;
* limits: ``Meta(ge=..., le=...)`` are checked before the command runs, one line naming the
  flag (``--process-limit must be at least 1, got 0``).
"""

from __future__ import annotations

import functools
import inspect
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import msgspec
import typer

from kinetoscope.errors import UsageError


@dataclass(frozen=True)
class FieldOption:
    """One struct field as a command-line option."""

    name: str  # the field (and the Python parameter)
    flags: tuple[str, ...]  # --duration-ms, then any extra spellings
    annotation: Any  # what typer parses: bool, int | None, ...
    default: Any
    help: str
    metavar: str | None = None
    ge: int | float | None = None
    le: int | float | None = None

    def parameter(self) -> inspect.Parameter:
        """The function parameter typer reads this option from."""
        option = typer.Option(self.default, *self.flags, help=self.help, metavar=self.metavar)
        return inspect.Parameter(
            self.name, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=option, annotation=self.annotation
        )

    def check(self, value: Any) -> None:
        """Raise UsageError naming the flag when ``value`` is outside the field's limits."""
        if value is None or isinstance(value, bool):
            return
        if self.ge is not None and value < self.ge:
            raise UsageError(f"{self.flags[0]} must be at least {self.ge:g}, got {value}")
        if self.le is not None and value > self.le:
            raise UsageError(f"{self.flags[0]} must be at most {self.le:g}, got {value}")


_PLAIN = {
    msgspec.inspect.BoolType: bool,
    msgspec.inspect.IntType: int,
    msgspec.inspect.FloatType: float,
    msgspec.inspect.StrType: str,
}


def _plain(t: msgspec.inspect.Type, where: str) -> tuple[Any, msgspec.inspect.Type]:
    """The Python type typer parses for ``t`` (``X | None`` kept optional, bool flags plain), and
    the msgspec type that carries the limits."""
    if isinstance(t, msgspec.inspect.Metadata):
        t = t.type
    optional = False
    if isinstance(t, msgspec.inspect.UnionType):
        rest = [u for u in t.types if not isinstance(u, msgspec.inspect.NoneType)]
        if len(rest) != 1:
            raise TypeError(f"{where}: a union of several types cannot be one option")
        optional, t = True, rest[0]
    if isinstance(t, msgspec.inspect.Metadata):
        t = t.type
    plain = _PLAIN.get(type(t))
    if plain is None:
        raise TypeError(f"{where}: {type(t).__name__} cannot be one option")
    if plain is bool or not optional:
        return plain, t
    return plain | None, t


def _meta(annotation: Any) -> tuple[str, dict[str, Any]]:
    """The description and the ``extra`` of a field's outer ``Annotated[..., Meta(...)]``."""
    description = ""
    extra: dict[str, Any] = {}
    for meta in getattr(annotation, "__metadata__", ()):
        if isinstance(meta, msgspec.Meta):
            description = meta.description or description
            extra = dict(meta.extra or {}) or extra
    return description, extra


def _sentence(text: str) -> str:
    return text[:1].upper() + text[1:] + ("" if text.endswith(".") else ".")


def struct_options(kind: type[msgspec.Struct]) -> list[FieldOption]:
    """Every field of ``kind`` as an option, in definition order."""
    info = msgspec.inspect.type_info(kind)
    assert isinstance(info, msgspec.inspect.StructType)
    raw = {f.name: f.type for f in msgspec.structs.fields(kind)}
    out = []
    for field in info.fields:
        annotation, base = _plain(field.type, f"{kind.__name__}.{field.name}")
        description, extra = _meta(raw[field.name])
        default = field.default if field.default is not msgspec.NODEFAULT else None
        if annotation is bool and default is None:
            default = False  # a bool | None field: off unless the flag is given
        out.append(
            FieldOption(
                name=field.name,
                flags=("--" + field.name.replace("_", "-"), *extra.get("flags", ())),
                annotation=annotation,
                default=default,
                help=extra.get("help") or _sentence(description or field.name.replace("_", " ")),
                metavar=extra.get("metavar"),
                ge=getattr(base, "ge", None),
                le=getattr(base, "le", None),
            )
        )
    return out


def with_struct_options(
    kind: type[msgspec.Struct], into: str
) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """A Typer command decorator: the parameter ``into`` of the decorated function (a
    ``dict[str, Any]``) is replaced, in its place, by one option per field of ``kind``; the
    command gets the given values as that dict (field name -> value), limits checked."""
    options = struct_options(kind)

    def decorate(func: Callable[..., None]) -> Callable[..., None]:
        hints = typing.get_type_hints(func)
        params: list[inspect.Parameter] = []
        for p in inspect.signature(func).parameters.values():
            if p.name == into:
                params.extend(o.parameter() for o in options)
            else:
                params.append(p.replace(annotation=hints.get(p.name, p.annotation)))

        @functools.wraps(func)
        def command(**kwargs: Any) -> None:
            values = {o.name: kwargs.pop(o.name) for o in options}
            for o in options:
                o.check(values[o.name])
            func(**kwargs, **{into: values})

        command.__signature__ = inspect.Signature(params, return_annotation=None)  # type: ignore[attr-defined]
        command.__annotations__ = {p.name: p.annotation for p in params}
        return command

    return decorate
