"""Fuzzing the Kineto config text: the builder (``kineto_config.build_config``) and the
daemon's check of configs it did not build (``setKinetOnDemandRequest`` through the real
``RpcHandlers``), both against an independent model of Kineto's parser.

Kineto's ``AbstractConfig::parse`` (docs/protocol.md §4.4): one ``KEY=VALUE`` per ``\\n``-separated line,
``#`` starts a comment, key and value trimmed of ``" \\t\\n"``, and a line without exactly one
``=`` *aborts* parsing there (the rest of the config is ignored; a missing log file then
means Kineto's default ``/tmp`` path). The properties: a built config parses to exactly the
values given; a config the daemon accepts makes Kineto write under the trace root.
"""

from __future__ import annotations

import os

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from kinetoscope.daemon.handlers import RpcHandlers
from kinetoscope.daemon.metrics import DaemonMetrics
from kinetoscope.daemon.registry import Registry
from kinetoscope.daemon.traces import TraceBook
from kinetoscope.protocol import kineto_config as kc

from . import fuzz_settings

ROOT = "/tmp/kscope-fuzz-root"  # lexical checks only: nothing is created (no process is registered)


def kineto_parse(config: str) -> tuple[dict[str, str], bool]:
    """(options Kineto would apply, whether it parsed to the end) - a model of the C++ parser."""
    out: dict[str, str] = {}
    for raw in config.split("\n"):
        line = raw.split("#", 1)[0]
        if not line.strip(" \t\n"):
            continue
        parts = line.split("=")
        if len(parts) != 2:
            return out, False
        out[parts[0].strip(" \t\n")] = parts[1].strip(" \t\n")
    return out, True


@pytest.fixture(scope="module")
def handlers() -> RpcHandlers:
    return RpcHandlers(
        registry=Registry(), book=TraceBook(), metrics=DaemonMetrics(), hostname="fuzzhost", trace_root=ROOT
    )


text_with_hostile_chars = st.lists(
    st.sampled_from(list("ab/._-=# \t\r\n\x00\x0b\x0cé") + ["/tmp/", ROOT, "..", "ACTIVITIES_LOG_FILE"]),
    max_size=20,
).map("".join)
log_files = st.one_of(
    st.builds(lambda s: f"{ROOT}/{s}", text_with_hostile_chars),
    text_with_hostile_chars,
)


@fuzz_settings(500)
@given(
    log_file=log_files,
    duration_ms=st.integers(min_value=-5, max_value=10**7),
    iterations=st.integers(min_value=-5, max_value=100),
    start=st.integers(min_value=-5, max_value=2**45),
    roundup=st.integers(min_value=-5, max_value=100),
    flags=st.lists(st.booleans(), min_size=5, max_size=5),
)
def test_built_config_parses_back_to_its_inputs(
    fuzz_counts, log_file, duration_ms, iterations, start, roundup, flags
):
    fuzz_counts["config: builder"] += 1
    try:
        text = kc.build_config(
            log_file=log_file, duration_ms=duration_ms, iterations=iterations, profile_start_time_ms=start,
            iteration_roundup=roundup, record_shapes=flags[0], profile_memory=flags[1], with_stack=flags[2],
            with_flops=flags[3], with_modules=flags[4],
        )  # fmt: skip
    except ValueError:
        return
    options, complete = kineto_parse(kc.wrap_with_trace_id(text, "t-1"))
    assert complete, text
    assert options[kc.ACTIVITIES_LOG_FILE] == log_file
    assert options[kc.REQUEST_TRACE_ID] == "t-1"
    assert kc.option_values(text, kc.ACTIVITIES_LOG_FILE) == [log_file]


line_strategy = st.one_of(
    st.builds(
        lambda ws1, key, ws2, value, tail: f"{ws1}{key}{ws2}={value}{tail}",
        st.sampled_from(["", " ", "\t", "\r", "\x0b"]),
        st.sampled_from([kc.ACTIVITIES_LOG_FILE, "PROFILE_START_TIME", "activities_log_file", "X"]),
        st.sampled_from(["", " ", "\t", "\r"]),
        log_files,
        st.sampled_from(["", " ", "\r", " # comment", "=x", "\t"]),
    ),
    text_with_hostile_chars,
)


@fuzz_settings(800)
@given(st.lists(line_strategy, max_size=6), st.sampled_from(["\n", "\r\n", "\n\n"]))
def test_an_accepted_config_makes_kineto_write_under_the_root(handlers, fuzz_counts, lines, sep):
    fuzz_counts["config: daemon check"] += 1
    config = sep.join(lines)
    request = {"fn": "setKinetOnDemandRequest", "config": config, "pids": [0], "job_id": 0}
    reply = orjson.loads(handlers.handle_frame(orjson.dumps(request)))
    assert "internal error" not in str(reply.get("error", ""))
    if "status" in reply:  # refused
        assert reply["status"].startswith("failed") and reply["error"]
        return
    options, complete = kineto_parse(config)
    assert complete, f"accepted a config Kineto stops parsing early: {config!r}"
    log_file = options.get(kc.ACTIVITIES_LOG_FILE)
    assert log_file, f"accepted a config without a log file for Kineto: {config!r}"
    norm = os.path.normpath(log_file)
    assert norm.startswith(ROOT + "/") and ".." not in log_file.split("/"), config
    assert not any(ord(c) < 32 for c in log_file), config
