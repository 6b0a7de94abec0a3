"""The one trace-options struct (protocol/trace_options.py): limits, one-line errors naming the
field, the flat RPC field names Dynolog-style clients send, and build_config taking it."""

from __future__ import annotations

import msgspec
import pytest

from kinetoscope.protocol import kineto_config as kc
from kinetoscope.protocol import rpc
from kinetoscope.protocol.trace_options import (
    OPTION_FIELDS,
    OptionsError,
    TraceOptions,
    decode_as,
    decode_options,
    options_fields,
)


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"duration_ms": 0}, "'duration_ms': Expected `int` >= 1"),
        ({"iterations": "3"}, "'iterations': Expected `int | null`, got `str`"),
        ({"record_shapes": 1}, "'record_shapes': Expected `bool`, got `int`"),
        ({"process_limit": -1}, "'process_limit': Expected `int` >= 1"),
        ({"profile_start_time_ms": -5}, "'profile_start_time_ms': Expected `int` >= 0"),
        ({"iterations": 2, "profile_memory": True}, "profile_memory cannot be combined with iteration mode"),
    ],
)
def test_a_bad_field_is_one_line_naming_it(fields, message):
    with pytest.raises(ValueError) as info:
        decode_options(fields)
    assert str(info.value) == message or str(info.value).startswith(message)
    assert "\n" not in str(info.value)


def test_the_rpc_request_embeds_the_options_under_their_wire_names():
    assert set(OPTION_FIELDS) <= set(rpc.KscopeTraceRequest.__struct_fields__)
    call = rpc.KscopeTraceRequest(
        trace_id="t-1", job_id=7, iterations=5, iteration_roundup=10, with_stack=True
    )
    wire = rpc.request_fields(call)
    assert wire == {
        "trace_id": "t-1",
        "job_id": 7,
        "iterations": 5,
        "iteration_roundup": 10,
        "with_stack": True,
    }
    back = decode_as({"fn": "kscopeTrace", "token": "x", **wire}, rpc.KscopeTraceRequest)
    assert back == call and back.options == TraceOptions(iterations=5, iteration_roundup=10, with_stack=True)
    assert options_fields(back.options) == {"iterations": 5, "iteration_roundup": 10, "with_stack": True}
    with pytest.raises(OptionsError, match="trace_id"):
        decode_as({"iterations": 5}, rpc.KscopeTraceRequest)


def test_build_config_takes_the_struct_and_keywords_alike():
    opts = TraceOptions(iterations=10, iteration_roundup=50, record_shapes=True)
    assert kc.build_config(opts, log_file="/t/a.json") == kc.build_config(
        log_file="/t/a.json", iterations=10, iteration_roundup=50, record_shapes=True
    )
    assert kc.build_config(TraceOptions(), log_file=None).startswith("PROFILE_START_TIME=0\n")
    with pytest.raises(ValueError, match="'duration_ms'"):
        kc.build_config(log_file=None, duration_ms=0)


def test_the_json_schema_carries_the_limits():
    schema = msgspec.json.schema(TraceOptions)["$defs"]["TraceOptions"]["properties"]
    assert {"type": "integer", "minimum": 1} in schema["duration_ms"]["anyOf"]
    assert schema["profile_memory"]["description"] == "record memory (duration mode only)"
