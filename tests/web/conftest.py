"""Fixtures for the web tests: a catalog holding the synthetic hostile job (imported, analysed)
and the app on Starlette's TestClient."""

from __future__ import annotations

import warnings

import pytest

from tests.report.kscope_testkit import write_job

TRACE_ID = "kst-20261121-000000-test"


@pytest.fixture(scope="module")
def web_catalog(tmp_path_factory):
    """(catalog url, trace folder, analysis id) with the hostile job recorded and analysed."""
    from kinetoscope.orchestration import AnalyzeRequest, analyze, record_run
    from kinetoscope.store import Catalog

    root = tmp_path_factory.mktemp("web")
    job = root / "traces" / TRACE_ID
    write_job(job)
    url = str(root / "catalog.db")
    with Catalog.open(url) as cat:
        cat.import_trace_dir(job)
        run = analyze(AnalyzeRequest(inputs=(TRACE_ID,), cache=False), catalog=cat)
        aid = record_run(cat, run).id
    return url, job, aid


@pytest.fixture(scope="module")
def client(web_catalog):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # starlette's TestClient deprecation note about httpx
        from fastapi.testclient import TestClient

    from kinetoscope.web import WebSettings, create_app

    app = create_app(WebSettings(catalog_url=web_catalog[0], daemons=["127.0.0.1:9"]))
    with TestClient(app) as c:
        yield c
