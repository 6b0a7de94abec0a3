"""Fuzzing what the web app may contact (issue 32): trigger requests naming hosts, Host headers,
and catalog records naming store URLs. A real listener on another port stands for every host
and URL the server was not configured with: whatever the request says, it must never see a
connection, no request may answer 5xx, and a malformed Host header is never accepted.

Inputs come from the derandomized hypothesis profile (tests/conftest.py);
``KSCOPE_FUZZ_BUDGET`` (default 1) multiplies the number of examples.
"""

from __future__ import annotations

import os
import re
import socket
import threading
import warnings
from collections import Counter

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

BUDGET = max(1, int(os.environ.get("KSCOPE_FUZZ_BUDGET", "1")))
FUZZ_SETTINGS = dict(suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
CONFIGURED = "127.0.0.1:9"  # nothing listens there: a configured daemon refuses at once
_STATS: Counter[str] = Counter()


class Stranger:
    """A listener no request may reach (counts connections)."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.sock.settimeout(0.1)
        self.port = self.sock.getsockname()[1]
        self.connections = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            self.connections += 1
            conn.close()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.sock.close()


@pytest.fixture(scope="module")
def web(tmp_path_factory):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from fastapi.testclient import TestClient

    from kinetoscope.web import WebSettings, create_app

    root = tmp_path_factory.mktemp("fuzzhosts")
    (root / "roots").mkdir()
    stranger = Stranger()
    app = create_app(
        WebSettings(
            catalog_url=str(root / "c.db"),
            daemons=[CONFIGURED],
            token="fuzz-token",
            allowed_hosts=["testserver"],
            serve_roots=[str(root / "roots")],
            default_roots=False,
        )
    )
    try:
        with TestClient(app, raise_server_exceptions=False) as c:
            yield c, stranger
            c.app.state.tasks.shutdown()
    finally:
        stranger.close()
        assert stranger.connections == 0, f"the stranger saw {stranger.connections} connection(s)"


def _stranger_hosts(port: int) -> st.SearchStrategy[str]:
    """Ways to name the stranger (and other places) as a daemon."""
    return st.one_of(
        st.sampled_from(
            [
                f"127.0.0.1:{port}",
                f"localhost:{port}",
                f"[::ffff:127.0.0.1]:{port}",
                f"127.1:{port}",
                f"2130706433:{port}",
                f"127.0.0.1:{port}@127.0.0.1:9",
                f"127.0.0.1:9@127.0.0.1:{port}",
                f"127.0.0.1:9,127.0.0.1:{port}",
                f" 127.0.0.1:{port} ",
                f"127.0.0.1:0{port}",
                f"http://127.0.0.1:{port}/",
                "127.0.0.1:1778",
                "127.0.0.1",
                "localhost",
                "[::1]:9",
                "0.0.0.0:9",
                "127.0.0.1:99999",
                "127.0.0.1:-1",
                ":9",
                "[",
                "",
            ]
        ),
        st.text(max_size=30),
        st.tuples(
            st.sampled_from(["127.0.0.1", "localhost", "::1", "[::1]", "x"]), st.integers(-5, 70000)
        ).map(lambda t: f"{t[0]}:{t[1]}"),
    )


def _only_configured(hosts: list[str]) -> bool:
    from kinetoscope.collect.client import parse_host
    from kinetoscope.errors import KinetoscopeError

    try:
        parsed = {str(parse_host(p)) for h in hosts for p in h.split(",") if p.strip()}
    except KinetoscopeError:
        return False
    return parsed <= {CONFIGURED}


@settings(max_examples=150 * BUDGET, deadline=None, **FUZZ_SETTINGS)
@given(data=st.data(), form=st.booleans())
def test_trigger_never_contacts_an_unconfigured_host(web, data, form):
    client, stranger = web
    hosts = data.draw(st.lists(_stranger_hosts(stranger.port), min_size=1, max_size=3))
    if form:
        r = client.post(
            "/trigger",
            data={
                "hosts": ",".join(hosts),
                "target": "all",
                "mode": "iterations",
                "iterations": "1",
                "timeout_s": "1",
            },
            follow_redirects=False,
        )
    else:
        r = client.post("/api/trigger", json={"hosts": hosts, "all": True, "iterations": 1, "timeout_s": 1})
    _STATS[f"trigger hosts: HTTP {r.status_code}"] += 1
    assert r.status_code < 500, r.text[:300]
    if r.status_code in (202, 303):
        assert _only_configured(hosts) or not any(h.strip() for h in hosts), hosts
    assert stranger.connections == 0, f"{hosts} reached the stranger"


HOST_RE = re.compile(r"(?:\[[0-9a-f:.]+\]|[a-z0-9](?:[a-z0-9._-]*[a-z0-9])?)(?::[0-9]{1,5})?\Z")


@settings(max_examples=200 * BUDGET, deadline=None, **FUZZ_SETTINGS)
@given(
    host=st.one_of(
        st.text(alphabet=st.characters(min_codepoint=0x21, max_codepoint=0x7E), max_size=40),
        st.sampled_from(
            ["127.0.0.1:18080@evil.com", "testserver", "testserver:80", "[::1]:8000", "127.0.0.1"]
        ),
        st.tuples(
            st.sampled_from(["127.0.0.1", "testserver", "evil.com"]),
            st.sampled_from(["@", "/", "\\", "#", "?", ":"]),
            st.text(max_size=10),
        ).map("".join),
    )
)
def test_host_header_is_validated_strictly(web, host):
    client, _ = web
    raw = host.encode("utf-8").replace(b"\r", b"").replace(b"\n", b"").replace(b"\x00", b"")
    seen = raw.decode("latin-1")  # what the server reads
    r = client.get("/api/health", headers={"Host": raw})
    _STATS[f"host header: HTTP {r.status_code}"] += 1
    assert r.status_code in (200, 400), r.text[:200]
    if r.status_code == 200 and seen.strip():
        assert HOST_RE.match(seen.strip().lower()), f"accepted a malformed Host header {seen!r}"


_N = Counter[str]()


@settings(max_examples=40 * BUDGET, deadline=None, **FUZZ_SETTINGS)
@given(data=st.data(), level=st.sampled_from(["store_url", "url", "storage_url"]))
def test_analyze_never_fetches_from_an_unconfigured_url(web, data, level):
    client, stranger = web
    base = f"127.0.0.1:{stranger.port}"
    url = data.draw(
        st.one_of(
            st.sampled_from(
                [
                    f"http://{base}/b",
                    f"https://{base}/b",
                    f"s3://b/p?endpoint_url=http://{base}",
                    f"http://user@{base}/b",
                    f"http://{base}/b/../b",
                    f"ftp://{base}/b",
                    f"http://[::ffff:127.0.0.1]:{stranger.port}/b",
                    f"HTTP://{base}/b",
                ]
            ),
            st.text(max_size=20).map(lambda t: f"http://{base}/{t}"),
        )
    )
    _N["n"] += 1
    trace_id = f"kst-fuzz-url-{_N['n']}"
    entry = {"file": "rank-0.json", "host": "h", "pid": 1, "complete": True}
    top = {}
    if level == "store_url":
        top["store_url"] = url
    else:
        entry["url"] = url + "/rank-0.json"
    client.app.state.catalog.record_trace_request(
        {"kinetoscope_manifest": 1, "trace_id": trace_id, "files": [entry], **top}
    )
    r = client.post(f"/api/traces/{trace_id}/analyze")
    assert r.status_code == 202, r.text
    t = client.app.state.tasks.wait(r.json()["task"]["id"], 60)
    assert t is not None and t.finished
    _STATS[f"analyze URL: {t.state}"] += 1
    assert t.state == "failed"
    assert stranger.connections == 0, f"{url} was fetched"
    for f in ("/traces/{}/files/rank-0.json", "/traces/{}/perfetto/rank-0.json"):
        assert client.get(f.format(trace_id), follow_redirects=False).status_code == 404
    assert stranger.connections == 0, f"{url} was fetched to serve it"


def test_zz_report(web, fuzz_counts):
    fuzz_counts["web hosts and URLs"] += sum(n for k, n in _STATS.items())
