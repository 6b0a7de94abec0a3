"""Pure functions: config text (docs/protocol.md §4.2), naming (§4.3), framing parsers (property tests)."""

from __future__ import annotations

import os
import struct
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kinetoscope.daemon.logsetup import RateLimitedLogger
from kinetoscope.daemon.paths import PathRefused, confine, ensure_dir
from kinetoscope.daemon.procinfo import parse_environ, parse_stat
from kinetoscope.daemon.traces import file_status
from kinetoscope.protocol import wire
from kinetoscope.protocol.kineto_config import (
    build_config,
    iter_options,
    kineto_output_path,
    option_values,
    valid_trace_id,
    wrap_with_trace_id,
)


# ------------------------------------------------------------------------ config text
def test_duration_config_matches_dyno_bytes():
    assert build_config(log_file="/tmp/x/trace.json") == (
        "ACTIVITIES_LOG_FILE=/tmp/x/trace.json\nPROFILE_START_TIME=0\nACTIVITIES_DURATION_MSECS=500"
        "\nPROFILE_REPORT_INPUT_SHAPES=false\nPROFILE_WITH_STACK=false\nPROFILE_WITH_FLOPS=false"
        "\nPROFILE_WITH_MODULES=false"
    )


def test_iteration_config_with_all_options():
    assert build_config(
        log_file="/t/a.json", iterations=10, iteration_roundup=50, record_shapes=True,
        with_stack=True, with_flops=True, with_modules=True,
    ) == (
        "ACTIVITIES_LOG_FILE=/t/a.json\nPROFILE_START_ITERATION=0\nPROFILE_START_ITERATION_ROUNDUP=50"
        "\nACTIVITIES_ITERATIONS=10\nPROFILE_REPORT_INPUT_SHAPES=true\nPROFILE_WITH_STACK=true"
        "\nPROFILE_WITH_FLOPS=true\nPROFILE_WITH_MODULES=true"
    )  # fmt: skip


def test_memory_config_and_refusals():
    text = build_config(log_file="/t/a.json", duration_ms=800, profile_memory=True, profile_start_time_ms=123)
    assert text == (
        "ACTIVITIES_LOG_FILE=/t/a.json\nPROFILE_START_TIME=123\nACTIVITIES_DURATION_MSECS=800"
        "\nPROFILE_REPORT_INPUT_SHAPES=false\nPROFILE_PROFILE_MEMORY=true\nPROFILE_MEMORY=true"
        "\nPROFILE_MEMORY_DURATION_MSECS=800\nPROFILE_WITH_STACK=false\nPROFILE_WITH_FLOPS=false"
        "\nPROFILE_WITH_MODULES=false"
    )
    with pytest.raises(ValueError):
        build_config(log_file="/t/a.json", iterations=3, profile_memory=True)
    for bad in ("/t/a\n.json", "/t/#a.json", "/t/a=b.json", ""):
        with pytest.raises(ValueError):
            build_config(log_file=bad)
    assert build_config(log_file=None).startswith("PROFILE_START_TIME=0\n")


def test_wrap_matches_dynolog():
    assert wrap_with_trace_id("A=1\nB=2", "42") == "\n    A=1\nB=2\n    REQUEST_TRACE_ID=42"


def test_options_parsed_like_kineto():
    text = "\n    A = 1 # c\n#X=2\n  ACTIVITIES_LOG_FILE=/a.json\nB=1=2\n\t\nactivities_log_file=/low"
    assert list(iter_options(text)) == [
        ("A", "1", True),
        ("ACTIVITIES_LOG_FILE", "/a.json", True),
        ("B", "1=2", False),
        ("activities_log_file", "/low", True),
    ]
    assert option_values(text, "ACTIVITIES_LOG_FILE") == ["/a.json"]


@pytest.mark.parametrize(
    "log_file, expected",
    [
        ("/tmp/x/trace.json", "/tmp/x/trace_7.json"),
        ("/d/my.pt.trace.json", "/d/my_7.pt.trace.json"),
        ("/d/a.json.b.json", "/d/a_7.json.b.json"),
        ("/d/noext.trace", "/d/noext.trace"),
        ("/d/rank-3.pt.trace.json", "/d/rank-3_7.pt.trace.json"),
    ],
)
def test_kineto_output_path(log_file, expected):
    assert kineto_output_path(log_file, 7) == expected


