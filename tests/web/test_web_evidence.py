"""The evidence card (issue 28) on the web analysis page and in the HTML report, for a real
job whose rank 2 wrote an empty trace (``tests/data/malformed_jobs/empty_rank2_w4``)."""

from __future__ import annotations

import shutil
import warnings
from pathlib import Path

import pytest

CASE = Path(__file__).resolve().parents[1] / "data" / "malformed_jobs" / "empty_rank2_w4"


@pytest.fixture(scope="module")
def evidence_client(tmp_path_factory):
    from kinetoscope.orchestration import AnalyzeRequest, analyze, record_run
    from kinetoscope.store import Catalog

    root = tmp_path_factory.mktemp("web-evidence")
    job = root / "traces" / "kst-20261128-000000-empt"
    shutil.copytree(CASE, job)
    url = str(root / "catalog.db")
    with Catalog.open(url) as cat:
        run = analyze(AnalyzeRequest(inputs=(str(job),), cache=False), catalog=cat)
        aid = record_run(cat, run).id
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from fastapi.testclient import TestClient

    from kinetoscope.web import WebSettings, create_app

    with TestClient(create_app(WebSettings(catalog_url=url, daemons=["127.0.0.1:9"]))) as c:
        yield c, aid


def test_analysis_page_shows_the_evidence_card(evidence_client):
    client, aid = evidence_client
    r = client.get(f"/analyses/{aid}")
    assert r.status_code == 200
    card = r.text.split('id="evidence"', 1)[1].split("</section>", 1)[0]
    assert "NOT ASSESSED: rank 2: trace file empty (0 events)" in card
    assert "--iterations 20 --when-stepping --wait" in card
    assert "<dt>steps in common</dt><dd>0</dd>" in card and "empty_file" in card
    assert 'class="verdict warn"' in r.text  # never the green of a clean verdict


def test_report_has_the_evidence_section(evidence_client):
    client, aid = evidence_client
    r = client.get(f"/analyses/{aid}/report")
    assert r.status_code == 200
    sec = r.text.split('<section id="evidence">', 1)[1].split("</section>", 1)[0]
    assert "<h2>Evidence</h2>" in sec and "NOT ASSESSED: rank 2: trace file empty (0 events)" in sec
    assert "table-evidence-ranks" in sec and "table-evidence-anomalies" in sec
    assert 'href="#evidence"' in r.text
