"""The trigger's options produce exactly the Kineto config text `dyno gputrace` sends (docs/protocol.md §4.2)."""

from __future__ import annotations

import pytest

from kinetoscope.collect.trigger import TraceOptions
from kinetoscope.errors import UsageError

# Captured from the real dyno CLI: `dyno gputrace --log-file /tmp/x/trace.json` (docs/protocol.md §3.3).
DYNO_DEFAULT = (
    "ACTIVITIES_LOG_FILE=/tmp/x/trace.json\nPROFILE_START_TIME=0\nACTIVITIES_DURATION_MSECS=500\n"
    "PROFILE_REPORT_INPUT_SHAPES=false\nPROFILE_WITH_STACK=false\nPROFILE_WITH_FLOPS=false\n"
    "PROFILE_WITH_MODULES=false"
)


def test_duration_default_matches_dyno_bytes():
    assert TraceOptions(duration_ms=500).config_text("/tmp/x/trace.json") == DYNO_DEFAULT


def test_iterations_match_dyno():
    # dyno gputrace --log-file /tmp/x/trace.json --iterations 10 --profile-start-iteration-roundup 50
    text = TraceOptions(iterations=10, iteration_roundup=50).config_text("/tmp/x/trace.json")
    assert text == (
        "ACTIVITIES_LOG_FILE=/tmp/x/trace.json\nPROFILE_START_ITERATION=0\nPROFILE_START_ITERATION_ROUNDUP=50\n"
        "ACTIVITIES_ITERATIONS=10\nPROFILE_REPORT_INPUT_SHAPES=false\nPROFILE_WITH_STACK=false\n"
        "PROFILE_WITH_FLOPS=false\nPROFILE_WITH_MODULES=false"
    )


def test_iterations_default_roundup_is_one_like_dyno():
    text = TraceOptions(iterations=5).config_text("/tmp/t.json")
    assert "\nPROFILE_START_ITERATION_ROUNDUP=1\nACTIVITIES_ITERATIONS=5\n" in text


def test_all_options_with_memory_match_dyno():
    # dyno gputrace --log-file /tmp/x/trace.json --duration-ms 2000 --record-shapes --profile-memory
    #   --with-stacks --with-flops --with-modules
    opts = TraceOptions(
        duration_ms=2000,
        record_shapes=True,
        profile_memory=True,
        with_stack=True,
        with_flops=True,
        with_modules=True,
    )
    assert opts.config_text("/tmp/x/trace.json") == (
        "ACTIVITIES_LOG_FILE=/tmp/x/trace.json\nPROFILE_START_TIME=0\nACTIVITIES_DURATION_MSECS=2000\n"
        "PROFILE_REPORT_INPUT_SHAPES=true\nPROFILE_PROFILE_MEMORY=true\nPROFILE_MEMORY=true\n"
        "PROFILE_MEMORY_DURATION_MSECS=2000\nPROFILE_WITH_STACK=true\nPROFILE_WITH_FLOPS=true\n"
        "PROFILE_WITH_MODULES=true"
    )


def test_iteration_options_without_memory():
    opts = TraceOptions(iterations=3, iteration_roundup=4, record_shapes=True, with_stack=True)
    assert opts.config_text("/tmp/x/trace.json").endswith(
        "ACTIVITIES_ITERATIONS=3\nPROFILE_REPORT_INPUT_SHAPES=true\nPROFILE_WITH_STACK=true\n"
        "PROFILE_WITH_FLOPS=false\nPROFILE_WITH_MODULES=false"
    )


def test_shared_part_has_no_log_file():
    text = TraceOptions(duration_ms=500).config_text(None)
    assert text == DYNO_DEFAULT.split("\n", 1)[1]


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({}, "either --duration-ms N or --iterations N"),
        ({"duration_ms": 500, "iterations": 3}, "either --duration-ms N or --iterations N"),
        ({"duration_ms": 0}, "--duration-ms must be a positive"),
        ({"iterations": -2}, "--iterations must be a positive"),
        ({"duration_ms": 500, "iteration_roundup": 4}, "--iteration-roundup only applies to --iterations"),
        ({"iterations": 5, "iteration_roundup": 0}, "--iteration-roundup must be at least 1"),
        ({"iterations": 5, "profile_memory": True}, "--profile-memory needs --duration-ms"),
        ({"duration_ms": 5, "process_limit": 0}, "--process-limit must be at least 1"),
    ],
)
def test_invalid_options_name_the_flag(kwargs, message):
    with pytest.raises(UsageError) as info:
        TraceOptions(**kwargs).validate()
    assert message in str(info.value)


def test_rpc_fields():
    assert TraceOptions(iterations=10).rpc_fields() == {"iterations": 10, "iteration_roundup": 1}
    assert TraceOptions(duration_ms=700, with_stack=True, process_limit=2).rpc_fields() == {
        "duration_ms": 700,
        "with_stack": True,
        "process_limit": 2,
    }
