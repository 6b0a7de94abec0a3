"""From what the user names (files, folders, storage URLs, catalog trace ids) to the analysis
document and its catalog record: the one pipeline `kscope analyze`, `kscope report`, the web app
and the demo share.

    run = analyze_inputs(["kst-20261121-053012-3f9a"], catalog_url="~/c.db")
    run.document      # the ``kscope analyze --json`` document (analyses + diagnosis)
    run.paths         # the local trace files that were analysed
    run.trace_id      # the catalog request, when the inputs were one

Everything goes through the analysis runner (``kinetoscope.analysis.runner``: ``run_analyses``,
``run_diagnosis``, ``build_document``); this module only resolves inputs and summarises.
"""

from __future__ import annotations

import os
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kinetoscope.errors import KinetoscopeError, UsageError
from kinetoscope.protocol.defaults import TRACE_SUFFIXES

ANALYSIS_NAME = "analyze"  # the catalog name shared with `kscope analyze` and the web app


class InputError(KinetoscopeError):
    """An input names nothing that can be analysed (message says which and why)."""


@dataclass
class ResolvedInputs:
    """Local trace files for a set of user inputs."""

    paths: list[Path] = field(default_factory=list)
    inputs: list[str] = field(default_factory=list)  # as given (recorded in the catalog)
    trace_id: str | None = None  # set when every input resolved to one catalog request
    notes: list[str] = field(default_factory=list)


@dataclass
class AnalysisRun:
    document: dict[str, Any]
    paths: list[Path]
    inputs: list[str]
    trace_id: str | None = None
    notes: list[str] = field(default_factory=list)


def _is_url(text: str) -> bool:
    return "://" in text and not text.startswith("file://")


def _trace_files_in(d: Path) -> list[Path]:
    return sorted(
        f for f in d.iterdir()
        if f.is_file() and f.name.endswith(TRACE_SUFFIXES) and not f.name.startswith("manifest")
    )


def request_files(record: Any, *, cache_dir: str | os.PathLike[str] | None = None) -> list[Path]:
    """Local copies of the files of a catalog request (``TraceRequestRecord``).

    A file whose recorded ``path`` exists here is used in place; otherwise it is downloaded
    from its ``storage_url`` (verified, into the fetch cache) — the whole request at once when
    the request has a ``store_url``. Incomplete files (``complete`` false) are skipped."""
    from kinetoscope.store import fetch

    files = [f for f in record.files if f.complete is not False]
    if not files:
        raise InputError(f"trace {record.trace_id}: the catalog lists no complete trace file")
    out: list[Path] = []
    missing = []
    for f in files:
        if f.path and Path(f.path).is_file():
            out.append(Path(f.path))
        else:
            missing.append(f)
    if not missing:
        return out
    if record.store_url:
        from kinetoscope.store.storage import join_url

        folder = Path(fetch(join_url(record.store_url, record.trace_id), cache_dir))
        for f in missing:
            p = folder / f.file
            if not p.is_file():
                raise InputError(f"trace {record.trace_id}: {f.file} is not in the stored request {record.store_url}")
            out.append(p)
        return out
    for f in missing:
        if f.storage_url:
            out.append(Path(fetch(f.storage_url, cache_dir)))
        else:
            raise InputError(
                f"trace {record.trace_id}: {f.file} is not on this machine ({f.path or 'no path recorded'}) "
                "and has no storage URL (upload the request with `kscope catalog import --store URL`)"
            )
    return out


