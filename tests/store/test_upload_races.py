"""Issue 32 follow-ups: the upload reads the file it checked (a swap for a symlink after the
check uploads nothing of the symlink's target), and ``catalog import --store`` never records a
manifest's ``path`` outside the folder (as the plain import)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from kinetoscope.protocol.manifest import ManifestError
from kinetoscope.store import Catalog, TraceStore
from kinetoscope.store import upload as upload_mod
from kinetoscope.store.upload import upload_trace_request

from .conftest import make_manifest, write_trace_dir
from .test_cli import kscope

SECRET = b'{"aws_secret_access_key": "AKIA-not-for-the-store"}'


def _request(tmp_path: Path) -> tuple[Path, dict[str, Any], Path]:
    secret = tmp_path / "secrets" / "credentials.json"
    secret.parent.mkdir(parents=True)
    secret.write_bytes(SECRET)
    m = make_manifest("kst-race-1", hosts=("node1",))
    return write_trace_dir(tmp_path / "out", m), m, secret


def _swap_for_symlink(path: Path, target: Path) -> None:
    path.unlink()
    path.symlink_to(target)


@pytest.fixture(params=["local", "s3"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[TraceStore]:
    if request.param == "local":
        yield TraceStore(str(tmp_path / "store"))
    else:
        bucket = request.getfixturevalue("s3_bucket")
        yield TraceStore(f"s3://{bucket}/traces", storage_options=request.getfixturevalue("s3_options"))


def _stored_bytes(store: TraceStore) -> list[bytes]:
    return [store.read_bytes(k) for k in store.list("")]


def test_a_swap_after_the_check_uploads_the_checked_file(
    tmp_path: Path, store: TraceStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Regression: the file was checked (``O_NOFOLLOW``) and then re-opened by path for the
    upload; a traced process swapping it for a symlink in between got the target stored. Now
    the bytes come from the descriptor that was checked."""
    d, m, secret = _request(tmp_path)
    victim = d / m["files"][0]["file"]
    original = victim.read_bytes()
    real_put = TraceStore.put_file

    def put_after_swap(self: TraceStore, local_path: Any, key: str, **kw: Any) -> Any:
        if Path(local_path).name == victim.name and not victim.is_symlink():
            _swap_for_symlink(victim, secret)  # right after the check, before the bytes are read
        return real_put(self, local_path, key, **kw)

    monkeypatch.setattr(TraceStore, "put_file", put_after_swap)
    objs = upload_trace_request(d, store)
    assert victim.is_symlink()  # the swap did happen
    stored = _stored_bytes(store)
    assert SECRET not in stored and original in stored
    by_name = {o.key.rsplit("/", 1)[-1]: o for o in objs}
    assert by_name[victim.name].bytes == len(original)
    doc = orjson.loads(store.read_bytes("kst-race-1/manifest.json"))
    assert doc["files"][0]["bytes"] == len(original)


def test_a_swap_before_the_open_is_refused(
    tmp_path: Path, store: TraceStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The swap lands between the folder check and the open: refused as opened (one line naming
    the manifest field), and nothing of the target is stored."""
    d, m, secret = _request(tmp_path)
    victim = d / m["files"][1]["file"]
    real_find = upload_mod.find_local_file

    def find_then_swap(*args: Any, **kw: Any) -> Path | None:
        found = real_find(*args, **kw)
        if found is not None and found.name == victim.name:
            _swap_for_symlink(victim, secret)
        return found

    monkeypatch.setattr(upload_mod, "find_local_file", find_then_swap)
    with pytest.raises(ManifestError) as info:
        upload_trace_request(d, store)
    msg = str(info.value)
    assert "files[1]" in msg and "symlink" in msg and "\n" not in msg, msg
    assert SECRET not in _stored_bytes(store)


def test_a_folder_swapped_after_the_check_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The file sits in a sub-folder that is swapped for a symlink to another folder after the
    check: the kernel's view of the opened file is outside the request folder, so it is refused."""
    d, m, secret = _request(tmp_path)
    sub = d / "sub"
    sub.mkdir()
    name = m["files"][1]["file"]
    (d / name).rename(sub / name)
    m["files"][1]["path"] = f"sub/{name}"
    (d / "manifest.json").write_bytes(orjson.dumps(m))
    (secret.parent / name).write_bytes(SECRET)  # what the swapped folder holds under that name
    real_find = upload_mod.find_local_file

    def find_then_swap(*args: Any, **kw: Any) -> Path | None:
        found = real_find(*args, **kw)
        if found is not None and found.parent == sub.resolve() and not sub.is_symlink():
            (sub / name).rename(d / "moved.json")
            sub.rmdir()
            sub.symlink_to(secret.parent)
        return found

    monkeypatch.setattr(upload_mod, "find_local_file", find_then_swap)
    store = TraceStore(str(tmp_path / "store"))
    with pytest.raises(ManifestError) as info:
        upload_trace_request(d, store)
    assert "outside the request folder" in str(info.value) and "files[1]" in str(info.value)
    assert SECRET not in _stored_bytes(store)


def test_import_with_store_never_records_an_outside_path(tmp_path: Path, cli_env: dict[str, str]) -> None:
    """Regression: ``catalog import --store`` recorded a manifest's outside ``path`` as given for
    an entry whose file is absent and whose path names nothing (the plain import drops it); a
    later ``kscope analyze <trace_id>`` would read whatever appears there."""
    d, m, _secret = _request(tmp_path)
    outside = tmp_path / "elsewhere" / "rank-1.json"
    (d / m["files"][1]["file"]).unlink()
    m["files"][1]["path"] = str(outside)
    (d / "manifest.json").write_bytes(orjson.dumps(m))
    for i, args in enumerate(([], ["--store", str(tmp_path / "store")])):
        url = f"sqlite:///{tmp_path}/c{i}.db"
        r = kscope("catalog", "import", str(d), "--catalog", url, *args, env=cli_env)
        assert r.returncode == 0, r.stderr
        with Catalog.open(url) as cat:
            rec = cat.get_trace_request("kst-race-1")
        assert rec is not None
        paths = [f.path for f in rec.files]
        assert str(outside) not in paths, (args, paths)
        assert all(p and Path(p).resolve().is_relative_to(d.resolve()) for p in paths), (args, paths)
        assert os.path.basename(paths[1] or "") == m["files"][1]["file"]
