"""Who a trace belongs to: rank, world size, host, job, device type.

Rank comes from ``distributedInfo`` (written by the app's own profiler), else from a kscope
``manifest.json`` (or per-host ``manifest.<host>.json``) beside the file (on-demand traces carry
no ``distributedInfo``), else from the file name (``rank-3``, ``rank_3``, ``worker3``). Never guessed: when none applies, it is None
and ``rank_source`` is ``"unknown"``.
"""

from __future__ import annotations

import functools
import os
import re
from pathlib import Path
from typing import Any

import orjson

MANIFEST_NAME = "manifest.json"
MANIFEST_GLOB = "manifest.*.json"

_INT_TEXT = re.compile(r"\s*-?[0-9]+\s*\Z")
_RANK_IN_NAME = re.compile(r"(?:^|[^a-z0-9])(?:rank|worker)[-_]?(\d+)(?![0-9a-z])", re.IGNORECASE)


def _as_int(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and _INT_TEXT.match(value):
        return int(value)
    return None


def rank_from_filename(path: str | os.PathLike[str]) -> int | None:
    """``rank-3.json`` / ``rank_3`` / ``worker3`` -> 3; anything else -> None."""
    match = _RANK_IN_NAME.search(Path(path).name)
    return int(match.group(1)) if match else None


def manifest_paths(folder: str | os.PathLike[str]) -> list[Path]:
    """``manifest.json`` then ``manifest.*.json`` (sorted) in ``folder`` that exist."""
    d = Path(folder)
    found = []
    main = d / MANIFEST_NAME
    if main.is_file():
        found.append(main)
    try:
        found.extend(sorted(p for p in d.glob(MANIFEST_GLOB) if p.is_file() and p.name != MANIFEST_NAME))
    except OSError:
        pass
    return found


def is_manifest_name(name: str) -> bool:
    return name == MANIFEST_NAME or (name.startswith("manifest.") and name.endswith(".json"))


@functools.lru_cache(maxsize=256)
def _load_manifest(path: str, mtime_ns: int, size: int) -> dict[str, Any] | None:
    from kinetoscope.protocol.manifest import ManifestError, read_regular_bytes

    try:  # a regular file in the folder, bounded: never a FIFO, a device or a symlink out
        doc = orjson.loads(read_regular_bytes(path, follow=False))
    except (ManifestError, orjson.JSONDecodeError):
        return None
    if not isinstance(doc, dict) or not isinstance(doc.get("files"), list):
        return None
    return doc


def read_manifest(path: str | os.PathLike[str]) -> dict[str, Any] | None:
    """A parsed kscope manifest, or None if it is missing or unreadable (cached by mtime)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return _load_manifest(str(path), st.st_mtime_ns, st.st_size)


def read_manifest_entry(path: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The entry for ``path`` in a kscope manifest beside it (``manifest.json``, then
    ``manifest.<host>.json``), merged with the manifest's top-level fields; None if no manifest
    names the file. A manifest that cannot be read is ignored (the trace itself is still usable)."""
    trace_path = Path(path)
    for manifest in manifest_paths(trace_path.parent):
        doc = read_manifest(manifest)
        if doc is None:
            continue
        for entry in doc["files"]:
            if not isinstance(entry, dict):
                continue
            name = entry.get("file") or os.path.basename(str(entry.get("path", "")))
            if name == trace_path.name:
                merged = {k: v for k, v in doc.items() if k != "files"}
                merged.update(entry)
                merged["manifest"] = str(manifest)
                return merged
    return None


def resolve_rank(
    path: str, distributed_info: dict[str, Any]
) -> tuple[int | None, int | None, str, dict[str, Any] | None]:
    """(rank, world_size, rank_source, manifest_entry) for one trace file."""
    manifest_entry = read_manifest_entry(path)
    world_size = _as_int(distributed_info.get("world_size"))
    rank = _as_int(distributed_info.get("rank"))
    if rank is not None and rank >= 0:
        return rank, world_size, "distributedInfo", manifest_entry
    if manifest_entry is not None:
        m_rank = _as_int(manifest_entry.get("rank"))
        m_world = _as_int(manifest_entry.get("world_size"))
        if m_rank is not None and m_rank >= 0:
            return m_rank, world_size or m_world, "manifest", manifest_entry
        world_size = world_size or m_world
    f_rank = rank_from_filename(path)
    if f_rank is not None:
        return f_rank, world_size, "filename", manifest_entry
    return None, world_size, "unknown", manifest_entry


def infer_device_type(distributed_info: dict[str, Any], kinds: set[str], runtime_names: set[str]) -> str:
    """HTA's rule (MTIA backend, then launch API names), plus "CPU" for traces without device work."""
    backend = str(distributed_info.get("backend", ""))
    if "mtia:hccl" in backend:
        return "MTIA"
    names = " ".join(runtime_names)
    if "cudaLaunchKernel" in names or "cuLaunchKernel" in names:
        return "NVIDIA GPU"
    if "hipLaunchKernel" in names or "hipExtModuleLaunchKernel" in names:
        return "AMD GPU"
    if "runFunction" in names or "mtia_runtime" in kinds:
        return "MTIA"
    if kinds & {"kernel", "gpu_memcpy", "gpu_memset", "mtia_ccp_events"}:
        return "UNKNOWN GPU"
    return "CPU"


def apply_location(meta: Any, path: str) -> Any:
    """Fill the location-dependent fields of a ``TraceMeta`` (rank, world size, job, host) for
    the file at ``path``: ``distributedInfo`` first, then a manifest beside it, then the file
    name. Content-derived fields are left alone, so a cached trace can be re-located cheaply."""
    meta.path = str(path)
    dist = meta.distributed_info if isinstance(meta.distributed_info, dict) else {}
    rank, world, source, entry = resolve_rank(str(path), dist)
    meta.rank, meta.world_size, meta.rank_source = rank, world, source
    entry = entry or {}
    if meta.hostname is None and isinstance(entry.get("host"), str):
        meta.hostname = entry["host"]
    job = entry.get("job_id")
    meta.job_id = str(job) if job is not None else None
    meta.pid = _as_int(entry.get("pid"))
    cmd = entry.get("cmdline")
    meta.cmdline = cmd if isinstance(cmd, str) else None
    if meta.trace_id is None and isinstance(entry.get("trace_id"), str):
        meta.trace_id = entry["trace_id"]
    m_rank = _as_int(entry.get("rank"))
    if source == "distributedInfo" and m_rank is not None and m_rank != rank:
        note = (
            f"rank {rank} from distributedInfo disagrees with rank {m_rank} in {entry.get('manifest')}; "
            "using distributedInfo"
        )
        if note not in meta.warnings:
            meta.warnings.append(note)
    if source == "unknown":
        note = (
            "rank unknown: no distributedInfo.rank, no manifest entry and no rank in the file name "
            "(name the file rank-<N>.json or add a kscope manifest)"
        )
        if note not in meta.warnings:
            meta.warnings.append(note)
    return meta
