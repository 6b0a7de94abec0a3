"""Fuzzing the web app's routes (issue 16): hostile path parameters, query strings, JSON and
form bodies against the FastAPI app (Starlette's TestClient, server exceptions turned into
responses). No request may answer 5xx, and no file outside the serving roots may be served,
whatever the catalog's manifests say (one names a secret ``credentials.json`` outside).

Inputs come from the derandomized hypothesis profile (tests/conftest.py), so CI tries the same
ones every run; ``KSCOPE_FUZZ_BUDGET`` (default 1) multiplies the number of examples.
"""

from __future__ import annotations

import hashlib
import os
import warnings
from collections import Counter
from urllib.parse import quote

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.report.kscope_testkit import write_job

BUDGET = max(1, int(os.environ.get("KSCOPE_FUZZ_BUDGET", "1")))
TRACE_ID = "kst-20261121-000000-fuzz"
HOSTILE_ID = "kst-hostile-manifest"
SECRET = b'{"aws_secret_access_key": "FUZZ-SECRET-DO-NOT-SERVE"}'
FUZZ_SETTINGS = dict(suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])

_STATS: Counter[str] = Counter()


@pytest.fixture(scope="module")
def app_client(tmp_path_factory):
    """(client, recorded trace files) for a catalog with one real request under the default
    serving root ``<catalog folder>/traces`` and one hostile manifest naming files outside."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from fastapi.testclient import TestClient

    from kinetoscope.store import Catalog
    from kinetoscope.web import WebSettings, create_app

    root = tmp_path_factory.mktemp("fuzzweb")
    files = write_job(root / "traces" / TRACE_ID, trace_id=TRACE_ID, world=2, steps=3)
    outside = root / "outside"
    outside.mkdir()
    (outside / "credentials.json").write_bytes(SECRET)
    (outside / "up.json").write_bytes(SECRET)
    (root / "traces" / "link.json").symlink_to(outside / "credentials.json")
    url = str(root / "catalog.db")
    with Catalog.open(url) as cat:
        cat.import_trace_dir(root / "traces" / TRACE_ID)
        cat.record_trace_request(
            {
                "kinetoscope_manifest": 1,
                "trace_id": HOSTILE_ID,
                "created": "2026-11-21T00:00:00Z",
                "store_url": f"file://{outside}",
                "files": [
                    {
                        "file": "credentials.json",
                        "path": str(outside / "credentials.json"),
                        "host": "h",
                        "pid": 1,
                    },
                    {"file": "link.json", "path": str(root / "traces" / "link.json"), "host": "h", "pid": 2},
                    {
                        "file": "x.json",
                        "storage_url": str(outside / "credentials.json"),
                        "host": "h",
                        "pid": 3,
                    },
                    {"file": "up.json", "path": f"{root}/traces/../outside/up.json", "host": "h2", "pid": 4},
                ],
            }
        )
    app = create_app(WebSettings(catalog_url=url, daemons=["127.0.0.1:9"], allowed_hosts=["testserver"]))
    served = _Digests(f.read_bytes() for f in files if f.name.endswith(".json"))
    with TestClient(app, raise_server_exceptions=False) as c:
        yield c, served


class _Digests:
    """The SHA-256 of the files that may be served (short in a failure report)."""

    def __init__(self, contents) -> None:
        self.digests = {hashlib.sha256(c).hexdigest() for c in contents}

    def __contains__(self, content: bytes) -> bool:
        return hashlib.sha256(content).hexdigest() in self.digests

    def __repr__(self) -> str:
        return f"<{len(self.digests)} servable files>"


hostile_text = st.one_of(
    st.text(max_size=40),
    st.sampled_from(
        [
            TRACE_ID,
            HOSTILE_ID,
            "credentials.json",
            "link.json",
            "x.json",
            "up.json",
            "../outside/credentials.json",
            "..",
            ".",
            "%2e%2e%2f",
            "..%2F..%2Fetc%2Fpasswd",
            "/etc/passwd",
            "\x00",
            "a\x00.json",
            "<script>alert(1)</script>",
            "名前🚀",
            "' OR 1=1 --",
            "rank-0_5000.pt.trace.json",
            "-1",
            "0",
            "99999999999999999999",
            "1e9",
            "NaN",
            "a" * 5000,
            "%",
            "%%",
            "%ff",
            "\\..\\",
            "~",
            "$HOME",
        ]
    ),
)
ID_ROUTES = [
    "/jobs/{}",
    "/traces/{}",
    "/traces/{}/report",
    "/analyses/{}",
    "/analyses/{}/report",
    "/tasks/{}",
    "/api/jobs/{}",
    "/api/traces/{}",
    "/api/analyses/{}",
    "/api/analyses/{}/document",
    "/api/tasks/{}",
    "/static/{}",
    "/perfetto/{}",
]
FILE_ROUTES = ["/traces/{}/files/{}", "/traces/{}/perfetto/{}"]
QUERY_ROUTES = ["/traces", "/analyses", "/trigger", "/api/jobs", "/api/traces", "/api/analyses"]


def _quote(text: str, raw: bool) -> str:
    """``text`` as a path segment: percent-encoded, or as typed when it is printable ASCII
    without '?'/'#' (the client refuses control characters, a browser would encode them)."""
    typed = raw and text.isascii() and text.isprintable() and not any(c in text for c in "?#")
    return text if typed else quote(text, safe="")


def _check(r, what: str) -> None:
    _STATS[f"web {what}: requests"] += 1
    _STATS[f"web {what}: HTTP {r.status_code // 100}xx"] += 1
    assert r.status_code < 500, f"{r.request.method} {r.request.url} -> {r.status_code}: {r.text[:300]}"
    assert b"FUZZ-SECRET-DO-NOT-SERVE" not in r.content, f"{r.request.url} served the secret"


@settings(max_examples=200 * BUDGET, **FUZZ_SETTINGS)
@given(
    route=st.sampled_from(ID_ROUTES),
    value=hostile_text | st.integers(-(2**70), 2**70).map(str),
    raw=st.booleans(),
)
def test_id_routes(app_client, route, value, raw):
    client, _ = app_client
    _check(client.get(route.format(_quote(value, raw)), follow_redirects=False), "id routes")


@settings(max_examples=200 * BUDGET, **FUZZ_SETTINGS)
@given(route=st.sampled_from(FILE_ROUTES), trace_id=hostile_text, name=hostile_text, raw=st.booleans())
def test_file_routes_never_serve_outside_the_roots(app_client, route, trace_id, name, raw):
    client, served = app_client
    r = client.get(route.format(_quote(trace_id, raw), _quote(name, raw)), follow_redirects=False)
    _check(r, "file routes")
    # (the client resolves '.'/'..' segments: check the route the request really took)
    if r.status_code == 200 and "/files/" in r.request.url.path:
        assert r.content in served, f"{r.request.url} served a file that is not a recorded trace under a root"


@settings(max_examples=100 * BUDGET, **FUZZ_SETTINGS)
@given(
    route=st.sampled_from(QUERY_ROUTES),
    params=st.dictionaries(
        st.sampled_from(["limit", "job_id", "status", "trace_id", "x"]),
        hostile_text | st.integers(-(2**70), 2**70).map(str),
        max_size=4,
    ),
)
def test_query_strings(app_client, route, params):
    client, _ = app_client
    _check(client.get(route, params=params), "query strings")


json_value = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | hostile_text,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=15,
)
# daemon addresses: unreachable at once or invalid (a random name could wait on a DNS lookup)
safe_hosts = st.lists(
    st.sampled_from(
        [
            "127.0.0.1:9",
            "[::1]:9",
            "",
            ":",
            "[::1",
            "127.0.0.1:0",
            "127.0.0.1:99999",
            "a:b:c",
            "127.0.0.1:9,127.0.0.1:9",
        ]
    ),
    max_size=3,
)
trigger_fields = [
    "job_id",
    "pids",
    "all",
    "iterations",
    "iteration_roundup",
    "duration_ms",
    "record_shapes",
    "process_limit",
    "output_dir",
    "trace_id",
    "timeout_s",
    "analyze",
]
trigger_body = st.one_of(
    json_value,
    st.fixed_dictionaries(
        {"hosts": safe_hosts},
        optional={k: st.integers(-5, 5) | st.booleans() | json_value for k in trigger_fields},
    ),
)


@settings(max_examples=150 * BUDGET, **FUZZ_SETTINGS)
@given(body=trigger_body)
def test_api_trigger_bodies(app_client, body):
    client, _ = app_client
    if isinstance(body, dict) and "timeout_s" not in body:
        body["timeout_s"] = 1
    _check(client.post("/api/trigger", json=body), "POST /api/trigger")


number_text = (
    st.integers(-3, 10**20).map(str) | st.sampled_from(["1", "10", "0", "", "1.5", "1e3"]) | hostile_text
)
trigger_form = st.fixed_dictionaries(
    {
        "hosts": st.sampled_from(
            ["127.0.0.1:9", "[::1]:9", "127.0.0.1:9,[::1]:9", "", " , ", "127.0.0.1:99999"]
        )
    },
    optional={
        "target": st.sampled_from(["job", "pids", "all"]) | hostile_text,
        "job_id": hostile_text,
        "pids": st.sampled_from(["1", "1,2", "-1", "abc", "1" * 30]) | hostile_text,
        "mode": st.sampled_from(["iterations", "duration"]) | hostile_text,
        "iterations": number_text,
        "iteration_roundup": number_text,
        "duration_ms": number_text,
        "process_limit": number_text,
        "output_dir": hostile_text,
        "record_shapes": st.sampled_from(["true", "false", "on", "x"]),
        "analyze": st.sampled_from(["true", "x"]),
    },
)


@settings(max_examples=150 * BUDGET, **FUZZ_SETTINGS)
@given(form=trigger_form)
def test_trigger_form(app_client, form):
    client, _ = app_client
    form["timeout_s"] = "1"
    _check(client.post("/trigger", data=form, follow_redirects=False), "POST /trigger")


@settings(max_examples=60 * BUDGET, **FUZZ_SETTINGS)
@given(trace_id=hostile_text, api=st.booleans())
def test_analyze_actions(app_client, trace_id, api):
    client, _ = app_client
    if trace_id == TRACE_ID:
        trace_id += "-not"  # the real one would start analyses over and over
    route = "/api/traces/{}/analyze" if api else "/traces/{}/analyze"
    _check(client.post(route.format(quote(trace_id, safe="")), follow_redirects=False), "POST analyze")


def test_recorded_files_are_served_and_the_hostile_ones_are_not(app_client):
    """The fixture is what the fuzzing assumes: the real files serve, the hostile ones 404."""
    client, served = app_client
    page = client.get(f"/api/traces/{TRACE_ID}").json()
    urls = [f["url"] for f in page["trace"]["files"] if f["file"].endswith(".json")]
    assert urls and all(client.get(u).content in served for u in urls)
    for name in ("credentials.json", "link.json", "x.json", "up.json", "..%2Foutside%2Fcredentials.json"):
        r = client.get(f"/traces/{HOSTILE_ID}/files/{name}")
        assert r.status_code == 404, name
        _check(r, "hostile manifest")


def test_zz_report_counts(capsys):
    """Prints the requests tried per surface (run with -s to see them); the last test here."""
    with capsys.disabled():
        for key in sorted(_STATS):
            print(f"fuzz {key}: {_STATS[key]}")
