"""manifest.json: write/read round trip, merge with per-host manifests, and the analyzer's reader."""

from __future__ import annotations

import orjson
import pytest

from kinetoscope.protocol.manifest import (
    Manifest,
    ManifestError,
    ManifestFile,
    read_manifest,
    read_manifests,
    write_manifest,
)
from kinetoscope.trace.metadata import read_manifest_entry, resolve_rank


def _manifest(tmp_path, **kw) -> Manifest:
    files = [
        ManifestFile(
            file=f"rank-{r}_{4240 + r}.pt.trace.json",
            path=str(tmp_path / f"rank-{r}_{4240 + r}.pt.trace.json"),
            host="node07",
            pid=4240 + r,
            rank=r,
            local_rank=r,
            world_size=2,
            job_id="123",
            cmdline="python train.py --lr 0.1",
            bytes=1000 + r,
            complete=True,
        )
        for r in range(2)
    ]
    return Manifest(
        trace_id="kst-20261121-053012-3f9a",
        created="2026-11-21T05:30:12Z",
        config="ACTIVITIES_ITERATIONS=10",
        files=files,
        **kw,
    )


def test_round_trip(tmp_path):
    m = _manifest(tmp_path, hosts=["node07:1778"], request={"target": {"job_id": 123}})
    path = write_manifest(m, tmp_path)
    assert path == tmp_path / "manifest.json"
    back = read_manifest(tmp_path)
    assert back == m
    assert back.by_rank()[1].pid == 4241
    assert read_manifest(path) == m


def test_schema_keys_match_architecture_doc(tmp_path):
    write_manifest(_manifest(tmp_path), tmp_path)
    doc = orjson.loads((tmp_path / "manifest.json").read_bytes())
    assert doc["kinetoscope_manifest"] == 1
    assert {"trace_id", "created", "config", "files"} <= doc.keys()
    assert set(doc["files"][0]) == {
        "file",
        "path",
        "host",
        "pid",
        "rank",
        "local_rank",
        "world_size",
        "job_id",
        "cmdline",
        "bytes",
        "complete",
    }


def test_analyzer_reads_rank_from_our_manifest(tmp_path):
    m = _manifest(tmp_path)
    write_manifest(m, tmp_path)
    trace = tmp_path / "rank-1_4241.pt.trace.json"
    entry = read_manifest_entry(trace)
    assert entry is not None and entry["rank"] == 1 and entry["job_id"] == "123"
    rank, world, source, _ = resolve_rank(str(trace), {})
    assert (rank, world, source) == (1, 2, "manifest")


def test_unknown_fields_are_tolerated(tmp_path):
    doc = orjson.loads(
        orjson.dumps(
            {
                "kinetoscope_manifest": 1,
                "trace_id": "t1",
                "created": "2026-11-21T05:30:12Z",
                "config": "",
                "future": {"a": 1},
                "files": [{"file": "a.json", "path": "/a.json", "host": "h", "pid": 1, "new_field": 3}],
            }
        )
    )
    (tmp_path / "manifest.json").write_bytes(orjson.dumps(doc))
    m = read_manifest(tmp_path)
    assert m.files[0].rank is None and m.files[0].complete is False


@pytest.mark.parametrize(
    "content, message",
    [
        (b"{not json", "is not valid JSON"),
        (b'{"trace_id": "x"}', "does not follow the kinetoscope manifest schema"),
        (b'{"kinetoscope_manifest": 9, "trace_id": "x", "created": "y"}', "manifest version 9"),
    ],
)
def test_bad_manifests_say_why(tmp_path, content, message):
    (tmp_path / "manifest.json").write_bytes(content)
    with pytest.raises(ManifestError) as info:
        read_manifest(tmp_path)
    assert message in str(info.value)


def test_missing_manifest(tmp_path):
    with pytest.raises(ManifestError, match="no manifest at"):
        read_manifest(tmp_path)


def test_merge_with_per_host_manifests(tmp_path):
    trigger = _manifest(tmp_path)
    trigger.files[0].bytes, trigger.files[0].complete = None, False
    trigger.files[1].world_size = None
    write_manifest(trigger, tmp_path)
    host = _manifest(tmp_path)
    extra = ManifestFile(
        file="rank-2_9.pt.trace.json", path="/x", host="node08", pid=9, rank=2, complete=True
    )
    host.files.append(extra)
    write_manifest(host, tmp_path, name="manifest.node07.json")
    merged = read_manifests(tmp_path)
    assert [f.pid for f in merged.files] == [4240, 4241, 9]
    assert merged.files[0].complete and merged.files[0].bytes == 1000
    assert merged.files[1].world_size == 2


def test_merge_refuses_mixed_requests(tmp_path):
    write_manifest(_manifest(tmp_path), tmp_path)
    other = _manifest(tmp_path)
    other.trace_id = "other"
    write_manifest(other, tmp_path, name="manifest.h.json")
    with pytest.raises(ManifestError, match="is for trace"):
        read_manifests(tmp_path)
