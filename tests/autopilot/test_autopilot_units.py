"""Policy files, --where filters, job keys and the summary figures: bad input is one clear line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kinetoscope.autopilot.discovery import group_jobs, job_key
from kinetoscope.autopilot.fleetview import parse_where
from kinetoscope.autopilot.policy import Policy, load_policy
from kinetoscope.autopilot.summary import summarize
from kinetoscope.collect.client import read_hosts_file
from kinetoscope.errors import UsageError
from kinetoscope.protocol import rpc

DLRM = Path("/work/shared/traces/param_dlrm8")


def test_defaults_without_a_file() -> None:
    assert load_policy(None) == Policy()


def test_policy_file_overrides_and_alerts(tmp_path: Path) -> None:
    p = tmp_path / "p.toml"
    p.write_text(
        'interval_s = 600\n[autopilot]\nmax_in_flight = 3\n[alerts]\nwebhook = "http://h/x"\nmfu_below = 0.2\n'
    )
    pol = load_policy(p)
    assert (pol.interval_s, pol.max_in_flight, pol.alerts.webhook, pol.alerts.mfu_below) == (
        600.0,
        3,
        "http://h/x",
        0.2,
    )
    assert pol.warmup_s == Policy().warmup_s


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("intervall_s = 3\n", "unknown key 'intervall_s'"),
        ("interval_s = 'soon'\n", "interval_s must be a non-negative number"),
        ("iterations = 0\n", "must be at least 1"),
        ("[alerts]\nwebhook = 'ftp://x'\n", "alerts.webhook must be an http"),
        ("[alerts]\nbogus = 1\n", "unknown key 'alerts.bogus'"),
        ("interval_s = \n", "not valid TOML"),
    ],
)
def test_bad_policy_is_one_line_naming_file_and_key(tmp_path: Path, text: str, message: str) -> None:
    p = tmp_path / "p.toml"
    p.write_text(text)
    with pytest.raises(UsageError, match=message) as info:
        load_policy(p)
    assert str(p) in str(info.value) and "\n" not in str(info.value)


def test_missing_policy_file(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="cannot read policy"):
        load_policy(tmp_path / "nope.toml")


def test_where_clauses() -> None:
    assert [(k, v) for k, _op, v in parse_where("gpu_util < 30 and lost >= 0.1")] == [
        ("gpu_busy_pct", 30.0),
        ("lost_fraction", 0.1),
    ]
    for bad in ("gpu_util < thirty", "colour == 3", "gpu_util ~ 3"):
        with pytest.raises(UsageError, match="--where"):
            parse_where(bad)


def test_hosts_file(tmp_path: Path) -> None:
    p = tmp_path / "hosts"
    p.write_text("# fleet\nnode1\nnode2:1779  # rack 2\n\n[::1]:1780\n")
    assert read_hosts_file(str(p)) == ["node1:1778", "node2:1779", "[::1]:1780"]
    p.write_text("node1:99999\n")
    with pytest.raises(UsageError, match="line 1"):
        read_hosts_file(str(p))


def test_job_keys_group_ranks_across_hosts_and_keep_single_processes_apart() -> None:
    def proc(pid: int, rank: int | None = None, **kw: object) -> rpc.ProcessInfo:
        fields = {"pid": pid, "job_id": "0", "rank": rank, "registered_s_ago": 5.0, "alive": True, **kw}
        return rpc.decode_response(fields, rpc.ProcessInfo)  # as the client decodes a listing

    ddp = {"world_size": 2, "master_addr": "n1", "master_port": 29500, "torchelastic_run_id": "r"}
    listings = {
        "n1:1778": ("n1", [proc(10, 0, **ddp), proc(11), proc(12, is_launcher=True), proc(13, alive=False)]),
        "n2:1778": ("n2", [proc(10, 1, **ddp), proc(11, slurm_job_id="77_1", autopilot="OFF")]),
    }
    jobs = {j.job_key: j for j in group_jobs(listings, ("off",), 8)}
    assert set(jobs) == {"torch:n1:29500:r", "proc:n1:11", "slurm:77_1"}
    assert jobs["torch:n1:29500:r"].hosts == ["n1:1778", "n2:1778"] and jobs["torch:n1:29500:r"].devices == 16
    assert jobs["slurm:77_1"].opted_out and not jobs["proc:n1:11"].opted_out
    assert job_key(proc(5), "h") == "proc:h:5"


@pytest.mark.skipif(not DLRM.is_dir(), reason="shared DLRM traces not present")
def test_summary_of_a_real_8_rank_analysis(tmp_path: Path) -> None:
    from kinetoscope.orchestration import analyze_paths

    doc = analyze_paths(sorted(DLRM.glob("*.json")))
    s = summarize(json.loads(json.dumps(doc, default=str)), devices=8, interval_s=3600)
    assert s["straggler_kind"] == "persistent" and s["straggler_ranks"] == [7]
    assert 0 < s["gpu_busy_pct"] < 100 and s["lost_fraction"] and s["lost_fraction"] > 0
    idle = [r["idle_time_pctg"] for r in doc["temporal_breakdown"]]
    assert s["wasted_gpu_s"] == pytest.approx(sum(idle) / len(idle) / 100 * 8 * 3600, rel=1e-3)
    assert s["top_recommendation"] == doc["recommendations"][0]["id"]
    assert s["launch_bound_pct"] is not None and s["exposed_comm_pct"] is not None


def test_summary_without_gpu_kernels_leaves_waste_unknown() -> None:
    s = summarize({"traces": [], "recommendations": []}, devices=1, interval_s=60)
    assert s["gpu_busy_pct"] is None and s["wasted_gpu_s"] is None and s["launch_bound_pct"] is None


def test_the_daemon_reads_the_opt_out_from_the_environment() -> None:
    from kinetoscope.daemon.procinfo import parse_environ

    assert parse_environ(b"RANK=1\0KSCOPE_AUTOPILOT=off\0PATH=/bin\0") == {"rank": 1, "autopilot": "off"}
    assert "autopilot" not in parse_environ(b"RANK=1\0")
