"""Issue 16 (web): files are served only from the serving roots whatever a manifest says, the
Host allow-list stays on for a non-loopback bind (DNS rebinding), and oversized request bodies
get 413 before they are read."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import httpx
import pytest

from kinetoscope.cli.serve_cmd import allowed_hosts
from kinetoscope.web.guards import HostCheck, ServeRoots, host_name
from tests.report.kscope_testkit import env_with_repo

REPO_ROOT = Path(__file__).resolve().parents[2]
TRACE_DOC = '{"traceEvents": []}'


def _client(app, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from fastapi.testclient import TestClient
    return TestClient(app, **kw)


@pytest.fixture()
def rooted(tmp_path):
    """(client, serving root, outside folder): an app whose only serving root is ``root``."""
    from kinetoscope.web import WebSettings, create_app

    root = tmp_path / "root"
    outside = tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    app = create_app(
        WebSettings(catalog_url=str(tmp_path / "c.db"), serve_roots=[str(root)], default_roots=False)
    )
    with _client(app) as c:
        yield c, root, outside


def _record(client, trace_id: str, files: list[dict]) -> None:
    client.app.state.catalog.record_trace_request(
        {
            "kinetoscope_manifest": 1,
            "trace_id": trace_id,
            "created": "2026-11-21T00:00:00Z",
            "files": [{"host": "h", "pid": i + 1, "complete": True, **f} for i, f in enumerate(files)],
        }
    )


def test_a_manifest_naming_a_json_file_outside_the_roots_is_not_served(rooted):
    """Regression: an imported manifest naming /some/secret/credentials.json made
    GET /traces/<id>/files/credentials.json return it (the name and suffix matched)."""
    client, root, outside = rooted
    secret = outside / "credentials.json"
    secret.write_text('{"aws_secret_access_key": "x"}')
    inside = root / "rank-0.json"
    inside.write_text(TRACE_DOC)
    _record(
        client,
        "kst-creds",
        [{"file": "credentials.json", "path": str(secret)}, {"file": "rank-0.json", "path": str(inside)}],
    )
    r = client.get("/traces/kst-creds/files/credentials.json")
    assert r.status_code == 404 and "aws_secret" not in r.text and "serving roots" in r.text
    assert client.get("/traces/kst-creds/files/rank-0.json").text == TRACE_DOC
    assert (
        client.get("/traces/kst-creds/perfetto/credentials.json", follow_redirects=False).status_code == 404
    )
    page = client.get("/traces/kst-creds").text
    assert "/files/credentials.json" not in page and "/files/rank-0.json" in page


def test_a_symlink_inside_a_root_that_points_outside_is_not_followed(rooted):
    client, root, outside = rooted
    (outside / "secret.json").write_text('{"secret": 1}')
    (root / "link.json").symlink_to(outside / "secret.json")
    (root / "dirlink").symlink_to(outside)
    _record(
        client,
        "kst-links",
        [
            {"file": "link.json", "path": str(root / "link.json")},
            {"file": "secret.json", "path": str(root / "dirlink" / "secret.json")},
            {"file": "up.json", "path": f"{root}/../outside/secret.json"},
        ],
    )
    for name in ("link.json", "secret.json", "up.json"):
        assert client.get(f"/traces/kst-links/files/{name}").status_code == 404, name


def test_storage_urls_are_confined_too(rooted):
    """A manifest's storage URL: a local one must lie under a root, a remote one under a remote
    root (never fetched otherwise)."""
    client, _root, outside = rooted
    (outside / "a.json").write_text('{"secret": 1}')
    _record(
        client,
        "kst-urls",
        [
            {"file": "a.json", "storage_url": str(outside / "a.json")},
            {"file": "b.json", "storage_url": f"file://{outside / 'a.json'}"},
            {"file": "c.json", "storage_url": "s3://someone-elses-bucket/kst-urls/c.json"},
        ],
    )
    for name in ("a.json", "b.json", "c.json"):
        assert client.get(f"/traces/kst-urls/files/{name}").status_code == 404, name


def test_serve_roots_units(tmp_path):
    (tmp_path / "r").mkdir()
    (tmp_path / "r" / "f.json").write_text("{}")
    roots = ServeRoots.from_list([str(tmp_path / "r"), "s3://bucket/pre/"])
    assert roots.local_file(tmp_path / "r" / "f.json") == (tmp_path / "r" / "f.json").resolve()
    assert roots.local_file(tmp_path / "r") is None  # a folder is not a file
    assert roots.local_file(tmp_path / "r" / "missing.json") is None
    assert roots.allows_url("s3://bucket/pre/t1/f.json")
    assert not roots.allows_url("s3://bucket/prefix-other/f.json")
    assert not roots.allows_url("s3://bucket/pre/../secret/f.json")


@pytest.mark.parametrize(
    ("header", "ok"),
    [
        ("127.0.0.1:8000", True),
        ("[::1]:8000", True),
        ("10.1.2.3", True),
        ("localhost", True),
        ("node7.cluster:8000", True),
        ("NODE7.cluster", True),
        ("attacker.example", False),
        ("attacker.example:8000", False),
        ("", False),
        ("node7.cluster.evil.example", False),
    ],
)
def test_host_check(header, ok):
    assert HostCheck(["node7.cluster"]).allows(header) is ok
    assert HostCheck(None).allows(header) and HostCheck(["*"]).allows(header)


def test_allowed_hosts_for_a_non_loopback_bind():
    names = allowed_hosts("0.0.0.0", False, ["ui.example, other.example"])
    assert "ui.example" in names and "other.example" in names
    assert host_name("[::1]:80") == "::1"


def test_rebinding_host_is_refused_on_the_api(tmp_path):
    """Regression: with a non-loopback bind the check was off; a rebinding origin got 200 on
    GET /api/traces and 202 on POST /api/trigger."""
    from kinetoscope.web import WebSettings, create_app

    app = create_app(
        WebSettings(catalog_url=str(tmp_path / "c.db"), allowed_hosts=allowed_hosts("0.0.0.0", False, []))
    )
    with _client(app, base_url="http://attacker.example:8000") as c:
        assert c.get("/api/traces").status_code == 400
        assert c.post("/api/trigger", json={"all": True}).status_code == 400
        assert c.get("/api/traces", headers={"Host": "192.0.2.7:8000"}).status_code == 200


def test_oversized_bodies_get_413(tmp_path):
    from kinetoscope.web import WebSettings, create_app

    app = create_app(
        WebSettings(catalog_url=str(tmp_path / "c.db"), max_body_bytes=4096, daemons=["127.0.0.1:9"])
    )
    with _client(app, base_url="http://127.0.0.1") as c:
        big = b'{"hosts": ["' + b"a" * 10_000 + b'"]}'
        r = c.post("/api/trigger", content=big, headers={"Content-Type": "application/json"})
        assert r.status_code == 413 and "--max-body-bytes" in r.json()["detail"]

        def chunks():  # no Content-Length: counted while it streams in
            for _ in range(10):
                yield b" " * 1000

        r = c.post("/api/trigger", content=chunks(), headers={"Content-Type": "application/json"})
        assert r.status_code == 413
        r = c.post("/trigger", data={"hosts": "x" * 10_000})
        assert r.status_code == 413
        r = c.post(
            "/api/trigger", json={"hosts": ["127.0.0.1:9"], "all": True, "iterations": 1, "timeout_s": 1}
        )
        assert r.status_code == 202, r.text


def _start_serve(tmp_path, *args):
    log = tmp_path / "serve.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "kinetoscope.cli.main",
                "serve",
                "--port",
                "0",
                "--catalog",
                str(tmp_path / "c.db"),
                *args,
            ],
            cwd=REPO_ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env_with_repo(),
            start_new_session=True,
        )
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline and proc.poll() is None:
        for line in log.read_text(errors="replace").splitlines():
            if line.startswith("kscope serve ready: "):
                return proc, int(line.split()[3].rstrip("/").rsplit(":", 1)[1]), log
        time.sleep(0.1)
    proc.kill()
    proc.wait()
    raise AssertionError(log.read_text())


def test_real_server_on_all_interfaces_keeps_the_host_check_and_body_limit(tmp_path):
    proc, port, log = _start_serve(tmp_path, "--bind", "0.0.0.0", "--max-body-bytes", "2048")
    try:
        base = f"http://127.0.0.1:{port}"
        assert httpx.get(base + "/api/traces", timeout=10).status_code == 200
        r = httpx.get(base + "/api/traces", headers={"Host": "rebind.attacker.example"}, timeout=10)
        assert r.status_code == 400
        r = httpx.post(
            base + "/api/trigger", json={"all": True}, headers={"Host": "rebind.attacker.example"}, timeout=10
        )
        assert r.status_code == 400
        r = httpx.post(
            base + "/api/trigger",
            content=b"[" + b" " * 100_000 + b"]",
            headers={"Content-Type": "application/json"},
            timeout=10,
        )
        assert r.status_code == 413
        assert "host names accepted" in log.read_text()
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def test_the_analyze_action_refuses_files_outside_the_roots(rooted):
    """A hostile manifest cannot make the server analyse (and report on) files outside the
    roots either."""
    client, _root, outside = rooted
    (outside / "rank-0.json").write_text(TRACE_DOC)
    _record(client, "kst-outside", [{"file": "rank-0.json", "path": str(outside / "rank-0.json")}])
    r = client.post("/api/traces/kst-outside/analyze")
    assert r.status_code == 202
    tasks = client.app.state.tasks
    t = tasks.wait(r.json()["task"]["id"], 60)
    assert t is not None and t.finished
    task = client.get(f"/api/tasks/{t.id}").json()["task"]
    assert task["state"] == "failed", task
    # refused by the catalog's folder rule (orchestration.request_files) or the serving-root check
    assert "refused" in task["message"] or "outside the serving roots" in task["message"], task


def test_out_of_range_numbers_are_client_errors(rooted):
    """Found by tests/fuzz: ids and limits beyond int64 overflowed in SQLite (500)."""
    client, _root, _outside = rooted
    for url in (
        "/analyses/9223372036854775808",
        "/api/analyses/99999999999999999999",
        "/api/analyses/9223372036854775808/document",
        "/analyses/9223372036854775808/report",
    ):
        assert client.get(url).status_code == 404, url
    assert client.get("/api/jobs?limit=99999999999999999999").status_code == 422
