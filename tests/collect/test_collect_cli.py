"""`kscope trace` argument validation and failure messages (in-process for speed, plus the real
CLI as a subprocess for exit codes)."""

from __future__ import annotations

import orjson
import pytest

from kinetoscope.collect.trigger import parse_job_id, parse_pids
from kinetoscope.errors import UsageError


@pytest.mark.parametrize(
    "args, message",
    [
        (["--duration-ms", "500"], "exactly one of --job-id ID, --pids P[,P...] or --all"),
        (["--all", "--job-id", "3", "--duration-ms", "500"], "exactly one of --job-id"),
        (["--all"], "either --duration-ms N or --iterations N"),
        (["--all", "--duration-ms", "5", "--iterations", "5"], "either --duration-ms N or --iterations N"),
        (["--all", "--iterations", "5", "--profile-memory"], "--profile-memory needs --duration-ms"),
        (["--all", "--duration-ms", "5", "--iteration-roundup", "2"], "--iteration-roundup only applies"),
        (["--all", "--duration-ms", "5", "--timeout", "3"], "--timeout only applies with --wait"),
        (["--all", "--duration-ms", "5", "--wait", "--timeout", "0"], "--timeout must be positive"),
        (["--pids", "12,abc", "--duration-ms", "5"], "'abc' is not a process id"),
        (["--job-id", "abc", "--duration-ms", "5"], "must start with a number"),
        (["--all", "--duration-ms", "5", "--host", "node:99999"], "port must be a number from 1 to 65535"),
        (["--all", "--duration-ms", "5", "--trace-id", "../x"], "trace id '../x'"),
        (["--all", "--duration-ms", "5", "--process-limit", "0"], "--process-limit must be at least 1"),
    ],
)
def test_usage_errors(kscope_main, args, message):
    code, _out, err = kscope_main("trace", *args)
    assert code == 2
    assert message in " ".join(err.split())
    assert "Traceback" not in err


def test_slurm_array_job_id():
    assert parse_job_id("36199_0")[0] == 36199
    assert "Slurm array task" in parse_job_id("36199_0")[1]
    assert parse_job_id("36199_[1-3]")[0] == 36199
    assert parse_job_id(" 42 ") == (42, None)
    with pytest.raises(UsageError):
        parse_job_id("-4")


def test_parse_pids():
    assert parse_pids("3, 4,3") == (3, 4)
    with pytest.raises(UsageError):
        parse_pids(",")


def test_unreachable_host_exit_1_names_host(kscope_main, free_port):
    code, out, err = kscope_main(
        "trace", "--host", f"127.0.0.1:{free_port}", "--all", "--duration-ms", "500", "--json"
    )
    assert code == 1
    doc = orjson.loads(out)
    assert doc["matched"] == [] and doc["files"] == []
    assert doc["errors"][0]["kind"] == "unreachable"
    assert doc["errors"][0]["host"] == f"127.0.0.1:{free_port}"
    assert f"daemon 127.0.0.1:{free_port}: connection refused" in " ".join(err.split())


def test_array_job_note_and_no_match(kscope_main, rpc_server):
    srv = rpc_server(
        {
            "kscopeTrace": lambda r: {
                "hostname": "n1",
                "trace_id": r["trace_id"],
                "matched": [],
                "registered": "job 0 (3 processes)",
                "output_dir": "/tmp/x",
            }
        }
    )
    code, _out, err = kscope_main("trace", "-H", srv.address, "--job-id", "36199_0", "--iterations", "3")
    flat = " ".join(err.split())
    assert code == 1
    (req,) = [r for r in srv.requests if r["fn"] == "kscopeTrace"]  # after a listing (alignment)
    assert req["job_id"] == 36199
    assert "looks like a Slurm array task" in flat
    assert (
        "no process on host n1" in flat
        and "has job id 36199 (from '36199_0'); registered: job 0 (3 processes)" in flat
    )


