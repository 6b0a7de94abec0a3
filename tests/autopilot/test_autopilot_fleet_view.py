"""The fleet view in Debian's chromium (Playwright): a real `kscope serve` subprocess over a fleet
catalog built through the real analysis (``fleet_seed``). The Fleet page's totals, charts and
ranking match the listing code; figures carry units and recommendations their titles; every job
links to its page, which lists its samples (the corrupted ones unusable); the Jobs page lists
every job, by hand or by the autopilot. Plotly is served by the app (no request leaves it).
Screenshots at 1400×900 and on a narrow window are kept under the test's tmp dir, and copied to
``$KSCOPE_TEST_SCREENSHOTS`` when set; on the narrow window no page scrolls sideways."""

from __future__ import annotations

import os
import re
import shutil
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import pytest

from kinetoscope.autopilot.fleetview import all_job_rows, fleet_rows, fleet_totals
from kinetoscope.store.catalog import Catalog
from kinetoscope.store.fleet import FleetStore
from tests.autopilot.fleet_seed import HAND_ONLY, JOBS, SAMPLES, seed_fleet

pytestmark = [pytest.mark.browser, pytest.mark.slow]

READY = re.compile(r"kscope serve ready: (http://127\.0\.0\.1:\d+)/")
SIZES = {"wide": (1400, 900), "narrow": (420, 900)}


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str, Path]]:
    from tests.report.kscope_testkit import chromium_or_skip, env_with_repo

    chromium_or_skip()
    from kinetoscope.demo.local import ManagedProcess

    work = tmp_path_factory.mktemp("fleetview")
    url = str(work / "catalog.db")
    seed_fleet(url, work / "traces")
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
        shots = work / "screenshots"
        shots.mkdir()
        yield base, url, shots
    finally:
        server.stop()


def _shot(page, shots: Path, name: str) -> None:
    path = shots / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    keep = os.environ.get("KSCOPE_TEST_SCREENSHOTS")
    if keep:
        Path(keep).mkdir(parents=True, exist_ok=True)
        shutil.copy(path, Path(keep) / path.name)


def _no_sideways_scroll(page) -> None:
    width, inner = page.evaluate("[document.documentElement.scrollWidth, window.innerWidth]")
    assert width <= inner + 1, f"the page scrolls sideways: {width} px wide in a {inner} px window"


def _expected(url: str) -> tuple[list[dict], list[dict]]:
    with Catalog.open(url) as cat:
        store = FleetStore(cat)
        return fleet_rows(store, sort="waste"), all_job_rows(store)


