"""The targets of issue 29 on real gloo jobs (tests/stacks/hung_job.py under torchrun) registered
with a real daemon: a 4-rank job whose rank 2 blocks in ``stuck_here`` (kscope stacks names it
alone; its Flight Recorder dumps name it; the autopilot finds the hang and alerts; the web job
page takes stacks), an 8-rank barrier deadlock, and a busy healthy job (one group, progressing).

Slow (each job needs torch started on every rank of a loaded 2-core machine): marked ``slow``."""

from __future__ import annotations

import json
import signal
import threading
from collections.abc import Iterator
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from tests.stacks.conftest import HungJob, kscope, start_job

pytestmark = [pytest.mark.slow, pytest.mark.torch]


@pytest.fixture(scope="module")
def hung4(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, HungJob]]:
    pytest.importorskip("torch")
    from kinetoscope.demo.local import LocalDaemon

    work = tmp_path_factory.mktemp("hung4")
    d = LocalDaemon(work / "daemon").start(timeout=60)
    job = start_job(d, work / "job", ranks=4, mode="stuck", job_id="4242", extra=["--stuck-step", "30"])
    try:
        d.wait_for_processes(4, job_id=4242, timeout=300, alive=job.process.alive)
        job.wait_until_hung(29)
        yield d, job
    finally:
        job.stop()
        d.stop()


def _stacks_json(address: object, *args: str) -> dict[str, Any]:
    res = kscope("stacks", "--host", str(address), *args, "--json")
    assert res.returncode == 0, res.stderr[-3000:]
    doc: dict[str, Any] = json.loads(res.stdout)
    return doc


def test_kscope_stacks_names_rank_2_alone(hung4: tuple[Any, HungJob]) -> None:
    d, _job = hung4
    doc = _stacks_json(d.address, "--job-id", "4242")
    assert doc["schema"] == "kscope.stacks/1" and len(doc["ranks"]) == 4
    first, second = doc["groups"]
    assert first["ranks"] == [2] and first["outlier"]
    assert "stuck_here" in first["summary"] and any("stuck_here" in s for s in first["shape"])
    assert second["ranks"] == [0, 1, 3] and not second["outlier"]
    assert "all_reduce" in second["summary"]
    assert doc["outliers"] == [2]
    raw = doc["ranks"][2]["snapshots"][0]
    assert raw["rank"] == 2 and raw["threads"] and raw["pause_ms"] is not None

    text = kscope("stacks", "--host", str(d.address), "--job-id", "4242")
    assert text.returncode == 0, text.stderr
    lines = text.stdout.splitlines()
    assert lines[1].startswith("rank 2 — stuck_here (hung_job.py:"), text.stdout
    assert lines[2].startswith("3 ranks (0-1,3) — all_reduce (distributed_c10d.py:"), text.stdout
    assert "outlier: rank 2" in text.stdout


def test_samples_say_every_rank_is_stuck(hung4: tuple[Any, HungJob]) -> None:
    d, _job = hung4
    doc = _stacks_json(d.address, "--job-id", "4242", "--samples", "2", "--interval", "0.5")
    assert doc["states"] == {"stuck": 4}
    assert doc["outliers"] == [2]


def test_flight_recorder_names_rank_2(hung4: tuple[Any, HungJob]) -> None:
    from tests.autopilot.conftest import wait_until

    _d, job = hung4
    wait_until(
        lambda: len(list(job.fr_dir.glob("fr_trace_rank_*.json"))) == 4, 120, "4 Flight Recorder dumps"
    )
    res = kscope("analyze", "--flight-recorder", str(job.fr_dir), "--json")
    assert res.returncode == 0, res.stderr[-3000:]
    fr = json.loads(res.stdout)["flight_recorder"]
    assert fr["ranks"] == [0, 1, 2, 3] and fr["culprits"] == [2]
    [group] = fr["groups"]
    assert group["waiting"] == [0, 1, 3] and "all_reduce" in group["collective"]
    [missing] = group["never_entered"]
    assert missing["rank"] == 2 and missing["last_seq"] == group["seq"] - 1
    text = kscope("analyze", "--flight-recorder", str(job.fr_dir))
    assert text.returncode == 0 and "rank 2 never entered it" in text.stdout, text.stdout + text.stderr


class _Hook(BaseHTTPRequestHandler):
    bodies: list[dict[str, Any]] = []

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        type(self).bodies.append(json.loads(body))
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


def test_autopilot_finds_the_hang_and_alerts_naming_rank_2(
    hung4: tuple[Any, HungJob], tmp_path: Path
) -> None:
    from kinetoscope.store.catalog import Catalog
    from kinetoscope.store.stacks_store import latest_stacks
    from tests.autopilot.conftest import popen_kscope, wait_until

    d, _job = hung4
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Hook)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    _Hook.bodies = []
    policy = tmp_path / "policy.toml"
    policy.write_text(
        "[autopilot]\nwarmup_s = 3600\nsweep_interval_s = 3\nrpc_timeout_s = 20\n"
        "[hang]\nfor_s = 1\nsamples = 2\ninterval_s = 0.5\n"
        f'[alerts]\nwebhook = "http://127.0.0.1:{server.server_address[1]}/hook"\n',
        encoding="utf-8",
    )
    url = str(tmp_path / "catalog.db")
    log = tmp_path / "autopilot.log"
    proc = popen_kscope(
        "autopilot", "--host", str(d.address), "--catalog", url, "--policy", str(policy), log=log
    )
    try:
        wait_until(lambda: any(b["kind"] == "hang" for b in _Hook.bodies), 300, "a hang alert")
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
        server.shutdown()
    alert = next(b for b in _Hook.bodies if b["kind"] == "hang")
    assert alert["outlier_ranks"] == [2] and alert["job_key"] == "slurm:4242"
    assert alert["stacks_id"] == alert["sample_id"]
    assert any(g["ranks"] == [2] and "stuck_here" in g["summary"] for g in alert["groups"])
    with Catalog.open(url) as cat:
        [row] = latest_stacks(cat, job_key="slurm:4242")
    assert row["trigger"] == "hang:cpu_idle" and row["outliers"] == [2] and row["ranks"] == 4
    assert row["states"] == {"stuck": 4}
    # found within two sweeps: the first records each rank's CPU time, the second judges
    text = log.read_text(errors="replace")
    hung_at = text.index("is hung")
    assert text[:hung_at].count("cycle done") <= 1, text[-3000:]


