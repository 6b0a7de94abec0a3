"""TraceStore on local paths (NFS behaves the same: a mounted path)."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kinetoscope.store.retry import RetryPolicy
from kinetoscope.store.storage import TMP_MARK, StoreError, TraceStore, sha256_file

from .conftest import REPO_ROOT

FAST = RetryPolicy(attempts=3, base_delay=0.01, max_delay=0.02)


def _src(tmp_path: Path, data: bytes = b"x" * 100_000, name: str = "rank-0_1.pt.trace.json") -> Path:
    p = tmp_path / "src" / name
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_bytes(data)
    return p


def _no_temp_files(root: Path) -> bool:
    return not [p for p in root.rglob("*") if TMP_MARK in p.name]


def test_put_get_list_exists_sha256(tmp_path: Path) -> None:
    data = os.urandom(300_000)
    src = _src(tmp_path, data)
    store = TraceStore(tmp_path / "store", retry=FAST)
    obj = store.put_file(src, "kst-1/rank-0_1.pt.trace.json")
    assert obj.sha256 == hashlib.sha256(data).hexdigest()
    assert obj.bytes == len(data) and obj.verified == "sha256" and obj.uploaded
    assert obj.url == str(tmp_path / "store" / "kst-1" / "rank-0_1.pt.trace.json")
    assert Path(obj.url).read_bytes() == data
    assert store.exists("kst-1/rank-0_1.pt.trace.json")
    assert not store.exists("kst-1/nope.json")
    assert store.list() == ["kst-1/rank-0_1.pt.trace.json"]
    assert store.list("kst-1") == ["kst-1/rank-0_1.pt.trace.json"]
    assert store.list("kst-2") == []
    with store.open("kst-1/rank-0_1.pt.trace.json") as f:
        assert f.read() == data
    out = store.get_file(
        "kst-1/rank-0_1.pt.trace.json", tmp_path / "dl" / "x.json", expected_sha256=obj.sha256
    )
    assert out.read_bytes() == data
    assert _no_temp_files(tmp_path)


def test_put_is_idempotent_and_overwrites_changed_content(tmp_path: Path) -> None:
    src = _src(tmp_path, b"one")
    store = TraceStore(tmp_path / "store", retry=FAST)
    first = store.put_file(src, "a/b.json")
    again = store.put_file(src, "a/b.json")
    assert again.sha256 == first.sha256 and not again.uploaded
    src.write_bytes(b"two!")
    changed = store.put_file(src, "a/b.json")
    assert changed.uploaded and store.read_bytes("a/b.json") == b"two!"
    b = store.put_bytes(b'{"m": 1}', "a/manifest.json")
    assert b.sha256 == hashlib.sha256(b'{"m": 1}').hexdigest()
    assert not store.put_bytes(b'{"m": 1}', "a/manifest.json").uploaded


def test_expected_sha256_mismatch_leaves_nothing(tmp_path: Path) -> None:
    src = _src(tmp_path)
    store = TraceStore(tmp_path / "store", retry=FAST)
    with pytest.raises(StoreError, match="expected sha256"):
        store.put_file(src, "k/f.json", expected_sha256="0" * 64)
    assert not store.exists("k/f.json")
    assert _no_temp_files(tmp_path / "store")


def test_failed_copy_leaves_nothing_at_final_name(tmp_path: Path) -> None:
    # A directory where the final file should go: the commit (rename) fails for real.
    src = _src(tmp_path)
    store = TraceStore(tmp_path / "store", retry=FAST)
    (tmp_path / "store" / "k" / "f.json").mkdir(parents=True)
    with pytest.raises(StoreError, match="upload of"):
        store.put_file(src, "k/f.json")
    assert _no_temp_files(tmp_path / "store")


@pytest.mark.parametrize("where", ["store_on_shm", "source_on_shm"])
def test_cross_filesystem(tmp_path: Path, where: str) -> None:
    shm = Path("/dev/shm")
    if not shm.is_dir() or not os.access(shm, os.W_OK):
        pytest.skip("/dev/shm is not available here")
    if os.stat(shm).st_dev == os.stat(tmp_path).st_dev:
        pytest.skip("/dev/shm is on the same filesystem as the test tmp dir")
    import tempfile

    other = Path(tempfile.mkdtemp(prefix="kscope-test-", dir=shm))
    try:
        data = os.urandom(50_000)
        if where == "store_on_shm":
            src, root = _src(tmp_path, data), other / "store"
        else:
            src, root = _src(other, data), tmp_path / "store"
        store = TraceStore(root, retry=FAST)
        obj = store.put_file(src, "kst/f.json")
        assert Path(obj.url).read_bytes() == data and obj.sha256 == hashlib.sha256(data).hexdigest()
        assert _no_temp_files(root)
    finally:
        import shutil

        shutil.rmtree(other, ignore_errors=True)


def test_interrupted_upload_never_shows_partial_file(tmp_path: Path) -> None:
    """Kill the uploading process mid-copy: the final name must not exist (only a temp file)."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    root = tmp_path / "store"
    code = (
        "import sys; from kinetoscope.store.storage import TraceStore; "
        "TraceStore(sys.argv[1]).put_file(sys.argv[2], 'kst/big.json')"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    proc = subprocess.Popen([sys.executable, "-c", code, str(root), str(fifo)], env=env)
    try:
        with open(fifo, "wb") as w:  # blocks until the child opens the FIFO for reading
            w.write(b"y" * (6 * 2**20))
            w.flush()
            # wait until the child has written some bytes into its temporary file
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                tmps = [p for p in root.rglob("*") if TMP_MARK in p.name] if root.exists() else []
                if tmps and tmps[0].stat().st_size > 0:
                    break
                time.sleep(0.05)
            else:
                pytest.fail("child never started writing")
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=30)
    except BrokenPipeError:
        pass
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    store = TraceStore(root)
    assert not store.exists("kst/big.json")
    assert store.list() == []  # temporary names are never listed
    assert store.cleanup_temporary(older_than_s=0) == 1
    assert _no_temp_files(root)


