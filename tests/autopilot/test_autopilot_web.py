"""The Fleet page of `kscope serve`: a real server subprocess over a catalog the autopilot's store
filled, opened in Debian's chromium (Playwright): the ranking matches the catalog, filters work,
each job has its trend chart and links to its latest sample's report and trace page."""

from __future__ import annotations

import re
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from kinetoscope.autopilot.fleetview import fleet_rows
from kinetoscope.store.catalog import Catalog
from kinetoscope.store.fleet import FleetStore, SeenJob

READY = re.compile(r"kscope serve ready: (http://127\.0\.0\.1:\d+)/")
# job -> GPU busy % of its recorded samples (oldest first); devices 8, interval 1 h
JOBS = {"torch:a:1:r": [20.0, 25.0, 10.0], "torch:b:1:r": [90.0, 85.0], "proc:c:7": [50.0], "proc:d:9": []}


def seed(url: str) -> None:
    with Catalog.open(url) as cat:
        store = FleetStore(cat)
        store.upsert_jobs(
            [
                SeenJob(
                    job_key=k,
                    job_id="0",
                    cmdline=f"python train.py --job {k}",
                    hosts=[f"{k.split(':')[1]}:1778"],
                    ranks=[{"host": "h:1778", "pid": 1, "rank": 0}],
                    world_size=8,
                    devices=8,
                    opted_out=k == "proc:d:9",
                    age_s=60,
                )
                for k in JOBS
            ],
            warmup_s=0,
        )
        for n, (key, busy) in enumerate((k, b) for k, values in JOBS.items() for b in values):
            sid = f"kst-20261125-1200{n:02d}-abcdef"
            assert store.claim(key, "seed", sid, ["h:1778"], 60, 0, {"pids": [1]})
            store.finish(
                sid,
                "recorded",
                summary={
                    "gpu_busy_pct": busy,
                    "devices": 8,
                    "interval_s": 3600.0,
                    "wasted_gpu_s": (100 - busy) / 100 * 8 * 3600,
                    "top_recommendation": "low-utilization",
                },
            )


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    from tests.report.kscope_testkit import chromium_or_skip, env_with_repo

    chromium_or_skip()
    from kinetoscope.demo.local import ManagedProcess

    work = tmp_path_factory.mktemp("fleetweb")
    url = str(work / "catalog.db")
    seed(url)
    log = work / "serve.log"
    server = ManagedProcess(
        "serve",
        [sys.executable, "-m", "kinetoscope.cli.main", "serve", "--port", "0", "--catalog", url],
        log,
        env_with_repo(),
    ).start()
    try:
        deadline = time.monotonic() + 120
        base = None
        while base is None and time.monotonic() < deadline:
            m = READY.search(log.read_text(errors="replace")) if log.exists() else None
            if m:
                base = m.group(1)
            elif not server.alive():
                pytest.fail(f"kscope serve exited: {server.tail()}")
            else:
                time.sleep(0.1)
        assert base, server.tail()
        yield base, url
    finally:
        server.stop()


@pytest.mark.browser
@pytest.mark.slow
def test_fleet_page_ranks_jobs_like_the_catalog(served: tuple[str, str]) -> None:
    from tests.report.kscope_testkit import PageWatch, browser_context

    base, url = served
    with Catalog.open(url) as cat:
        expected = [r["job_key"] for r in fleet_rows(FleetStore(cat), sort="waste")]
        low = [r["job_key"] for r in fleet_rows(FleetStore(cat), sort="waste", where="gpu_util < 60")]
    assert expected[:3] == ["torch:a:1:r", "proc:c:7", "torch:b:1:r"]  # the seed is what the test checks
    with browser_context() as ctx:
        page = ctx.new_page()
        watch = PageWatch(page)
        page.goto(base + "/fleet")
        rows = page.locator("#fleet-table tbody tr")
        assert [rows.nth(i).get_attribute("data-job") for i in range(rows.count())] == expected
        top = rows.nth(0)
        assert top.locator("svg.trend polyline").count() == 1
        latest = "kst-20261125-120002-abcdef"  # job a's newest sample
        assert top.locator("a.report").get_attribute("href") == f"/traces/{latest}/report"
        assert top.locator("a.trace").get_attribute("href") == f"/traces/{latest}"
        page.fill("input[name=gpu_below]", "60")
        page.click("#fleet-filters button[type=submit]")
        page.wait_for_url(re.compile(r".*/fleet\?.*gpu_below=60.*"))
        rows = page.locator("#fleet-table tbody tr")
        assert [rows.nth(i).get_attribute("data-job") for i in range(rows.count())] == low
        assert low == ["torch:a:1:r", "proc:c:7"]
        page.goto(base + "/fleet?where=nonsense")
        assert "--where" in page.inner_text("#fleet-error")
        assert watch.errors == [] and watch.dialogs == []


def test_fleet_api_matches_the_listing(tmp_path: Path) -> None:
    from fastapi.testclient import TestClient

    from kinetoscope.web.app import WebSettings, create_app

    url = str(tmp_path / "c.db")
    seed(url)
    with TestClient(create_app(WebSettings(catalog_url=url))) as client:
        doc = client.get("/api/fleet?sort=waste").json()
        assert [j["job_key"] for j in doc["jobs"]][:3] == ["torch:a:1:r", "proc:c:7", "torch:b:1:r"]
        assert client.get("/api/fleet?where=bad").status_code == 400
        page = client.get("/fleet?straggler=true")
        assert page.status_code == 200 and "No autopilot jobs match" in page.text


def test_kscope_jobs_ranks_and_filters_like_the_page(tmp_path: Path) -> None:
    import json

    from tests.autopilot.conftest import run_kscope

    url = str(tmp_path / "c.db")
    seed(url)
    res = run_kscope("jobs", "--catalog", url, "--sort", "waste", "--where", "gpu_util < 60", "--json")
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    assert doc["kinetoscope_catalog"] == 1 and [j["job_key"] for j in doc["jobs"]] == [
        "torch:a:1:r",
        "proc:c:7",
    ]
    top = doc["jobs"][0]
    assert top["wasted_gpu_hours"] == pytest.approx((0.8 + 0.75 + 0.9) * 8) and top["gpu_busy_pct"] == 10.0
    assert [s["gpu_busy_pct"] for s in top["samples"]] == [20.0, 25.0, 10.0]
    text = run_kscope("jobs", "--catalog", url, "--sort", "waste")
    assert text.returncode == 0 and text.stdout.index("torch:a:1:r") < text.stdout.index("torch:b:1:r")
    bad = run_kscope("jobs", "--catalog", url, "--where", "gpu_util <")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "--where" in bad.stderr
