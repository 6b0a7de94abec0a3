"""From what the user names (files, folders, storage URLs, catalog trace ids) to the analysis
document and its catalog record: the one ``analyze()`` that ``kscope analyze``, ``kscope
report``, the web app, the autopilot and the demo share, whatever the backend.

    run = analyze(AnalyzeRequest(inputs=("kst-20261121-053012-3f9a",), backend="local"))
    run.document      # the ``kscope analyze --json`` document (analyses + diagnosis)
    run.paths         # the local trace files that were analysed
    run.trace_id      # the catalog request, when the inputs were one

The request (``AnalyzeRequest``, ``kinetoscope/scale/request.py``) is the one typed description
of a run: inputs, analyses and their options, diagnosis options, caches and the backend
(``single`` process, ``local`` pool, ``ray``). Inputs are resolved by the pluggable discovery of
``kinetoscope.trace.discover`` (paths) with the URL and trace-id resolvers here; the analysis
itself is ``kinetoscope.scale.run_analysis``, the one orchestration (a single process or a
map/reduce). ``analyze_paths`` (local files -> the document) and ``analyze_inputs`` (the request
as keywords) are thin aliases of the same call. This module only resolves inputs, runs and
records; the summary it records is ``kinetoscope.document.summarize``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kinetoscope.errors import UsageError
from kinetoscope.scale.request import AnalyzeRequest

if TYPE_CHECKING:
    from kinetoscope.trace.discover import InputError, Resolver


def __getattr__(name: str) -> Any:
    """``InputError`` lives with the discovery (``kinetoscope.trace.discover``); imported on
    first use so that importing this module stays free of Polars."""
    if name == "InputError":
        from kinetoscope.trace.discover import InputError

        return InputError
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


ANALYSIS_NAME = "analyze"  # the catalog name shared with `kscope analyze` and the web app

__all__ = [
    "ANALYSIS_NAME",
    "AnalysisRun",
    "AnalyzeRequest",
    "InputError",
    "ResolvedInputs",
    "analyze",
    "resolve_inputs",
]


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
    scale: Any = None  # the kinetoscope.scale.ScaleRun behind the document (traces, results, backend)


def _is_url(text: str) -> bool:
    return "://" in text and not text.startswith("file://")


def request_files(record: Any, *, cache_dir: str | os.PathLike[str] | None = None) -> list[Path]:
    """Local copies of the files of a catalog request (``TraceRequestRecord``).

    A file whose recorded ``path`` exists here is used in place when it lies in this request's
    folder (:func:`_in_request_folder`); a recorded path anywhere else is an ``InputError``
    naming the trace id and file (a catalog row must not make the analyzer read an arbitrary
    file). Otherwise the file is downloaded from its ``storage_url`` (verified, into the fetch
    cache) — the whole request at once when the request has a ``store_url``. Incomplete files
    (``complete`` false) are skipped."""
    from kinetoscope.store import fetch
    from kinetoscope.trace.discover import InputError

    files = [f for f in record.files if f.complete is not False]
    if not files:
        raise InputError(f"trace {record.trace_id}: the catalog lists no complete trace file")
    out: list[Path] = []
    missing = []
    folders: dict[Path, bool] = {}
    for f in files:
        if f.path and os.path.lexists(f.path):
            real = Path(f.path).resolve()
            if not _in_request_folder(real, record.trace_id, folders):
                raise InputError(
                    f"trace {record.trace_id}: {f.file}: recorded path {f.path} is not in a request "
                    f"folder of {record.trace_id} (leads to {real}): refused; only files of the "
                    "request's folder or its store are read"
                )
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
                raise InputError(
                    f"trace {record.trace_id}: {f.file} is not in the stored request {record.store_url}"
                )
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


def _in_request_folder(real: Path, trace_id: str, seen: dict[Path, bool]) -> bool:
    """Whether the resolved file ``real`` lies in a request folder of ``trace_id``: the nearest
    folder above it (at most ``_FOLDER_DEPTH`` levels up) that holds a manifest
    (``manifest.json`` or ``manifest.<host>.json``, what every kscope request folder has) is
    that request's. ``seen`` caches the answer per folder."""
    from kinetoscope.errors import KinetoscopeError
    from kinetoscope.protocol.manifest import MANIFEST_NAME, host_manifests, load_trace_dir

    for folder in list(real.parents)[:_FOLDER_DEPTH]:
        if folder in seen:
            return seen[folder]
        if not (os.path.lexists(folder / MANIFEST_NAME) or host_manifests(folder)):
            continue
        try:
            seen[folder] = load_trace_dir(folder).get("trace_id") == trace_id
        except (KinetoscopeError, OSError):
            seen[folder] = False
        return seen[folder]
    return False


_FOLDER_DEPTH = 4  # a request's files sit in its folder, or a few sub-folders down


class UrlResolver:
    """A storage URL (``s3://bucket/traces/<trace_id>[/file]``): downloaded with
    ``kinetoscope.store.fetch`` (verified, cached), a folder expanded to its trace files."""

    def __init__(self, cache_dir: str | os.PathLike[str] | None = None) -> None:
        self.cache_dir = cache_dir

    def resolve(self, raw: str) -> list[Path] | None:
        if not _is_url(raw):
            return None
        from kinetoscope.store import fetch
        from kinetoscope.trace.discover import trace_files_in

        local = Path(fetch(raw, self.cache_dir))
        return trace_files_in(local) if local.is_dir() else [local]