def test_bad_keys_and_missing_source(tmp_path: Path) -> None:
    store = TraceStore(tmp_path / "store", retry=FAST)
    for key in ["", "/abs", "a/../b", "a//b", "./a", "a\\b"]:
        with pytest.raises(StoreError, match="invalid storage key"):
            store.put_bytes(b"x", key)
    with pytest.raises(StoreError, match="no such file"):
        store.put_file(tmp_path / "missing.json", "a/b")
    with pytest.raises(StoreError, match="read-only"):
        store.open("a/b", "wb")
    with pytest.raises(StoreError, match="No such file|not found|failed"):
        store.get_file("a/missing", tmp_path / "x")


def test_file_url_and_sha256_helper(tmp_path: Path) -> None:
    src = _src(tmp_path, b"abc")
    store = TraceStore(f"file://{tmp_path}/s")
    assert store.url == str(tmp_path / "s") and store.is_local
    obj = store.put_file(src, "x/y")
    assert sha256_file(obj.url) == (hashlib.sha256(b"abc").hexdigest(), 3)


def test_keys_never_escape_the_store_root(tmp_path: Path) -> None:
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from kinetoscope.store.storage import check_key

    root = (tmp_path / "root").resolve()
    segment = st.sampled_from(["..", ".", "", "a", "b.json", "~", "x\\y", "/", ".kscope-tmp-1"])

    @settings(max_examples=60, deadline=None, database=None)
    @given(st.lists(st.one_of(segment, st.text(alphabet="ab./\\~-_ ", max_size=4)), min_size=1, max_size=5))
    def check(parts: list[str]) -> None:
        key = "/".join(parts)
        try:
            check_key(key)
        except StoreError:
            return
        target = root.joinpath(*key.split("/")).resolve()
        assert target != root and root in target.parents

    check()
