"""What the web app's actions do (run in :class:`kinetoscope.web.tasks.TaskManager` threads).

* :func:`analyze_request` — the analysis of one catalog trace request: its files (downloaded
  when not on this machine), ``kinetoscope.orchestration.analyze_paths`` (all analyses + diagnosis),
  then ``Catalog.record_analysis``.
* :func:`trigger_and_collect` — the form's :class:`TriggerParams` become one
  ``TraceRequest``, run through the one trace workflow (``kinetoscope.collect.workflow``:
  trigger, wait with progress, record in the catalog as ``kscope trace`` does; the files of a
  folder on this machine with their sha256); it is then optionally analysed.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import msgspec
from msgspec import Meta

from kinetoscope.collect.trigger import TraceOptions as CollectOptions
from kinetoscope.document import decode
from kinetoscope.errors import KinetoscopeError, UsageError
from kinetoscope.protocol.structinfo import prime_structs
from kinetoscope.protocol.trace_options import OPTION_FIELDS, OptionsError, TraceOptions, decode_as
from kinetoscope.web.tasks import Task, TaskManager

if TYPE_CHECKING:
    from kinetoscope.collect.trigger import TraceRequest


class TriggerParams(TraceOptions, frozen=True, kw_only=True):
    """A trace request from the web form / ``POST /api/trigger``: the trace options
    (:class:`kinetoscope.protocol.trace_options.TraceOptions`, inherited: one definition, its
    limits and descriptions feed the API schema and the form) and who, where, how long."""

    hosts: Annotated[
        list[str], Meta(description="daemon addresses host[:port]; default: the server's --daemon list")
    ] = []
    job_id: Annotated[str | None, Meta(description="trace the processes of this job id (SLURM_JOB_ID)")] = (
        None
    )
    pids: Annotated[str | None, Meta(description="comma-separated pids (or their descendants)")] = None
    all: Annotated[bool, Meta(description="every registered process")] = False
    align: Annotated[bool, Meta(description="False: `kscope trace --no-align`")] = True
    output_dir: Annotated[
        str | None, Meta(description="root folder on the traced hosts (default: the daemon's trace root)")
    ] = None
    trace_id: Annotated[str | None, Meta(description="name of the request (default: generated)")] = None
    timeout_s: Annotated[float, Meta(ge=1, le=3600, description="how long to wait for the files")] = 120.0
    analyze: Annotated[bool, Meta(description="analyse the request once its files are complete")] = False

    def summary(self) -> dict[str, Any]:
        """The fields given (not left empty), as the task list shows them."""
        return {k: v for k, v in msgspec.structs.asdict(self).items() if v not in (None, False, [], "")}

    def options(self) -> CollectOptions:
        """What to record, as the trigger takes it (``kscope trace``'s options)."""
        fields = {name: getattr(self, name) for name in OPTION_FIELDS}
        fields["include_launchers"] = bool(self.include_launchers)
        return CollectOptions(**fields, align=self.align)

    def build(self, default_hosts: list[str], allowed: list[str] | None = None) -> TraceRequest:
        """The :class:`~kinetoscope.collect.trigger.TraceRequest`, validated like the CLI's
        (``UsageError`` with the reason). ``allowed``: the daemon addresses this server may
        contact (:func:`check_daemons_allowed`); None skips the check (library callers that
        chose the hosts themselves)."""
        from kinetoscope.collect.client import parse_hosts
        from kinetoscope.collect.trigger import parse_trace_request

        asked = parse_hosts(self.hosts or default_hosts or None)  # an unusable address is said first
        if allowed is not None:
            check_daemons_allowed([str(h) for h in asked], allowed)
        job_id = self.job_id.strip() if self.job_id and self.job_id.strip() else None
        pids = self.pids if self.pids and self.pids.strip() else None
        if sum([job_id is not None, pids is not None, bool(self.all)]) != 1:
            raise UsageError("choose which processes to trace: exactly one of job id, pids or all")
        request, _notes = parse_trace_request(
            hosts=self.hosts or default_hosts,
            job_id=job_id,
            pids=pids,
            all=bool(self.all),
            options=self.options(),
            output_dir=self.output_dir,
            trace_id=self.trace_id or None,
        )
        if not 1 <= float(self.timeout_s) <= 3600:
            raise UsageError("timeout must be between 1 and 3600 seconds")
        return request


def decode_params(fields: Any) -> TriggerParams:
    """:class:`TriggerParams` from a JSON object or a form's typed fields; a bad field is a
    ``UsageError`` naming it (HTTP 400/422)."""
    try:
        return decode_as(fields, TriggerParams)
    except OptionsError as exc:
        raise UsageError(str(exc)) from None


class DaemonNotAllowed(UsageError):
    """A trigger named a daemon the server was not configured with (HTTP 403)."""


def daemon_allow_list(daemons: list[str], extra: list[str]) -> list[str]:
    """The daemon addresses (``host:port``, normalised) the web app may contact: its ``--daemon``
    list plus ``--allow-daemon``; with neither, the default local daemon (what an empty host
    field means). The daemon token goes to these and to nothing else."""
    from kinetoscope.collect.client import parse_host, parse_hosts

    listed = [str(parse_host(a)) for a in [*daemons, *extra]]
    return list(dict.fromkeys(listed)) or [str(h) for h in parse_hosts(None)]


def check_daemons_allowed(hosts: list[str], allowed: list[str]) -> None:
    """Raise :class:`DaemonNotAllowed` naming the first of ``hosts`` (``host:port``) that is not
    in ``allowed`` (compared as parsed addresses, host names case-insensitively). Nothing is
    resolved or contacted: this runs before any connection."""
    from kinetoscope.collect.client import parse_host

    def key(a: str) -> tuple[str, int]:
        h = parse_host(a)
        return h.host.lower(), h.port

    ok = {key(a) for a in allowed}
    for h in hosts:
        if key(h) not in ok:
            raise DaemonNotAllowed(
                f"daemon {h} is not one this server may contact (configured: {', '.join(allowed)}); "
                "start kscope serve with --daemon HOST:PORT or --allow-daemon HOST:PORT"
            )


def analyze_request(
    tasks: TaskManager,
    task: Task,
    catalog: Any,
    trace_id: str,
    *,
    analysis_options: dict[str, Any] | None = None,
    roots: Any = None,
) -> None:
    """``roots`` (:class:`kinetoscope.web.guards.ServeRoots`): the web app analyses only files
    under its serving roots, as it serves only those (a manifest cannot widen either)."""
    from kinetoscope.orchestration import (
        AnalysisRun,
        AnalyzeRequest,
        analyze_paths,
        record_run,
        request_files,
    )

    rec = catalog.get_trace_request(trace_id)
    if rec is None:
        raise KinetoscopeError(f"trace {trace_id} is not in the catalog")
    tasks.update(
        task, phase="fetching", message="locating the trace files", log=f"{len(rec.files)} file(s) recorded"
    )
    if roots is not None:
        check_fetch_urls(rec, roots)  # before anything is downloaded
    paths = request_files(rec)
    if roots is not None:
        outside = [p for p in paths if roots.local_file(p) is None]
        if outside:
            raise KinetoscopeError(
                f"{len(outside)} file(s) of trace {trace_id} lie outside the serving roots "
                f"(first: {outside[0]}); add their folder with kscope serve --serve-root"
            )
    tasks.update(
        task,
        phase="analysing",
        message=f"analysing {len(paths)} trace file(s)",
        log="analysing " + ", ".join(p.name for p in paths),
    )
    doc = analyze_paths(paths, AnalyzeRequest(**(analysis_options or {})))
    tasks.update(task, phase="recording", message="recording the analysis in the catalog")
    arec = record_run(
        catalog, AnalysisRun(document=doc, paths=list(paths), inputs=[trace_id], trace_id=trace_id)
    )
    typed = decode(doc)
    summary = (typed.summary_lines or [""])[0]
    errors = [f"{k}: {v}" for k, v in typed.errors.items()]
    tasks.update(
        task,
        analysis_id=arec.id,
        message=summary or "analysis recorded",
        errors=task.errors + errors,
        log=f"analysis {arec.id} recorded",
    )


def check_fetch_urls(rec: Any, roots: Any) -> None:
    """Refuse (``KinetoscopeError``) before any download when a file of the request would be
    fetched from a URL outside the configured stores: the request's ``store_url`` or a file's
    ``storage_url`` come from manifests (daemons, imports), and the server must not send a
    request to whatever they name (SSRF) nor put its answer in the download cache, which it
    serves. The configured stores are the remote serving roots (``kscope serve --serve-root
    s3://bucket/prefix``); a file already on this machine is not fetched."""
    from kinetoscope.store.storage import is_local_url, join_url

    for f in rec.files:
        if f.complete is False or (f.path and Path(f.path).is_file()):
            continue
        url = join_url(rec.store_url, rec.trace_id) + "/" if rec.store_url else f.storage_url
        if not url or is_local_url(url):
            continue
        if not roots.allows_url(url):
            raise KinetoscopeError(
                f"trace {rec.trace_id}: {f.file} would be fetched from {url}, which is not a configured "
                "store: refused (add the store with kscope serve --serve-root URL)"
            )


def _files_json(result: Any) -> list[dict[str, Any]]:
    out = []
    for f in result.files:
        out.append(
            {
                "host": f.host,
                "pid": f.pid,
                "rank": f.rank,
                "path": f.path,
                "file": Path(f.path).name,
                "bytes": f.bytes,
                "complete": f.complete,
                "delivered": f.delivered,
                "exists": f.exists,
            }
        )
    return out


def _outside_roots(result: Any, roots: Any) -> list[str]:
    """Paths the daemons reported that exist on this machine but not under ``roots``."""
    import os

    out = []
    for f in result.files:
        if f.path and os.path.lexists(f.path) and roots.local_file(f.path) is None:
            out.append(str(f.path))
    return out


def trigger_and_collect(
    tasks: TaskManager,
    task: Task,
    catalog: Any,
    params: TriggerParams,
    *,
    default_hosts: list[str],
    allowed: list[str],
    roots: Any,
    token: str | None = None,
    analysis_options: dict[str, Any] | None = None,
) -> None:
    """The trace workflow (``kinetoscope.collect.workflow``) for one form / API request, its
    events shown as the task's state. ``allowed``: the daemons this server may contact (checked
    again here, before any connection); ``roots`` (:class:`kinetoscope.web.guards.ServeRoots`):
    files the daemons report outside them are neither hashed nor analysed."""
    from kinetoscope.collect.workflow import Delivery, run_trace

    request = params.build(default_hosts, allowed)
    hosts = ", ".join(map(str, request.hosts))
    tasks.update(
        task,
        phase="triggering",
        message=f"asking {hosts}",
        log=f"trace {request.target.describe()} on {hosts}",
    )
    view = _TaskView(tasks, task, roots)
    delivery = Delivery(
        wait=True,
        timeout_s=float(params.timeout_s),
        token=token,
        record=True,
        catalog=catalog,
        raise_errors=True,
        hash_local_files=view.hash_local_files,
    )
    result = run_trace(request, delivery, view)
    if not result.files:
        raise KinetoscopeError("; ".join(e.message for e in result.errors) or "nothing was traced")
    complete = sum(1 for f in result.files if f.complete)
    if complete == 0:
        raise KinetoscopeError("no trace file was written: " + "; ".join(e.message for e in result.errors))
    total = len(result.files)
    if params.analyze and view.record is not None:
        analyze_request(
            tasks, task, catalog, view.record.trace_id, analysis_options=analysis_options, roots=roots
        )
    elif result.errors:
        tasks.update(task, message=f"{complete}/{total} files complete; see the errors")
    else:
        tasks.update(task, message=f"{complete}/{total} files complete")


class _TaskView:
    """The workflow's events as one background task's state (phase, files, notes, errors, log)."""

    def __init__(self, tasks: TaskManager, task: Task, roots: Any) -> None:
        self.tasks, self.task, self.roots = tasks, task, roots
        self.record: Any = None  # the catalog's record, once recorded

    def __call__(self, event: Any) -> None:
        from kinetoscope.collect.workflow import Recorded, Triggered, Waited, Waiting

        if isinstance(event, Triggered):
            self.triggered(event.result)
        elif isinstance(event, Waiting):
            msg = (
                f"config picked up by {event.picked}/{event.total}, {event.done}/{event.total} files complete"
            )
            self.tasks.update(self.task, phase="waiting", files=_files_json(event.result), message=msg)
        elif isinstance(event, Waited):
            self.waited(event.result)
        elif isinstance(event, Recorded) and event.record is not None:
            self.record = rec = event.record
            log = f"recorded {rec.trace_id}: {rec.complete_files}/{rec.file_count} files"
            self.tasks.update(self.task, trace_id=rec.trace_id, log=log)

    def triggered(self, result: Any) -> None:
        self.tasks.update(
            self.task,
            trace_id=result.trace_id,
            matched=[m.to_json() for m in result.matched],
            files=_files_json(result),
            notes=list(result.notes),
            errors=[e.message for e in result.errors],
            log=f"request {result.trace_id}: {len(result.files)} process(es) triggered",
        )

    def waited(self, result: Any) -> None:
        errors = [e.message for e in result.errors]
        self.tasks.update(self.task, files=_files_json(result), errors=errors, notes=list(result.notes))
        complete = sum(1 for f in result.files if f.complete)
        self.tasks.update(
            self.task,
            phase="recording",
            message="recording the request in the catalog",
            log=f"{complete}/{len(result.files)} file(s) complete",
        )

    def hash_local_files(self, result: Any) -> bool:
        """Hash the files only when none the daemons reported lies outside the serving roots
        (those are recorded, never hashed or analysed)."""
        outside = _outside_roots(result, self.roots)
        if outside:
            first = outside[0]
            self.tasks.update(
                self.task,
                errors=self.task.errors
                + [
                    f"{len(outside)} reported file(s) lie outside the serving roots (first: {first}): not hashed"
                ],
            )
        return not outside


prime_structs(globals())