class TraceIdResolver:
    """A catalog trace id (anything else): the request's files (``request_files``). The
    catalog (``catalog``, else ``catalog_url``) is opened only when an id needs it; ``ids``
    collects the ids resolved."""

    def __init__(
        self,
        catalog: Any = None,
        catalog_url: str | None = None,
        cache_dir: str | os.PathLike[str] | None = None,
    ) -> None:
        self.catalog, self.catalog_url, self.cache_dir = catalog, catalog_url, cache_dir
        self.ids: set[str] = set()
        self._opened: Any = None

    def resolve(self, raw: str) -> list[Path] | None:
        if self.catalog is None:
            from kinetoscope.store import Catalog

            self._opened = self.catalog = Catalog.open(self.catalog_url)
        from kinetoscope.trace.discover import InputError

        rec = self.catalog.get_trace_request(raw)
        if rec is None:
            raise InputError(
                f"{raw}: not a file or folder, and the catalog {self.catalog.display_url} has no trace with this id "
                "(`kscope traces` lists them)"
            )
        self.ids.add(rec.trace_id)
        return request_files(rec, cache_dir=self.cache_dir)

    def close(self) -> None:
        if self._opened is not None:
            self._opened.close()
            self._opened = None


def resolve_inputs(
    inputs: Sequence[str | os.PathLike[str]],
    *,
    catalog: Any = None,
    catalog_url: str | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
) -> ResolvedInputs:
    """Files, folders (their ``*.json``/``*.json.gz`` but not manifests), storage URLs
    (``s3://bucket/traces/<trace_id>[/file]``, downloaded with ``kinetoscope.store.fetch``) and
    catalog trace ids (any input that is neither an existing path nor a URL), resolved in that
    order by ``trace.discover.discover`` (resolvers: ``UrlResolver``, ``PathResolver``,
    ``TraceIdResolver``). ``catalog`` is an open ``Catalog``; else ``catalog_url`` (None: the
    default catalog) is opened only if a trace id needs it."""
    from kinetoscope.trace.discover import PathResolver, discover

    if not inputs:
        raise UsageError("give at least one trace file, folder, storage URL or trace id")
    res = ResolvedInputs(inputs=[os.fspath(i) for i in inputs])
    ids = TraceIdResolver(catalog, catalog_url, cache_dir)
    chain: list[Resolver] = [UrlResolver(cache_dir), PathResolver(), ids]
    try:
        res.paths = discover(res.inputs, chain)
    finally:
        ids.close()
    if len(ids.ids) == 1 and len(res.inputs) == 1:
        res.trace_id = next(iter(ids.ids))
    return res


def diagnosis_options(model_flops: float | None, peak_flops: float | None) -> dict[str, float]:
    """The ``diagnose`` keywords the user gave (``--model-flops``/``--peak-flops``), unset ones left out."""
    return AnalyzeRequest(model_flops=model_flops, peak_flops=peak_flops).diagnosis_options()


def analyze(
    request: AnalyzeRequest,
    *,
    catalog: Any = None,
    progress: Callable[[int, int, int], None] | None = None,
    on_backend: Callable[[str, str, int], None] | None = None,
) -> AnalysisRun:
    """Resolve ``request.inputs`` (``resolve_inputs``) and analyse them (``kinetoscope.scale.run_analysis``:
    the one orchestration, whatever the backend). ``progress``/``on_backend`` as there."""
    from kinetoscope.scale import run_analysis

    res = resolve_inputs(
        request.inputs, catalog=catalog, catalog_url=request.catalog_url, cache_dir=request.fetch_cache_dir
    )
    run = run_analysis(request, res.paths, progress=progress, on_backend=on_backend)
    return AnalysisRun(
        document=run.document,
        paths=res.paths,
        inputs=res.inputs,
        trace_id=res.trace_id,
        notes=res.notes,
        scale=run,
    )


def _request(request: AnalyzeRequest | None, fields: dict[str, Any]) -> AnalyzeRequest:
    if request is not None:
        return replace(request, **fields) if fields else request
    if fields.get("backend", "auto") is None:  # the old spelling of "this process"
        fields["backend"] = "single"
    return AnalyzeRequest(**fields)


def analyze_paths(
    paths: Sequence[str | os.PathLike[str]], request: AnalyzeRequest | None = None, **fields: Any
) -> dict[str, Any]:
    """The analysis document of local trace files (folders expanded): ``request`` (or one
    built from ``fields``, the ``AnalyzeRequest`` fields) over ``paths``. A file that fails to
    load is an ``errors`` entry; none loading is an ``InputError``."""
    from kinetoscope.scale import run_analysis

    document: dict[str, Any] = run_analysis(_request(request, fields), paths).document
    return document


def analyze_inputs(
    inputs: Sequence[str | os.PathLike[str]],
    *,
    catalog: Any = None,
    catalog_url: str | None = None,
    fetch_cache_dir: str | os.PathLike[str] | None = None,
    **fields: Any,
) -> AnalysisRun:
    """``analyze`` with the request built from keywords (``AnalyzeRequest`` fields)."""
    req = _request(
        None,
        {
            **fields,
            "inputs": tuple(os.fspath(i) for i in inputs),
            "catalog_url": catalog_url,
            "fetch_cache_dir": fetch_cache_dir,
        },
    )
    return analyze(req, catalog=catalog)


def document_summary(doc: Mapping[str, Any]) -> dict[str, Any]:
    """The catalog's listing fields of an analysis document (``record_analysis(summary=...)``):
    ``kinetoscope.document.summarize(doc).catalog_fields()``, the one summary."""
    from kinetoscope.document import summarize

    return summarize(doc).catalog_fields()


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
        inputs,
        run.document,
        name=ANALYSIS_NAME,
        version=kinetoscope.__version__,
        summary=summary,
        trace_id=run.trace_id,
    )