def test_web_job_page_takes_stacks_now(hung4: tuple[Any, HungJob], tmp_path: Path) -> None:
    from fastapi.testclient import TestClient

    from kinetoscope.store.catalog import Catalog
    from kinetoscope.store.models import jobs
    from kinetoscope.web import WebSettings, create_app

    d, _job = hung4
    url = str(tmp_path / "web.db")
    with Catalog.open(url) as cat, cat.engine.begin() as conn:  # the job as a trace of it records it
        now = datetime.now(timezone.utc)
        conn.execute(
            jobs.insert().values(job_id="4242", hosts=["h"], world_size=4, first_seen=now, last_seen=now)
        )
    settings = WebSettings(catalog_url=url, daemons=[str(d.address)])
    with TestClient(create_app(settings)) as client:
        page = client.get("/jobs/4242")
        assert (
            page.status_code == 200
            and "No stacks taken yet" in page.text
            and 'id="stacks-button"' in page.text
        )
        res = client.post("/jobs/4242/stacks", follow_redirects=False)
        assert res.status_code == 303, res.text
        latest = client.get("/api/jobs/4242/stacks").json()["stacks"][0]
        assert latest["trigger"] == "web" and latest["outliers"] == [2]
        assert latest["document"]["groups"][0]["ranks"] == [2]
        page = client.get("/jobs/4242")
        assert "outlier: rank 2" in page.text and "stuck_here" in page.text


def test_autopilot_trace_that_times_out_takes_stacks(hung4: tuple[Any, HungJob], tmp_path: Path) -> None:
    """The other signal: an automatic trace of the hung job never gets its steps and times out;
    the sample fails and the hang check runs (the CPU signal is held off by a long ``for_s``)."""
    from kinetoscope.store.catalog import Catalog
    from kinetoscope.store.fleet import FleetStore
    from kinetoscope.store.stacks_store import latest_stacks
    from tests.autopilot.conftest import run_kscope

    d, _job = hung4
    policy = tmp_path / "policy.toml"
    policy.write_text(
        "[autopilot]\nwarmup_s = 0\nmin_age_s = 0\niterations = 2\ntrace_timeout_s = 20\nrpc_timeout_s = 20\n"
        "[hang]\nfor_s = 36000\nsamples = 2\ninterval_s = 0.5\n",
        encoding="utf-8",
    )
    url = str(tmp_path / "catalog.db")
    res = run_kscope(
        "autopilot",
        "--host",
        str(d.address),
        "--catalog",
        url,
        "--policy",
        str(policy),
        "--once",
        timeout=600,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    with Catalog.open(url) as cat:
        [sample] = FleetStore(cat).samples("slurm:4242")
        [row] = latest_stacks(cat, job_key="slurm:4242")
    assert sample.state == "failed" and sample.reason in ("timeout", "stalled")
    assert row["trigger"] == "hang:trace_timeout" and row["outliers"] == [2]


def test_eight_rank_barrier_deadlock_names_the_pair(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    from kinetoscope.demo.local import LocalDaemon

    d = LocalDaemon(tmp_path / "daemon").start(timeout=60)
    job = start_job(d, tmp_path / "job", ranks=8, mode="barrier", job_id="88", extra=["--stuck-step", "20"])
    try:
        d.wait_for_processes(8, job_id=88, timeout=600, alive=job.process.alive)
        job.wait_until_hung(19, timeout=600)
        doc = _stacks_json(d.address, "--job-id", "88")
        first, second = doc["groups"]
        assert first["ranks"] == [3, 5] and first["outlier"] and "barrier" in first["summary"]
        assert second["ranks"] == [0, 1, 2, 4, 6, 7] and "all_reduce" in second["summary"]
        assert doc["outliers"] == [3, 5]
    finally:
        job.stop()
        d.stop()


def test_busy_healthy_job_is_one_group_and_progressing(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    from kinetoscope.demo.local import LocalDaemon

    d = LocalDaemon(tmp_path / "daemon").start(timeout=60)
    job = start_job(d, tmp_path / "job", ranks=4, mode="healthy", job_id="99")
    try:
        d.wait_for_processes(4, job_id=99, timeout=300, alive=job.process.alive)
        job.wait_for_steps(20)
        doc = _stacks_json(d.address, "--job-id", "99", "--samples", "3")
        assert doc["states"] == {"progressing": 4}, doc["verdict"]
        [group] = doc["groups"]
        assert group["ranks"] == [0, 1, 2, 3] and not group["outlier"] and doc["outliers"] == []
        assert "every rank is progressing" in doc["verdict"]
    finally:
        job.stop()
        d.stop()