def test_real_cli_subprocess_exit_codes(run_kscope, free_port):
    r = run_kscope("trace", "--host", f"127.0.0.1:{free_port}", "--pids", "1", "--duration-ms", "100")
    assert r.returncode == 1, r.stderr
    assert "connection refused" in r.stderr and "Traceback" not in r.stderr
    r = run_kscope("trace", "--pids", "1")
    assert r.returncode == 2 and "either --duration-ms N or --iterations N" in r.stderr


def test_cli_flags_reach_the_daemon(kscope_main, rpc_server, tmp_path, monkeypatch):
    srv = rpc_server(
        {
            "kscopeTrace": lambda r: {
                "hostname": "n1",
                "trace_id": r["trace_id"],
                "matched": [],
                "registered": "nothing",
                "output_dir": str(tmp_path),
            }
        }
    )
    monkeypatch.chdir(tmp_path)
    code, out, err = kscope_main(
        "trace",
        "-H",
        srv.address,
        "--pids",
        "12,13",
        "--duration-ms",
        "1500",
        "--record-shapes",
        "--profile-memory",
        "--with-stacks",
        "--with-flops",
        "--with-modules",
        "--process-limit",
        "4",
        "--include-launchers",
        "--output-dir",
        "rel",
        "--trace-id",
        "my-trace-1",
        "--token",
        "tok",
    )
    assert code == 1  # nothing matched
    (req,) = srv.requests
    assert req == {
        "fn": "kscopeTrace",
        "trace_id": "my-trace-1",
        "pids": [12, 13],
        "duration_ms": 1500,
        "record_shapes": True,
        "profile_memory": True,
        "with_stack": True,
        "with_flops": True,
        "with_modules": True,
        "process_limit": 4,
        "include_launchers": True,
        "output_dir": str(tmp_path / "rel"),
        "token": "tok",
    }


def test_align_options_are_validated(kscope_main):
    code, _out, err = kscope_main(
        "trace", "--job-id", "7", "--iterations", "3", "--no-align", "--iteration-roundup", "10"
    )
    assert code == 2 and "--no-align and --iteration-roundup contradict each other" in err
    code, _out, err = kscope_main("trace", "--job-id", "7", "--duration-ms", "300", "--no-align")
    assert code == 2 and "--no-align only applies to --iterations" in err


def test_alignment_uses_the_job_step_rate_the_catalog_knows(kscope_main, rpc_server, tmp_path):
    from kinetoscope.store.catalog import Catalog
    from tests.collect.test_collect_trigger import _listed, fake_daemon

    db = tmp_path / "rate.db"
    with Catalog.open(str(db)) as cat:  # an earlier trace of job 7, analysed: 1 step per second
        cat.record_trace_request(
            {
                "kinetoscope_manifest": 1,
                "trace_id": "kst-old",
                "files": [{"file": "rank-0_5.pt.trace.json", "rank": 0, "job_id": "7"}],
            }
        )
        cat.record_analysis(["kst-old"], {"summary": {"step_time_ms": 1000.0}}, trace_id="kst-old")
    procs = [{"pid": 11, "rank": 0, "job_id": "7"}, {"pid": 12, "rank": 1, "job_id": "7"}]
    srv = fake_daemon(rpc_server, "node-a", tmp_path, procs, listing=[_listed(11), _listed(12)])
    code, out, err = kscope_main(
        "trace", "-H", srv.address, "--job-id", "7", "--iterations", "3", "--catalog", str(db), "--json"
    )
    assert code == 0, err
    (req,) = [r for r in srv.requests if r["fn"] == "kscopeTrace"]
    assert (
        req["iteration_roundup"] == 20
    )  # 10 x 1 step/s x (1 s poll + 0.5 s), not the assumed 10 steps/s's 200
    notes = orjson.loads(out)["notes"]
    assert "job 7 steps at 1 steps/s (catalog: analysis of kst-old)" in notes
    assert any("from their 1 s poll interval and the job's 1 steps/s" in n for n in notes), notes
