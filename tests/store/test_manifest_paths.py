"""Issue 32, item 3: a manifest's ``file``/``path`` never makes a command read outside the
manifest's folder (``kscope catalog import [--store]``, the upload, the analyzer's metadata), and
a disk-full upload is recorded in the catalog as partial (item 15)."""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from kinetoscope.protocol.manifest import ManifestError, find_local_file, folder_file, load_trace_dir
from kinetoscope.store import Catalog
from kinetoscope.store.upload import upload_trace_request

from .conftest import REPO_ROOT, make_manifest, write_trace_dir
from .test_cli import assert_one_line_error, kscope

SECRET = b'{"aws_secret_access_key": "AKIA-not-for-the-store"}'


def _request_with(tmp_path: Path, mutate) -> tuple[Path, Path]:
    """A request folder of 2 files whose manifest ``mutate`` points elsewhere; and the secret."""
    secret = tmp_path / "home" / "credentials.json"
    secret.parent.mkdir(parents=True, exist_ok=True)
    secret.write_bytes(SECRET)
    m = make_manifest("kst-evil-1", hosts=("node1",))
    d = write_trace_dir(tmp_path / "out", m)
    mutate(d, m, secret)
    (d / "manifest.json").write_bytes(orjson.dumps(m))
    return d, secret


def _path_to_secret(d: Path, m: dict, secret: Path) -> None:
    (d / m["files"][1]["file"]).unlink()
    m["files"][1]["path"] = str(secret)


def _dotdot_to_secret(d: Path, m: dict, secret: Path) -> None:
    (d / m["files"][1]["file"]).unlink()
    m["files"][1]["path"] = os.path.relpath(secret, d)  # ../../home/credentials.json


def _symlink_to_secret(d: Path, m: dict, secret: Path) -> None:
    f = d / m["files"][1]["file"]
    f.unlink()
    f.symlink_to(secret)


def _fifo_file(d: Path, m: dict, secret: Path) -> None:
    f = d / m["files"][1]["file"]
    f.unlink()
    os.mkfifo(f)


EVIL = {
    "absolute path": (_path_to_secret, "files[1].path"),
    "dot-dot path": (_dotdot_to_secret, "files[1].path"),
    "symlink out": (_symlink_to_secret, "files[1].file"),
    "FIFO": (_fifo_file, "files[1].file"),
}


@pytest.mark.parametrize("case", sorted(EVIL))
def test_upload_refuses_files_outside_the_folder(tmp_path: Path, case: str) -> None:
    """Regression: ``upload_trace_request`` uploaded the file ``path`` named wherever it was (a
    credentials file ended up in the store)."""
    mutate, field = EVIL[case]
    d, _secret = _request_with(tmp_path, mutate)
    store = tmp_path / "store"
    with pytest.raises(ManifestError) as info:
        upload_trace_request(d, str(store))
    msg = str(info.value)
    assert str(d / "manifest.json") in msg and field in msg and "\n" not in msg, msg
    stored = [p.read_bytes() for p in store.rglob("*") if p.is_file()] if store.exists() else []
    assert SECRET not in stored


@pytest.mark.parametrize("case", sorted(EVIL))
@pytest.mark.parametrize("with_store", [False, True])
def test_cli_catalog_import_refuses_files_outside_the_folder(
    tmp_path: Path, cli_env: dict[str, str], case: str, with_store: bool
) -> None:
    mutate, field = EVIL[case]
    d, _secret = _request_with(tmp_path, mutate)
    store = tmp_path / "store"
    args = ["catalog", "import", str(d), "--catalog", f"sqlite:///{tmp_path}/c.db"]
    r = kscope(*args, *(["--store", str(store)] if with_store else []), env=cli_env)
    assert_one_line_error(r, "manifest.json", field)
    if store.exists():
        assert SECRET not in [p.read_bytes() for p in store.rglob("*") if p.is_file()]


def test_a_missing_file_elsewhere_is_not_recorded_as_a_local_path(tmp_path: Path) -> None:
    """Another host's file (nothing at its path here) is fine, but the catalog does not record
    a path outside the folder: ``kscope analyze <trace_id>`` would read whatever appears there."""
    outside = tmp_path / "elsewhere" / "rank-1.json"

    def mutate(d: Path, m: dict, _s: Path) -> None:
        (d / m["files"][1]["file"]).unlink()
        m["files"][1]["path"] = str(outside)

    d, _ = _request_with(tmp_path, mutate)
    with Catalog.open(f"sqlite:///{tmp_path}/c.db") as cat:
        rec = cat.import_trace_dir(d)
    paths = [f.path for f in rec.files]
    assert str(outside) not in paths and all(p and p.startswith(str(d)) for p in paths), paths


