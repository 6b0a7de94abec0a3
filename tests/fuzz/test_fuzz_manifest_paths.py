"""Fuzzing manifests that name files outside their folder (issue 32), for every command that
reads one: ``kscope catalog import`` (``Catalog.import_trace_dir``), ``--store`` (the upload),
``kscope analyze``/``report`` (the rank metadata read beside a trace), and the web app's
Analyze action. Each example writes a request folder whose entries' ``file``/``path`` are drawn
from hostile spellings (absolute paths, ``..``, symlinks out, a FIFO, ``/dev/zero``) of a
secret outside it. Whatever the manifest says: the secret never reaches the store, the catalog
never records its hash, nothing blocks or raises anything but a one-line ManifestError.

Inputs come from the derandomized hypothesis profile (tests/conftest.py);
``KSCOPE_FUZZ_BUDGET`` (default 1) multiplies the number of examples.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from collections import Counter
from pathlib import Path

import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kinetoscope.protocol.manifest import ManifestError

BUDGET = max(1, int(os.environ.get("KSCOPE_FUZZ_BUDGET", "1")))
SECRET = b'{"aws_secret_access_key": "MANIFEST-FUZZ-SECRET"}'
SECRET_SHA = hashlib.sha256(SECRET).hexdigest()
TRACE = b'{"traceEvents": [], "distributedInfo": {"rank": 0}}'
_STATS: Counter[str] = Counter()

# how an entry names the secret (relative spellings are relative to the request folder)
SPELLINGS = [
    "{secret}",
    "{outside}/../outside/credentials.json",
    "../outside/credentials.json",
    "../../{base}/outside/credentials.json",
    "./../outside/credentials.json",
    "sub/../../outside/credentials.json",
    "{folder}/../outside/credentials.json",
    "{folder}/link-out.json",
    "link-out.json",
    "{folder}/fifo.json",
    "fifo.json",
    "/dev/zero",
    "/proc/self/environ",
    "{folder}",
    ".",
    "",
    "{folder}/rank-0.json",
]
# what the file beside the manifest (named by ``file``) is
BESIDE = ["regular", "absent", "symlink out", "symlink in", "fifo", "dev zero"]


def _setup(base: Path, beside: str, spelling: str, which: str) -> tuple[Path, Path]:
    outside = base / "outside"
    outside.mkdir()
    secret = outside / "credentials.json"
    secret.write_bytes(SECRET)
    folder = base / "req" / "kst-fuzz-m"
    folder.mkdir(parents=True)
    (folder / "sub").mkdir()
    (folder / "rank-0.json").write_bytes(TRACE)
    (folder / "link-out.json").symlink_to(secret)
    os.mkfifo(folder / "fifo.json")
    target = folder / "rank-1.json"
    if beside == "regular":
        target.write_bytes(TRACE)
    elif beside == "symlink out":
        target.symlink_to(secret)
    elif beside == "symlink in":
        target.symlink_to(folder / "rank-0.json")
    elif beside == "fifo":
        os.mkfifo(target)
    elif beside == "dev zero":
        target.symlink_to("/dev/zero")
    path = spelling.format(secret=secret, outside=outside, base=base.name, folder=folder)
    entry = {"file": "rank-1.json", "host": "h", "pid": 2, "rank": 1, "complete": True}
    if which in ("path", "both"):
        entry["path"] = path
    if which in ("file", "both") and path and "/" not in path and path not in (".", ".."):
        entry["file"] = path
    manifest = {
        "kinetoscope_manifest": 1,
        "trace_id": "kst-fuzz-m",
        "files": [
            {"file": "rank-0.json", "host": "h", "pid": 1, "rank": 0, "complete": True},
            entry,
        ],
    }
    (folder / "manifest.json").write_bytes(orjson.dumps(manifest))
    return folder, secret


def _no_secret_in(store: Path) -> None:
    if store.exists():
        for p in store.rglob("*"):
            if p.is_file() and not p.is_symlink():
                assert p.read_bytes() != SECRET, f"the secret reached the store as {p}"


def _readers(folder: Path, work: Path) -> None:
    """Every reader of the manifest, each allowed to refuse with a ManifestError only."""
    from kinetoscope.store import Catalog
    from kinetoscope.store.upload import upload_trace_request
    from kinetoscope.trace.metadata import read_manifest_entry

    outcomes = []
    with Catalog.open(f"sqlite:///{work}/c.db") as cat:
        try:
            rec = cat.import_trace_dir(folder)
            assert all(f.sha256 != SECRET_SHA for f in rec.files), "the catalog hashed the secret"
            outcomes.append("import ok")
        except ManifestError as exc:
            assert "\n" not in str(exc) and "manifest" in str(exc)
            outcomes.append("import refused")
        store = work / "store"
        try:
            objs = upload_trace_request(folder, str(store), update_local=False)
            assert all(o.sha256 != SECRET_SHA for o in objs), "the upload stored the secret"
            outcomes.append("upload ok")
        except ManifestError as exc:
            assert "\n" not in str(exc)
            outcomes.append("upload refused")
        _no_secret_in(store)
    # kscope analyze / report: the rank metadata beside a trace (never a file the manifest names)
    entry = read_manifest_entry(folder / "rank-0.json")
    assert entry is None or entry.get("rank") == 0
    for o in outcomes:
        _STATS[o] += 1


@settings(
    max_examples=120 * BUDGET,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(
    beside=st.sampled_from(BESIDE),
    spelling=st.sampled_from(SPELLINGS),
    which=st.sampled_from(["path", "file", "both"]),
)
def test_no_reader_leaves_the_manifest_folder(beside, spelling, which):
    base = Path(tempfile.mkdtemp(prefix="kscope-fuzz-manifest-"))
    try:
        folder, _secret = _setup(base, beside, spelling, which)
        _readers(folder, base)
    finally:
        shutil.rmtree(base, ignore_errors=True)


@settings(max_examples=30 * BUDGET, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spelling=st.sampled_from(SPELLINGS), beside=st.sampled_from(BESIDE))
def test_the_web_analyze_action_never_reads_outside(spelling, beside):
    """The web app reads what the catalog recorded from a manifest: the Analyze action and the
    file routes stay inside the serving roots (the request folder is the only root here)."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from fastapi.testclient import TestClient

    from kinetoscope.web import WebSettings, create_app

    base = Path(tempfile.mkdtemp(prefix="kscope-fuzz-manifest-web-"))
    try:
        folder, _ = _setup(base, beside, spelling, "path")
        app = create_app(
            WebSettings(catalog_url=str(base / "c.db"), serve_roots=[str(folder)], default_roots=False)
        )
        with TestClient(app, raise_server_exceptions=False) as c:
            doc = orjson.loads((folder / "manifest.json").read_bytes())
            c.app.state.catalog.record_trace_request(doc)  # as an import by an older version would
            for name in ("rank-0.json", "rank-1.json"):
                r = c.get(f"/traces/kst-fuzz-m/files/{name}")
                assert r.status_code < 500 and SECRET not in r.content
            r = c.post("/api/traces/kst-fuzz-m/analyze")
            assert r.status_code == 202
            t = c.app.state.tasks.wait(r.json()["task"]["id"], 120)
            assert t is not None and t.finished
            _STATS[f"web analyze {t.state}"] += 1
            for a in c.app.state.catalog.analyses(trace_id="kst-fuzz-m"):
                assert str(base / "outside") not in " ".join(a.inputs)
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_zz_report(fuzz_counts):
    fuzz_counts["manifest paths"] += sum(_STATS.values())