def resolve_inputs(
    inputs: Sequence[str | os.PathLike[str]],
    *,
    catalog: Any = None,
    catalog_url: str | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
) -> ResolvedInputs:
    """Files, folders (their ``*.json``/``*.json.gz`` but not manifests), storage URLs
    (``s3://bucket/traces/<trace_id>[/file]``, downloaded with ``kinetoscope.store.fetch``) and
    catalog trace ids (any input that is neither an existing path nor a URL), in that order of
    interpretation. ``catalog`` is an open ``Catalog``; else ``catalog_url`` (None: the default
    catalog) is opened only if a trace id needs it."""
    if not inputs:
        raise UsageError("give at least one trace file, folder, storage URL or trace id")
    res = ResolvedInputs(inputs=[os.fspath(i) for i in inputs])
    trace_ids: set[str] = set()
    opened = None
    try:
        for raw in res.inputs:
            p = Path(os.path.expanduser(raw.removeprefix("file://")))
            if _is_url(raw):
                from kinetoscope.store import fetch

                local = Path(fetch(raw, cache_dir))
                res.paths.extend(_trace_files_in(local) if local.is_dir() else [local])
                continue
            if p.is_dir():
                found = _trace_files_in(p)
                if not found:
                    raise InputError(f"{raw}: no trace files (*.json, *.json.gz) in this folder")
                res.paths.extend(found)
                continue
            if p.is_file():
                res.paths.append(p)
                continue
            if "/" in raw or raw.endswith(TRACE_SUFFIXES):
                raise InputError(f"{raw}: no such file or folder")
            if catalog is None:
                from kinetoscope.store import Catalog

                opened = catalog = Catalog.open(catalog_url)
            rec = catalog.get_trace_request(raw)
            if rec is None:
                raise InputError(
                    f"{raw}: not a file or folder, and the catalog {catalog.display_url} has no trace with this id "
                    "(`kscope traces` lists them)"
                )
            res.paths.extend(request_files(rec, cache_dir=cache_dir))
            trace_ids.add(rec.trace_id)
    finally:
        if opened is not None:
            opened.close()
    if len(trace_ids) == 1 and len(res.inputs) == 1:
        res.trace_id = trace_ids.pop()
    # the same file named twice (a folder and a file in it) is analysed once
    seen: set[Path] = set()
    uniq = []
    for p in res.paths:
        key = p.resolve()
        if key not in seen:
            seen.add(key)
            uniq.append(p)
    res.paths = uniq
    return res


def diagnosis_options(model_flops: float | None, peak_flops: float | None) -> dict[str, float]:
    """The ``diagnose`` keywords the user gave (``--model-flops``/``--peak-flops``), unset ones left out."""
    return {k: v for k, v in {"model_flops": model_flops, "peak_flops": peak_flops}.items() if v is not None}


def analyze_paths(
    paths: Sequence[str | os.PathLike[str]],
    *,
    names: Sequence[str] | None = None,
    options: Mapping[str, Any] | None = None,
    model_flops: float | None = None,
    peak_flops: float | None = None,
    cache: bool = True,
    salvage: bool = False,
    cache_dir: str | os.PathLike[str] | None = None,
    backend: str | None = None,
    workers: int | None = None,
    ray_address: str | None = None,
) -> dict[str, Any]:
    """Load the traces and build the analysis document: ``run_analyses`` (default analyses
    unless ``names``), the job diagnosis (``run_diagnosis``) and ``build_document``.

    ``backend`` (``"local"`` process pool or ``"ray"``) analyses the files as a map/reduce
    (``kinetoscope.scale``: one rank per worker, only small results on the driver; the same
    document, and a file that fails to load is an ``errors`` entry instead of an exception).
    ``None`` (default): everything in this process, as below."""
    from kinetoscope.analysis.runner import build_document, run_analyses
    from kinetoscope.diagnosis.document import run_diagnosis
    from kinetoscope.trace import load_traces

    diag_opts = diagnosis_options(model_flops, peak_flops)
    if backend is not None:
        from kinetoscope.scale import analyze_files

        return analyze_files(
            paths, backend=backend, workers=workers, ray_address=ray_address, names=names, options=options,
            diagnosis_options=diag_opts, cache=cache, salvage=salvage, cache_dir=cache_dir,
        ).document
    traces = load_traces([os.fspath(p) for p in paths], cache=cache, salvage=salvage, cache_dir=cache_dir)
    if not traces:
        raise InputError("no trace files to analyse")
    results = run_analyses(traces, names, options)
    diagnosis = run_diagnosis(traces, results, **diag_opts)
    return build_document(traces, results, diagnosis=diagnosis)