@pytest.mark.parametrize("size", list(SIZES))
def test_fleet_page_totals_charts_and_ranking(served: tuple[str, str, Path], size: str) -> None:
    from tests.report.kscope_testkit import PageWatch, browser_context

    base, url, shots = served
    ranked, _ = _expected(url)
    totals = fleet_totals(ranked)
    with browser_context() as ctx:
        page = ctx.new_page()
        page.set_viewport_size(dict(zip(("width", "height"), SIZES[size])))
        watch = PageWatch(page)
        requested: list[str] = []
        page.on("request", lambda r: requested.append(r.url))
        page.goto(base + "/fleet")
        page.wait_for_selector("#fleet-waste[data-rendered='1']", timeout=60_000)
        page.wait_for_selector("#fleet-trend[data-rendered='1']", timeout=60_000)
        _shot(page, shots, f"fleet-{size}")
        if size == "narrow":
            _no_sideways_scroll(page)
        # totals, with their units
        wasted = page.inner_text("[data-total=gpu_hours_wasted]")
        assert f"{totals.gpu_hours_wasted:,.1f}" in wasted and "GPU-h" in wasted
        assert (
            page.inner_text("[data-total=jobs_sampled] .value").split()[0] == str(totals.jobs_sampled) == "5"
        )
        unusable = page.inner_text("[data-total=samples_unusable]")
        assert unusable.startswith("3") and "3 with corrupted timestamps" in unusable
        for key in ("share_stragglers", "share_low_utilisation", "share_launch_bound"):
            assert "%" in page.inner_text(f"[data-total={key}] .value")
        # the ranking: table rows and chart bars in the listing's order
        rows = page.locator("#fleet-table tbody tr")
        keys = [r["job_key"] for r in ranked]
        assert [rows.nth(i).get_attribute("data-job") for i in range(rows.count())] == keys
        bars = page.evaluate("document.getElementById('fleet-waste').data[0].y")
        assert list(reversed(bars)) == keys  # largest on top
        lines = page.evaluate("document.getElementById('fleet-trend').data.map(t => t.name)")
        assert lines[: len(keys)] == keys and lines[-1] == "unusable sample (not ranked)"
        # units in every numeric header, titles (not ids), each job a link to its page
        headers = page.locator("#fleet-table thead th").all_inner_texts()
        for h in ("wasted GPU-h", "GPU busy %", "MFU %", "lost step time %", "launch gaps %"):
            assert any(h in " ".join(x.split()) for x in headers), (h, headers)
        recs = page.locator("#fleet-table td.rec").all_inner_texts()
        assert recs and all(r.startswith("CPU launch-bound: the GPU waits") for r in recs), recs
        links = page.locator("#fleet-table a.job")
        assert [links.nth(i).get_attribute("href") for i in range(links.count())] == [
            "/jobs/" + quote(k, safe="") for k in keys
        ]
        assert all(u.startswith(base) for u in requested), [u for u in requested if not u.startswith(base)]
        assert watch.errors == [] and watch.dialogs == []


@pytest.mark.parametrize("size", list(SIZES))
def test_every_job_has_a_page_with_its_samples(served: tuple[str, str, Path], size: str) -> None:
    from tests.report.kscope_testkit import PageWatch, browser_context

    base, url, shots = served
    _, everything = _expected(url)
    with browser_context() as ctx:
        page = ctx.new_page()
        page.set_viewport_size(dict(zip(("width", "height"), SIZES[size])))
        watch = PageWatch(page)
        page.goto(base + "/fleet")
        page.click("#fleet-table a.job >> text=slurm:1002")
        page.wait_for_url(re.compile(r".*/jobs/slurm%3A1002$"))
        page.wait_for_selector("#job-trend[data-rendered='1']", timeout=60_000)
        _shot(page, shots, f"job-{size}")
        if size == "narrow":
            _no_sideways_scroll(page)
        samples = page.locator("#samples-table tbody tr")
        states = [samples.nth(i).get_attribute("data-state") for i in range(samples.count())]
        assert len(states) == SAMPLES and states.count("unusable") == len(JOBS["slurm:1002"][2])
        assert "timestamp_anomalies" in page.inner_text("#samples-table")
        assert "GPU-h" in page.inner_text("#job-totals")
        # the Jobs page: every job once, by hand or by the autopilot, with consistent counts
        page.goto(base + "/jobs")
        _shot(page, shots, f"jobs-{size}")
        if size == "narrow":
            _no_sideways_scroll(page)
        rows = page.locator("#jobs-table tbody tr")
        listed = {rows.nth(i).get_attribute("data-job"): rows.nth(i) for i in range(rows.count())}
        assert sorted(listed) == sorted(r["job_key"] for r in everything) == sorted([*JOBS, HAND_ONLY[1]])
        assert listed[HAND_ONLY[1]].get_attribute("data-state") == "traced by hand"
        assert listed["proc:node05:4242"].get_attribute("data-state") == "ended"
        by_key = {r["job_key"]: r for r in everything}
        assert by_key["slurm:1001"]["traces"] == SAMPLES + 1  # its samples and the trace by hand
        for key, row in listed.items():
            assert row.locator("td.num").nth(0).inner_text() == str(by_key[key]["traces"])
        assert watch.errors == [] and watch.dialogs == []