def test_trace_id_rule():
    assert valid_trace_id("kst-20261121-053012-3f9a")
    for bad in ("", "a/b", "a b", "x" * 129, None, 5, "../x", "a_b"):
        assert not valid_trace_id(bad)


# ------------------------------------------------------------------------ wire properties
@given(st.binary(max_size=400))
@settings(max_examples=300, deadline=None)
def test_datagram_parsers_only_raise_frame_error(data):
    try:
        msg_type, payload = wire.unpack_datagram(data)
    except wire.FrameError:
        return
    for parse in (wire.parse_request, wire.parse_context):
        try:
            parse(payload)
        except wire.FrameError:
            pass


@given(
    st.integers(-(2**31), 2**31 - 1),
    st.integers(-(2**63), 2**63 - 1),
    st.lists(st.integers(-(2**31), 2**31 - 1), min_size=0, max_size=wire.MAX_PIDS),
)
def test_request_roundtrip(config_type, job_id, pids):
    msg_type, payload = wire.unpack_datagram(wire.pack_request(config_type, job_id, pids))
    assert msg_type == b"req"
    req = wire.parse_request(payload)
    assert (req.config_type, req.job_id, list(req.pids)) == (config_type, job_id, pids)


def test_captured_req_datagram_parses():
    raw = bytes.fromhex(
        "2800000000000000726571000000000000000000000000000000000000000000"
        "000000000000000003000000060000009210000000000000ba640000b8640000"
        "b2640000b1640000890a0000880a0000"
    )
    msg_type, payload = wire.unpack_datagram(raw)
    req = wire.parse_request(payload)
    assert (msg_type, req.config_type, req.job_id, req.pids) == (
        b"req", 3, 4242, (25786, 25784, 25778, 25777, 2697, 2696),
    )  # fmt: skip
    assert wire.pack_request(3, 4242, list(req.pids)) == raw


# ------------------------------------------------------------------------ /proc parsing
def test_parse_stat_with_hostile_comm():
    data = b"123 (a) b (c)) S 45 1 1 0 -1 4194560 1 0 0 0 0 0 0 0 20 0 1 0 98765 0 0"
    assert parse_stat(data) == ("S", 45, 98765)


def test_parse_environ():
    env = b"RANK=3\0LOCAL_RANK=x\0MASTER_ADDR=h\0OTHER=1\0broken\0SLURM_JOB_ID=12_3\0"
    assert parse_environ(env) == {"rank": 3, "local_rank": None, "master_addr": "h", "slurm_job_id": "12_3"}


# ------------------------------------------------------------------------ paths and files
def test_confine_and_ensure_dir(tmp_path):
    root = str(tmp_path / "root")
    os.makedirs(root)
    assert confine(f"{root}/a//b/./c.json", root) == f"{root}/a/b/c.json"
    for bad in (f"{root}/../x", "rel", f"{root}x/a", "/etc/passwd", f"{root}/a\nb", 5, ""):
        with pytest.raises(PathRefused):
            confine(bad, root)
    created = ensure_dir(f"{root}/a/b", {os.geteuid()})
    assert created == [f"{root}/a", f"{root}/a/b"]
    assert ensure_dir(f"{root}/a/b") == []
    ensure_dir(f"{root}/shared", {None})  # unknown writer: world-writable, sticky
    assert os.stat(f"{root}/shared").st_mode & 0o7777 == 0o1777


def test_file_status(tmp_path, monkeypatch):
    p = tmp_path / "t_1.json"
    assert file_status(str(p)) == {
        "exists": False,
        "bytes": None,
        "complete": False,
        "writing": False,
        "reason": None,
    }
    (tmp_path / "t_1.json.tmp").write_text("{")
    assert file_status(str(p))["writing"] is True
    p.write_text('{"traceEvents": [')
    assert file_status(str(p))["complete"] is False
    p.write_text('{"traceEvents": []}\n')
    assert file_status(str(p)) == {
        "exists": True,
        "bytes": 20,
        "complete": True,
        "writing": False,
        "reason": None,
    }
    import kinetoscope.protocol.tracefile as tracefile

    monkeypatch.setattr(tracefile, "SYNTAX_CHECK_LIMIT", 4)  # large-file path: check both ends
    big = tmp_path / "big_1.json"
    big.write_text('{"traceEvents": [' + "1," * 5000 + "1]}\n")
    assert file_status(str(big))["complete"] is True
    big.write_text('{"traceEvents": [' + "1," * 5000)
    assert file_status(str(big))["complete"] is False