def analyze_inputs(
    inputs: Sequence[str | os.PathLike[str]],
    *,
    catalog: Any = None,
    catalog_url: str | None = None,
    fetch_cache_dir: str | os.PathLike[str] | None = None,
    **analysis_options: Any,
) -> AnalysisRun:
    """``resolve_inputs`` + ``analyze_paths`` (keyword options as there)."""
    res = resolve_inputs(inputs, catalog=catalog, catalog_url=catalog_url, cache_dir=fetch_cache_dir)
    doc = analyze_paths(res.paths, **analysis_options)
    return AnalysisRun(document=doc, paths=res.paths, inputs=res.inputs, trace_id=res.trace_id, notes=res.notes)


def document_summary(doc: Mapping[str, Any]) -> dict[str, Any]:
    """The catalog's listing fields of an analysis document (``record_analysis(summary=...)``):
    ``step_time_ms`` (median over steps of the median over ranks), ``straggler_kind``,
    ``straggler_ranks``, ``world_size``, plus ``mfu`` and ``verdict`` (first diagnosis line)."""
    out: dict[str, Any] = {}
    steps = doc.get("steps")
    per_step: dict[Any, list[float]] = {}
    if isinstance(steps, list):
        for row in steps:
            if isinstance(row, Mapping) and isinstance(row.get("step_time(us)"), (int, float)):
                per_step.setdefault(row.get("step"), []).append(float(row["step_time(us)"]))
    if not per_step and isinstance(doc.get("step_durations"), list):
        for row in doc["step_durations"]:
            if isinstance(row, Mapping) and isinstance(row.get("duration(us)"), (int, float)):
                per_step.setdefault(row.get("step"), []).append(float(row["duration(us)"]))
    if per_step:
        out["step_time_ms"] = statistics.median(statistics.median(v) for v in per_step.values()) / 1000.0
    strag = doc.get("stragglers")
    if isinstance(strag, Mapping):
        if strag.get("kind") is not None:
            out["straggler_kind"] = str(strag["kind"])
        ranks = strag.get("ranks")
        if isinstance(ranks, list):
            out["straggler_ranks"] = list(ranks)
    job = doc.get("job")
    if isinstance(job, Mapping) and isinstance(job.get("world_size"), int):
        out["world_size"] = job["world_size"]
    else:
        sizes = {t.get("world_size") for t in doc.get("traces") or [] if isinstance(t, Mapping)}
        sizes.discard(None)
        if len(sizes) == 1:
            out["world_size"] = sizes.pop()
    mfu = doc.get("mfu")
    if isinstance(mfu, Mapping) and isinstance(mfu.get("mfu"), (int, float)):
        out["mfu"] = mfu["mfu"]
    summary = doc.get("diagnosis_summary")
    if isinstance(summary, list) and summary:
        out["verdict"] = str(summary[0])
    return out


def record_run(catalog: Any, run: AnalysisRun, *, report_path: str | None = None) -> Any:
    """Record the analysis of ``run`` in an open catalog; returns the ``AnalysisRecord``.

    Inputs are the trace id for a catalog request (so the web app and ``kscope report TRACE_ID``
    share one record), else the analysed files."""
    import kinetoscope

    summary = document_summary(run.document)
    if report_path:
        summary["report"] = str(report_path)
    inputs: list[str] = [run.trace_id] if run.trace_id else [str(p) for p in run.paths]
    return catalog.record_analysis(
        inputs, run.document, name=ANALYSIS_NAME, version=kinetoscope.__version__, summary=summary,
        trace_id=run.trace_id,
    )
