"""What one trace records: the options of a trace request, defined once (docs/protocol.md §9.2).

Why a module of its own: ``kscope trace``, the web form and API, the autopilot, the demo, the RPC
request ``kscopeTrace`` (which embeds these fields, flat, under the same JSON names) and the
Kineto config builder (:func:`kinetoscope.protocol.kineto_config.build_config`) all speak of the
same eleven options. Written out once here, a field added is a field every one of them sees; the
limits (``msgspec.Meta``) are checked wherever the options are decoded, and a bad value is one
line naming the field (:func:`decode_options`, :func:`field_error`).

Fields left at their defaults are not sent (``omit_defaults``), so a request carries only what
its caller asked for; ``None`` means "the receiver's default" (Kineto's 500 ms, a roundup of 1,
the daemon's ``--include-launchers``).
"""

from __future__ import annotations

import re
from typing import Annotated, Any, TypeVar

import msgspec

from kinetoscope.protocol.structinfo import prime_structs

# A positive whole number (milliseconds, iterations, processes).
Positive = Annotated[int, msgspec.Meta(ge=1)]
# Milliseconds since the epoch, or 0 for "now" (dyno's --profile-start-time).
NonNegative = Annotated[int, msgspec.Meta(ge=0)]


def _m(description: str, **cli: Any) -> msgspec.Meta:
    """A field's one-line description: the web form's label, the API schema's text and (as a
    sentence) its ``kscope trace`` help. ``cli``: what only the command line needs (``help``: a
    longer help text; ``flags``: more spellings; ``metavar``), read by
    :mod:`kinetoscope.cli.struct_options`."""
    return msgspec.Meta(description=description, extra=cli or None)


class TraceOptions(msgspec.Struct, omit_defaults=True, kw_only=True, frozen=True):
    """What to record: the ``dyno gputrace`` options (docs/protocol.md §4.1) plus kscope's own.

    * ``duration_ms``: record this many milliseconds (duration mode; Kineto's default 500).
    * ``iterations``: record this many training iterations (``optimizer.step()`` calls); set, it
      selects iteration mode.
    * ``iteration_roundup``: iteration mode starts at the next iteration that is a multiple of it
      (default 1: the next step).
    * ``record_shapes``, ``profile_memory`` (duration mode only), ``with_stack``,
      ``with_flops``, ``with_modules``: Kineto's recording flags, off by default.
    * ``process_limit``: trigger at most this many matched processes per daemon.
    * ``include_launchers``: also trace launcher processes (torchrun's agent); ``None`` leaves
      it to the daemon's ``--include-launchers``.
    * ``profile_start_time_ms``: duration mode starts at this wall-clock time (ms since the
      epoch; 0 = as soon as possible). The daemon refuses a time in the past.

    Each field is also a ``kscope trace`` flag (``duration_ms`` -> ``--duration-ms``), generated
    from it: a new option is one field here (docs/cli.md, CONTRIBUTING.md).
    """

    duration_ms: Annotated[Positive | None, _m("record N milliseconds (duration mode)")] = None
    iterations: Annotated[Positive | None, _m("record N training iterations (optimizer.step() calls)")] = None
    iteration_roundup: Annotated[
        Positive | None,
        _m(
            "start at the next iteration that is a multiple of R",
            metavar="R",
            help="Start at the next iteration that is a multiple of R. Default for several "
            "processes: a multiple chosen so that every rank starts at the same iteration "
            "(docs/collect.md); for one: 1.",
        ),
    ] = None
    record_shapes: Annotated[bool, _m("record operator input shapes")] = False
    profile_memory: Annotated[bool, _m("record memory (duration mode only)")] = False
    with_stack: Annotated[bool, _m("record Python stacks", flags=("--with-stacks",))] = False
    with_flops: Annotated[bool, _m("estimate FLOPs of matmul/conv operators")] = False
    with_modules: Annotated[bool, _m("record the nn.Module hierarchy")] = False
    process_limit: Annotated[
        Positive | None, _m("trace at most N processes per host (default: no limit)")
    ] = None
    include_launchers: Annotated[
        bool | None, _m("also trace launcher processes (torchrun), skipped by default")
    ] = None
    profile_start_time_ms: Annotated[
        NonNegative | None,
        _m("start a duration trace at this time, ms since the epoch (0: now)", metavar="MS"),
    ] = None

    @property
    def mode(self) -> str:
        """``iterations`` or ``duration``: what the trace counts."""
        return "iterations" if self.iterations is not None else "duration"

    def check(self) -> None:
        """Raise ValueError for a combination Kineto or dyno refuse (the fields are each valid)."""
        if self.profile_memory and self.iterations is not None:
            raise ValueError("profile_memory cannot be combined with iteration mode (dyno rejects it too)")


# The option names, in definition order (forms and manifests list them this way).
OPTION_FIELDS: tuple[str, ...] = TraceOptions.__struct_fields__


def field_descriptions(kind: type[msgspec.Struct]) -> dict[str, str]:
    """name -> the ``Meta(description=...)`` of each field of ``kind`` that has one."""
    out: dict[str, str] = {}
    for f in msgspec.structs.fields(kind):
        for meta in getattr(f.type, "__metadata__", ()):
            if isinstance(meta, msgspec.Meta) and meta.description:
                out[f.name] = meta.description
    return out


S = TypeVar("S", bound=msgspec.Struct)

_PATH_RE = re.compile(r"^(?P<msg>.*?)(?: - at `\$(?P<path>[^`]*)`)?$", re.S)


def field_error(exc: msgspec.ValidationError) -> str:
    """One line naming the field of a msgspec validation error: ``'duration_ms': Expected `int`
    >= 1`` (msgspec says ``... - at `$.duration_ms```)."""
    match = _PATH_RE.match(str(exc).replace("\n", " "))
    if match is None or not match.group("path"):
        return str(exc).replace("\n", " ")
    field = match.group("path").lstrip(".")
    return f"'{field}': {match.group('msg')}"


class OptionsError(ValueError):
    """A trace request or its options failed validation; the message names the field."""


def decode_as(fields: Any, kind: type[S]) -> S:
    """``fields`` (a JSON object already parsed, or a struct's builtins) as ``kind``, with every
    limit checked; unknown keys are ignored (``fn``, ``token`` ride along in RPC requests).
    Raises :class:`OptionsError` naming the field."""
    try:
        return msgspec.convert(fields, kind)
    except msgspec.ValidationError as exc:
        raise OptionsError(field_error(exc)) from None


def decode_options(fields: Any) -> TraceOptions:
    """:class:`TraceOptions` from a JSON object, checked (limits and combinations)."""
    options = decode_as(fields, TraceOptions)
    options.check()
    return options


def options_fields(options: TraceOptions) -> dict[str, Any]:
    """The JSON object of ``options`` (fields at their defaults left out)."""
    out: dict[str, Any] = msgspec.to_builtins(options)
    return out


__all__ = [
    "OPTION_FIELDS",
    "OptionsError",
    "TraceOptions",
    "decode_as",
    "decode_options",
    "field_descriptions",
    "field_error",
    "options_fields",
]


prime_structs(globals())