def test_rate_limited_logger(caplog):
    import logging

    rl = RateLimitedLogger(logging.getLogger("kinetoscope.test.rl"), burst=2, interval_s=3600)
    with caplog.at_level(logging.WARNING, logger="kinetoscope.test.rl"):
        for i in range(10):
            rl.warning("k", "bad %d", i)
    assert [r.getMessage() for r in caplog.records] == ["bad 0", "bad 1"]
    rl._window["k"] = (time.monotonic() - 7200, 2, 8)  # window expired with 8 suppressed
    with caplog.at_level(logging.WARNING, logger="kinetoscope.test.rl"):
        rl.warning("k", "bad again")
    assert caplog.records[-1].getMessage() == "bad again (8 similar messages suppressed)"


def test_struct_sizes_match_spec():
    assert wire.METADATA.size == 40 and wire.REQ_HEADER.size == 16 and struct.calcsize("=iiq") == 16


# ------------------------------------------------------------------------ metrics
def test_gpu_metrics_from_nvml(monkeypatch):
    """NVML itself needs a GPU; this checks the sampler's use of its API with a stand-in."""
    import sys
    import types

    from kinetoscope.daemon.metrics import HostSampler

    nv = types.ModuleType("pynvml")
    nv.NVML_TEMPERATURE_GPU, nv.NVML_CLOCK_SM = 0, 1
    nv.nvmlInit = lambda: None
    nv.nvmlShutdown = lambda: None
    nv.nvmlDeviceGetCount = lambda: 2
    nv.nvmlDeviceGetHandleByIndex = lambda i: i
    nv.nvmlDeviceGetUUID = lambda h: f"GPU-{h}"
    nv.nvmlDeviceGetName = lambda h: b"NVIDIA H100"
    nv.nvmlDeviceGetUtilizationRates = lambda h: types.SimpleNamespace(gpu=90 + h, memory=40)
    nv.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(used=1 << 30, total=80 << 30)
    nv.nvmlDeviceGetPowerUsage = lambda h: 350_000
    nv.nvmlDeviceGetTemperature = lambda h, kind: 60

    def no_clock(h, kind):
        raise RuntimeError("not supported")

    nv.nvmlDeviceGetClockInfo = no_clock
    monkeypatch.setitem(sys.modules, "pynvml", nv)
    sampler = HostSampler(interval_s=3600, hostname="h", enable_gpu=True)
    sampler.start()
    try:
        metrics = {m.name: m for m in sampler.collect()}
    finally:
        sampler.stop()
    util = metrics["kscope_gpu_utilization_percent"].samples
    assert [(s.labels["gpu"], s.labels["name"], s.value) for s in util] == [
        ("0", "NVIDIA H100", 90.0),
        ("1", "NVIDIA H100", 91.0),
    ]
    assert metrics["kscope_gpu_power_watts"].samples[0].value == 350.0
    assert metrics["kscope_gpu_sm_clock_mhz"].samples == []  # unsupported field: skipped, not fatal
    assert "kscope_host_cpu_utilization_percent" in metrics and "kscope_host_network_receive_bytes" in metrics


def test_no_nvml_means_no_gpu_metrics(monkeypatch):
    import sys

    from kinetoscope.daemon.metrics import HostSampler

    monkeypatch.setitem(sys.modules, "pynvml", None)  # import fails
    sampler = HostSampler(interval_s=3600, hostname="h")
    sampler.start()
    try:
        names = {m.name for m in sampler.collect()}
    finally:
        sampler.stop()
    assert not any(n.startswith("kscope_gpu_") for n in names)
    assert "kscope_host_memory_available_bytes" in names
