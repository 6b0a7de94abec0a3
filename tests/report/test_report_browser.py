"""The report file in Debian's chromium (Playwright), offline: charts render, hostile names stay
text (no dialog, no injected element), no network request leaves the file."""

from __future__ import annotations

import os

import pytest

from kinetoscope.report import render_report
from tests.report.kscope_testkit import HOSTILE, PageWatch, browser_context, injected_elements

pytestmark = pytest.mark.browser


@pytest.mark.parametrize("csp", [False, True], ids=["escaping-alone", "with-csp"])
def test_report_renders_offline_and_hostile_names_are_text(tmp_path, hostile_doc, csp):
    path = tmp_path / "report.html"
    path.write_text(render_report(hostile_doc, csp=csp, inputs=[HOSTILE]), encoding="utf-8")
    with browser_context() as ctx:
        page = ctx.new_page()
        watch = PageWatch(page)
        external: list[str] = []

        def block(route):  # offline: anything but the file itself is refused and remembered
            external.append(route.request.url)
            route.abort()

        page.route(lambda url: not url.startswith("file://"), block)
        page.goto(path.as_uri())
        page.wait_for_function("document.body.getAttribute('data-charts-rendered') !== null", timeout=60_000)
        n_charts = page.locator("div.chart").count()
        assert (
            page.evaluate("document.body.getAttribute('data-charts-rendered')") == str(n_charts)
            and n_charts >= 9
        )
        assert page.locator("div.chart .main-svg").count() >= n_charts  # plotly drew every chart
        # the hostile kernel name is visible as text: in a table cell, in the inputs, and in chart labels
        assert page.locator("#table-kernels td", has_text=HOSTILE).count() >= 2
        assert page.locator("header code", has_text=HOSTILE).count() == 1
        assert page.locator("#chart-top-kernels text", has_text=HOSTILE).count() >= 1
        page.mouse.wheel(0, 4000)
        page.wait_for_timeout(300)
        assert watch.dialogs == [] and injected_elements(page) == []
        assert watch.errors == [], watch.errors
        assert external == []
        if os.environ.get("KSCOPE_TEST_SCREENSHOTS"):
            page.locator("#kernels").scroll_into_view_if_needed()
            page.screenshot(
                path=os.path.join(os.environ["KSCOPE_TEST_SCREENSHOTS"], f"report-kernels-{csp}.png")
            )
