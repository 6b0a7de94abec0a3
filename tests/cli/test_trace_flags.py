"""`kscope trace` takes its trace-option flags from protocol/trace_options.TraceOptions: one field,
one flag (kinetoscope/cli/struct_options.py); the flags users know keep their names and meaning."""

from __future__ import annotations

from typing import Annotated, Any

import msgspec
import pytest
import typer
from typer.testing import CliRunner

from kinetoscope.cli.main import load_commands
from kinetoscope.cli.struct_options import struct_options, with_struct_options
from kinetoscope.errors import UsageError
from kinetoscope.protocol.trace_options import OPTION_FIELDS, TraceOptions

# The flags docs/cli.md lists for `kscope trace` before they were generated (a stable contract).
KNOWN = {
    "duration_ms": ("--duration-ms",),
    "iterations": ("--iterations",),
    "iteration_roundup": ("--iteration-roundup",),
    "record_shapes": ("--record-shapes",),
    "profile_memory": ("--profile-memory",),
    "with_stack": ("--with-stack", "--with-stacks"),
    "with_flops": ("--with-flops",),
    "with_modules": ("--with-modules",),
    "process_limit": ("--process-limit",),
    "include_launchers": ("--include-launchers",),
}


def _trace_params() -> dict[str, Any]:
    return {p.name: p for p in load_commands("kinetoscope.cli.trace_cmd")["trace"].params}


def test_every_trace_option_is_a_flag_with_its_known_names() -> None:
    params = _trace_params()
    for name in OPTION_FIELDS:
        assert name in params, f"TraceOptions.{name} has no kscope trace flag"
    for name, flags in KNOWN.items():
        assert tuple(params[name].opts) == flags, name
        assert not params[name].required
    for name in ("record_shapes", "profile_memory", "with_stack", "include_launchers"):
        assert params[name].is_flag and params[name].default is False
    assert params["duration_ms"].default is None and params["duration_ms"].type_descriptor.annotation is int
    assert params["iteration_roundup"].metavar == "R"
    # hand-written flags beside them are still there
    assert {"no_align", "output_dir", "wait", "all_", "job_id", "pids"} <= set(params)


def test_one_new_field_is_one_new_flag() -> None:
    """What a contributor does: add a field (with a description) and the command has its flag,
    typed, defaulted, helped and limited."""

    class Options(msgspec.Struct, kw_only=True):
        warmup_ms: Annotated[
            Annotated[int, msgspec.Meta(ge=0, le=60_000)] | None, msgspec.Meta(description="warm up for N ms")
        ] = None
        verbose: Annotated[bool, msgspec.Meta(description="say more", extra={"flags": ("-v",)})] = False

    [warmup, verbose] = struct_options(Options)
    assert (warmup.flags, warmup.default, warmup.help, warmup.ge, warmup.le) == (
        ("--warmup-ms",),
        None,
        "Warm up for N ms.",
        0,
        60_000,
    )
    assert verbose.flags == ("--verbose", "-v") and verbose.annotation is bool

    seen: list[dict[str, Any]] = []
    app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)

    @app.command()
    @with_struct_options(Options, into="options")
    def run(name: str = typer.Option("x", "--name"), options: dict[str, Any] | None = None) -> None:
        seen.append({"name": name, **(options or {})})

    runner = CliRunner()
    ok = runner.invoke(app, ["--warmup-ms", "250", "-v", "--name", "job"])
    assert ok.exit_code == 0, ok.output
    assert seen == [{"name": "job", "warmup_ms": 250, "verbose": True}]
    assert runner.invoke(app, []).exit_code == 0 and seen[-1] == {
        "name": "x",
        "warmup_ms": None,
        "verbose": False,
    }
    bad = runner.invoke(app, ["--warmup-ms", "70000"])
    assert isinstance(bad.exception, UsageError)
    assert str(bad.exception) == "--warmup-ms must be at most 60000, got 70000"
    assert "Warm up for N ms." in runner.invoke(app, ["--help"]).output


def test_a_field_the_command_line_cannot_take_is_refused_by_name() -> None:
    class Odd(msgspec.Struct):
        ranks: list[int] = []

    with pytest.raises(TypeError, match=r"Odd\.ranks"):
        struct_options(Odd)


def test_the_trace_flags_follow_the_struct() -> None:
    generated = {o.name: o for o in struct_options(TraceOptions)}
    assert list(generated) == list(OPTION_FIELDS)
    assert generated["process_limit"].ge == 1 and generated["profile_start_time_ms"].ge == 0
