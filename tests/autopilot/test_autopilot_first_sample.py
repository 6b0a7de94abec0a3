"""A new user's first `kscope autopilot --once`, for real: a `kscope daemon` and a tiny CPU
PyTorch job started a few seconds before. With the default policy the cycle traces nothing, exits
0 and says in one line when the job will first be traced; with `warmup_s = 0` in `--policy` the
same catalog (the job already known) gets a recorded sample, with usable evidence."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from kinetoscope.store.catalog import Catalog
from kinetoscope.store.fleet import FleetStore
from tests.autopilot.conftest import TINY, run_kscope

pytestmark = [pytest.mark.slow, pytest.mark.torch]


@pytest.fixture()
def fresh_job(tmp_path: Path) -> Iterator[tuple[str, int, float]]:
    """(daemon address, job pid, monotonic time the job was started)."""
    pytest.importorskip("torch")
    from kinetoscope.demo.local import LocalDaemon, TrainingJob

    daemon = LocalDaemon(tmp_path / "host")
    job = None
    try:
        daemon.start(timeout=60)
        started = time.monotonic()
        job = TrainingJob(
            tmp_path / "job",
            ranks=1,
            torchrun=False,
            steps=0,
            model="tiny",
            max_seconds=600,
            env=daemon.kineto_env(),
            name="fresh",
            extra_args=["--step-sleep-ms", "20", *TINY],
        ).start()
        daemon.wait_for_processes(1, timeout=180)
        yield str(daemon.address), job.pid, started
    finally:
        if job is not None:
            job.stop()
        daemon.stop()


def test_first_once_says_when_then_warmup_zero_records_a_sample(
    fresh_job: tuple[str, int, float], tmp_path: Path
) -> None:
    address, pid, started = fresh_job
    url = str(tmp_path / "catalog.db")
    res = run_kscope("autopilot", "--host", address, "--catalog", url, "--once", timeout=300)
    age = time.monotonic() - started
    assert res.returncode == 0, res.stderr[-3000:]
    lines = res.stdout.strip().splitlines()
    about = [ln for ln in lines if ": first due " in ln]
    assert len(about) == 1, res.stdout
    m = re.fullmatch(r"(\S+): first due \d\d:\d\d:\d\d UTC, in ([\d.]+) (s|min) \(warmup_s=300\)", about[0])
    assert m, about
    with Catalog.open(url) as cat:
        (job,) = FleetStore(cat).jobs()
    assert job["job_key"] == m.group(1) and any(r["pid"] == pid for r in job["ranks"]), (job, about)
    wait_s = float(m.group(2)) * (60 if m.group(3) == "min" else 1)
    assert 300 - age - 60 <= wait_s <= 300, (wait_s, age)  # counted from the job's registration
    assert lines[-1].startswith("autopilot cycle: 1/1 daemons answered, 1 jobs, 0 samples started")

    policy = tmp_path / "policy.toml"
    policy.write_text("warmup_s = 0\n", encoding="utf-8")
    res = run_kscope(
        "autopilot", "--host", address, "--catalog", url, "--policy", str(policy), "--once", timeout=600
    )
    assert res.returncode == 0, res.stderr[-3000:]
    assert "1 samples started" in res.stdout and "finished: 1 recorded" in res.stdout, res.stdout
    with Catalog.open(url) as cat:
        samples = FleetStore(cat).samples()
        assert [(s.state, s.reason) for s in samples] == [("recorded", None)]
        ev = samples[0].summary["evidence"]
        assert ev["usable"] is True and ev["steps_in_common"] >= 3 and ev["timestamp_anomalies"] == 0
        assert cat.latest_analysis(samples[0].sample_id) is not None
    listed = run_kscope("jobs", "--catalog", url, "--json")
    assert listed.returncode == 0, listed.stderr
    import json

    (row,) = json.loads(listed.stdout)["jobs"]
    assert (row["state"], row["samples_recorded"], row["samples_total"], row["traces"]) == (
        "running",
        1,
        1,
        1,
    )