def test_files_inside_the_folder_still_work(tmp_path: Path) -> None:
    """A symlink that stays inside the folder, and ``path`` naming the file beside the manifest
    under another spelling, are read as before."""
    m = make_manifest("kst-ok-1", hosts=("node1",))
    d = write_trace_dir(tmp_path / "out", m)
    sub = d / "sub"
    sub.mkdir()
    real = d / m["files"][0]["file"]
    (sub / "moved.json").write_bytes(real.read_bytes())
    real.unlink()
    real.symlink_to(sub / "moved.json")
    m["files"][1]["path"] = f"{d}/sub/../{m['files'][1]['file']}"
    (d / "manifest.json").write_bytes(orjson.dumps(m))
    doc = load_trace_dir(d)
    assert find_local_file(d, doc["files"][0]) == (sub / "moved.json").resolve()
    assert find_local_file(d, doc["files"][1], index=1) == (d / m["files"][1]["file"]).resolve()
    objs = upload_trace_request(d, str(tmp_path / "store"))
    assert len(objs) == 3  # 2 files + manifest


@pytest.mark.parametrize("kind", ["symlink", "fifo", "device"])
def test_a_manifest_that_is_not_a_regular_file_is_refused(tmp_path: Path, kind: str) -> None:
    """``manifest.json`` itself: a symlink out, a FIFO (would block) or a device (endless) is a
    one-line ManifestError, never a read."""
    d = tmp_path / "req"
    d.mkdir()
    target = d / "manifest.json"
    if kind == "symlink":
        other = tmp_path / "other.json"
        other.write_bytes(orjson.dumps(make_manifest("kst-x")))
        target.symlink_to(other)
    elif kind == "fifo":
        os.mkfifo(target)
    else:
        target.symlink_to("/dev/zero")
    with pytest.raises(ManifestError, match="refused"):
        load_trace_dir(d)


def test_the_analyzer_ignores_a_fifo_manifest(tmp_path: Path) -> None:
    """The analyzer reads the manifest beside a trace for ranks: a FIFO there must not block it
    (a subprocess, so a hang fails the test instead of hanging the suite)."""
    d = tmp_path / "req"
    d.mkdir()
    (d / "rank-3.json").write_bytes(b'{"traceEvents": []}')
    os.mkfifo(d / "manifest.json")
    code = "from kinetoscope.trace import load_trace; import sys; print(load_trace(sys.argv[1], cache=False).meta.rank)"
    out = subprocess.run(
        [sys.executable, "-c", code, str(d / "rank-3.json")],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
    )
    assert out.returncode == 0 and out.stdout.strip() == "3", out.stderr


def test_folder_file_names_the_field(tmp_path: Path) -> None:
    with pytest.raises(ManifestError, match=r"m\.json: files\[7\]\.path '/etc/passwd' leads outside"):
        folder_file(tmp_path, "/etc/passwd", source="m.json", field="files[7].path")
    assert folder_file(tmp_path, "absent.json", source="m.json", field="files[0].file") is None


# ---- a disk-full upload (item 15) -----------------------------------------------------------
def _limit_file_size() -> None:
    """In the child: files over 64 KiB cannot be written (EFBIG, as on a full disk)."""
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (64 << 10, 64 << 10))


def test_a_disk_full_upload_is_recorded_as_partial(tmp_path: Path, cli_env: dict[str, str]) -> None:
    """Regression: an upload that failed on the 4th of 5 files left 3 files in the store and the
    catalog said nothing. Now the request is recorded with status ``partial`` and the reason,
    and re-running the command (room again) completes it."""
    m = make_manifest("kst-full-1", hosts=("node1",), ranks_per_host=5)
    d = write_trace_dir(tmp_path / "out", m)
    for i, e in enumerate(m["files"]):  # files 3 and 4 are over the child's file size limit
        (d / e["file"]).write_bytes(
            b'{"traceEvents": [], "pad": "' + b"x" * (200_000 if i >= 3 else 100) + b'"}'
        )
        e.pop("bytes")
    (d / "manifest.json").write_bytes(orjson.dumps(m))
    catalog_url = f"sqlite:///{tmp_path}/c.db"
    with Catalog.open(catalog_url):
        pass  # create the database first: its file must not hit the child's limit
    store = tmp_path / "store"
    args = ["catalog", "import", str(d), "--catalog", catalog_url, "--store", str(store)]
    r = subprocess.run(
        [sys.executable, "-m", "kinetoscope.cli.main", *args],
        env=cli_env,
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=180,
        preexec_fn=_limit_file_size,
    )
    assert_one_line_error(r, "3 of 5 files")
    with Catalog.open(catalog_url) as cat:
        rec = cat.get_trace_request("kst-full-1")
    assert rec is not None and rec.status == "partial"
    assert "3 of 5 files stored" in rec.manifest["store_error"]
    assert sum(1 for f in rec.files if f.storage_url) == 3
    assert not (store / "kst-full-1" / "manifest.json").exists()  # readers: not uploaded
    r = kscope(*args, env=cli_env)  # room again: the same command finishes it
    assert r.returncode == 0, r.stderr
    with Catalog.open(catalog_url) as cat:
        rec = cat.get_trace_request("kst-full-1")
    assert rec.status == "complete" and sum(1 for f in rec.files if f.storage_url) == 5
