"""`kscope trace`: trigger an on-demand PyTorch Profiler trace of running processes.

Thin layer over ``kinetoscope.collect``: parse and validate arguments into one ``TraceRequest``
and a ``Delivery`` (wait, store, catalog), run them through the one trace workflow
(``kinetoscope.collect.workflow``) and render its events and result (Rich tables on
stderr/stdout, or one JSON document with ``--json``).
"""

from __future__ import annotations

import contextlib
import sys
from dataclasses import replace
from types import TracebackType
from typing import Any

import orjson
import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import Progress, TaskID

from kinetoscope.cli.examples import examples
from kinetoscope.cli.host_options import DAEMON_HOSTS, HOSTS_FILE, daemon_hosts
from kinetoscope.cli.struct_options import with_struct_options
from kinetoscope.cli.tls_options import TLS_CA, TLS_CERT, TLS_KEY, TLS_SERVER_NAME, apply_client_tls
from kinetoscope.collect.captured import UNUSABLE_EXIT, unusable
from kinetoscope.collect.deliver import job_step_rate, parse_store_options
from kinetoscope.collect.render import (
    TABLE_MAX_ROWS,
    FanoutProgress,
    fanout_summary,
    files_table,
    large_files,
    large_matched,
    matched_table,
    print_large,
    print_titled,
    progress_bar,
    render_captured,
    stored_table,
)
from kinetoscope.collect.trigger import TraceOptions, TraceRequest, TraceResult, parse_trace_request
from kinetoscope.collect.workflow import (
    DEFAULT_WAIT_TIMEOUT_S,
    Delivery,
    HostAnswered,
    Noted,
    Storing,
    TraceEvent,
    Triggered,
    Triggering,
    Waited,
    Waiting,
    run_trace,
)
from kinetoscope.errors import UsageError
from kinetoscope.protocol.trace_options import TraceOptions as WireOptions
from kinetoscope.readback import check_captured
from kinetoscope.termtext import print_wrapped

EXAMPLES = examples(
    ("kscope trace --job-id $SLURM_JOB_ID --iterations 10 --wait", "one job, 10 steps"),
    ("kscope trace -H node01 -H node02 -p 4242 --duration-ms 2000 -w", "by pid, 2 s"),
    ("kscope trace --hosts-file fleet.txt --all --iterations 5 --store s3://b/t", "a fleet, uploaded"),
)


JOB_ID_OPT = typer.Option(
    None,
    "--job-id",
    "-j",
    help="Trace the processes of this job: SLURM_JOB_ID (a Slurm array id like 36199_0 counts "
    "by its numeric prefix, as in Kineto), or a job identity as `kscope jobs` shows it "
    "(torchrun:..., k8s:NS:NAME, launcher:...; docs/deploy.md).",
)
PIDS_OPT = typer.Option(
    None,
    "--pids",
    "-p",
    metavar="P[,P...]",
    help="Trace these processes (a pid also matches its descendants, e.g. a launcher's ranks).",
)
ALL_OPT = typer.Option(False, "--all", help="Trace every registered process.")
NO_ALIGN_OPT = typer.Option(
    False,
    "--no-align",
    help="With --iterations: start each process at its own next step (no common start iteration).",
)
OUTPUT_DIR_OPT = typer.Option(
    None,
    "--output-dir",
    "-o",
    help="Root folder for trace files (default: the daemon's trace root, /tmp/kinetoscope/traces); "
    "files go to <output-dir>/<trace-id>/.",
)
WAIT_OPT = typer.Option(False, "--wait", "-w", help="Wait until every trace file is complete.")
WHEN_STEPPING_OPT = typer.Option(
    False,
    "--when-stepping",
    help="Trigger once the job steps steadily: short probe traces of one process measure its steps "
    "first (within --timeout), and its rate sets the aligned roundup (docs/collect.md).",
)
TIMEOUT_OPT = typer.Option(
    None,
    "--timeout",
    help=f"With --wait: give up after S seconds (default {DEFAULT_WAIT_TIMEOUT_S:g}).",
)
TRACE_ID_OPT = typer.Option(
    None, "--trace-id", help="Name this request (letters, digits, '-'; default kst-<time>-<random>)."
)
TOKEN_OPT = typer.Option(
    None,
    "--token",
    envvar="KSCOPE_TOKEN",
    help="Shared secret the daemons require (env KSCOPE_TOKEN).",
)
STORE_OPT = typer.Option(
    None,
    "--store",
    metavar="URL",
    help="Upload the complete files and the manifest here once they are written: a local/NFS folder or "
    "s3://bucket/prefix (implies --wait).",
)
STORE_OPTION_OPT = typer.Option(
    None,
    "--store-option",
    metavar="KEY=VALUE",
    help="fsspec/s3fs option for --store, repeatable (e.g. endpoint_url=http://minio:9000, "
    "region=us-east-1); AWS_* environment variables apply too.",
)
CATALOG_OPT = typer.Option(
    None,
    "--catalog",
    metavar="URL",
    help="Record the request in this catalog (SQLite path or postgresql://...). "
    "Default: $KSCOPE_CATALOG, else ~/.kinetoscope/catalog.db.",
)
NO_CATALOG_OPT = typer.Option(False, "--no-catalog", help="Do not record the request in a catalog.")
JSON_OUT_OPT = typer.Option(False, "--json", help="Print one JSON document (see docs/collect.md).")


FANOUT_MIN_HOSTS = 8  # from this many hosts: a progress bar (TTY) and a one-line fan-out summary


def render_matched(console: Console, result: TraceResult) -> None:
    if len(result.matched) > TABLE_MAX_ROWS:  # a summary and the processes not traced
        print_large(console, large_matched(result, TABLE_MAX_ROWS))
    elif result.matched:
        print_titled(console, matched_table(result))


def render_files(console: Console, result: TraceResult) -> None:
    if len(result.files) > TABLE_MAX_ROWS:  # a summary and the incomplete files
        print_large(console, large_files(result, TABLE_MAX_ROWS))
    elif result.files:
        print_titled(console, files_table(result))


def _when_stepping(
    err: Console, request: TraceRequest, token: str | None, deadline_s: float, notes: list[str]
) -> TraceRequest:
    """Probe until the job steps steadily (``collect.stepping``); the request with the measured
    step rate for the aligned roundup. Not steady by the deadline: said, and traced anyway."""
    from kinetoscope.collect.stepping import wait_until_stepping
    from kinetoscope.readback import probe_steps

    probe = wait_until_stepping(
        request,
        token=token,
        deadline_s=deadline_s,
        steps_of=probe_steps,
        say=lambda line: err.print(f"[dim]{escape(line)}[/]"),
    )
    if probe is None or not probe.steady:
        note = (
            "--when-stepping: the job did not step steadily within "
            f"{deadline_s:g} s ({probe.steps if probe else 0} step(s) in the last probe); tracing anyway"
        )
        notes.append(note)
        err.print(f"[yellow]note:[/] {escape(note)}")
        return request
    note = f"--when-stepping: the job steps steadily at {probe.rate:.3g} steps/s (probe {probe.trace_id})"
    notes.append(note)
    err.print(f"[yellow]note:[/] {escape(note)}")
    if request.options.iterations is None or request.options.iteration_roundup is not None:
        return request
    return replace(request, options=request.options.replace(steps_per_s=probe.rate))


def _known_step_rate(request: TraceRequest, catalog: str | None, notes: list[str]) -> TraceRequest:
    """An aligned iteration request of one job, with the job's step rate from the catalog's
    newest analysis of it when there is one (a tighter alignment roundup; docs/collect.md)."""
    jid, options = request.target.job_id, request.options
    if jid is None or str(jid) == "0":  # Kineto's "no job": many unrelated jobs, never one step rate
        return request
    if options.iterations is None or options.iteration_roundup is not None or not options.align:
        return request
    known = job_step_rate(jid, catalog)
    if known is None:
        return request
    notes.append(f"job {jid} steps at {known[0]:.3g} steps/s (catalog: analysis of {known[1]})")
    return replace(request, options=options.replace(steps_per_s=known[0]))


def _store_url(request: TraceRequest, store: str | None, notes: list[str]) -> tuple[TraceRequest, str | None]:
    """Where to upload: ``--store``, or an ``--output-dir`` URL (Kineto writes local files only,
    so the daemons write to their trace root and the files go there when complete)."""
    output_dir = request.output_dir
    if output_dir is None or "://" not in output_dir:
        return request, store
    if output_dir.startswith("file://"):
        return replace(request, output_dir=output_dir[len("file://") :]), store
    if store is not None and store.rstrip("/") != output_dir.rstrip("/"):
        raise UsageError(
            f"--output-dir {output_dir} is not a local folder, so it is used as the store, but --store "
            f"names another one ({store}); give one of them"
        )
    notes.append(
        f"--output-dir {output_dir}: Kineto writes local files only, so the daemons write to their "
        f"trace root and the files are uploaded to {output_dir} when complete (as --store)"
    )
    return replace(request, output_dir=None), output_dir


def _delivery(
    store_url: str | None,
    store_option: list[str] | None,
    wait: bool,
    timeout: float | None,
    notes: list[str],
) -> Delivery:
    """What follows the trigger (``--wait``, ``--timeout``, ``--store``), checked before
    anything is traced (a store URL that cannot work is refused here; no network)."""
    storage_options = parse_store_options(store_option)
    if storage_options and store_url is None:
        raise UsageError("--store-option only applies with --store URL")
    trace_store = None
    if store_url is not None:
        from kinetoscope.store.storage import StoreError, TraceStore

        try:
            trace_store = TraceStore(store_url, storage_options=storage_options)
        except StoreError as exc:
            raise UsageError(f"--store {store_url}: {exc}") from exc
        if not wait:
            wait = True
            notes.append("--store waits for the trace files (as --wait) to upload them")
    if timeout is not None and not wait:
        raise UsageError("--timeout only applies with --wait")
    if timeout is not None and timeout <= 0:
        raise UsageError(f"--timeout must be positive, got {timeout:g}")
    return Delivery(
        wait=wait,
        timeout_s=timeout if timeout is not None else DEFAULT_WAIT_TIMEOUT_S,
        store=store_url,
        trace_store=trace_store,
        storage_options=storage_options,
        captured=check_captured,
    )


class _Screen:
    """``kscope trace``'s view of the workflow's events: notes, the fan-out bar (many hosts, on
    a terminal), the matched processes, the wait's bar, warnings; nothing on stdout with --json
    but the document. A context manager: the bars close however the workflow ends."""

    def __init__(self, out: Console, err: Console, json_out: bool, notes: list[str]) -> None:
        self.out, self.err, self.json_out, self.notes = out, err, json_out, notes
        self.live = not json_out and err.is_terminal
        self.stack = contextlib.ExitStack()
        self.fanout: FanoutProgress | None = None
        self.many = False  # from FANOUT_MIN_HOSTS hosts: a bar (terminal) and a summary line
        self.waiting: tuple[Progress, TaskID] | None = None

    def __enter__(self) -> _Screen:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stack.close()

    def __call__(self, event: TraceEvent) -> None:
        if isinstance(event, Triggering):
            self.triggering(len(event.request.hosts))
        elif isinstance(event, HostAnswered) and self.fanout is not None:
            self.fanout.on_answer(event.phase, event.reply)
        elif isinstance(event, Triggered):
            self.triggered(event.result)
        elif isinstance(event, Noted):
            self.err.print(f"[yellow]{event.level}:[/] {escape(event.text)}")
        elif isinstance(event, Waiting) and self.live:
            self.progress(event)
        elif isinstance(event, Waited):
            self.stack.close()
            self.waiting = None
        elif isinstance(event, Storing) and not self.json_out:
            print_wrapped(self.err, ["storing trace files in", event.url], indent="")

    def triggering(self, hosts: int) -> None:
        self.many = hosts >= FANOUT_MIN_HOSTS
        if self.many and self.live:
            self.fanout = self.stack.enter_context(FanoutProgress(self.err, hosts))

    def triggered(self, result: TraceResult) -> None:
        self.stack.close()
        self.fanout = None
        if self.many and not self.json_out:
            self.err.print(escape(fanout_summary(result)))
        result.notes[:0] = self.notes
        for note in result.notes[len(self.notes) :]:
            self.err.print(f"[yellow]note:[/] {escape(note)}")
        if not self.json_out:
            render_matched(self.out, result)
            if result.triggered and result.output_dir:
                print_wrapped(self.out, ["trace files go to", result.output_dir], indent="")

    def progress(self, event: Waiting) -> None:
        if self.waiting is None:
            bar = self.stack.enter_context(progress_bar(self.err, "{task.completed}/{task.total} files"))
            self.waiting = (bar, bar.add_task("waiting for trace files", total=event.total))
        bar, task = self.waiting
        desc = "waiting for trace files"
        if event.picked < event.total and not event.done:
            desc = f"waiting for processes to pick up the config ({event.picked}/{event.total})"
        elif event.done < event.total:
            desc = "processes are tracing"
        bar.update(task, completed=event.done, description=desc)


def _report(out: Console, err: Console, result: TraceResult, json_out: bool, waited: bool) -> None:
    """The result: one JSON document (--json), or the files, what they hold, the manifest, the
    uploads and the catalog; then the errors, and the exit status."""
    if json_out:
        sys.stdout.write(orjson.dumps(result.to_json(), option=orjson.OPT_INDENT_2).decode() + "\n")
        sys.stdout.flush()
    else:
        render_files(out, result)
        if result.captured:
            render_captured(out, err, result.captured)
        if result.manifest_paths:
            print_wrapped(out, ["manifest:", result.manifest_paths[0]], indent="")
        if result.stored:
            print_titled(out, stored_table(result))
        if result.catalog:
            print_wrapped(out, ["recorded in catalog", result.catalog], indent="")
        if result.files and not waited:
            out.print("files appear once each process has traced; use --wait to wait for them")
    for problem in result.errors:
        err.print(f"[bold red]error:[/] {escape(problem.message)}")
    if result.errors:
        raise typer.Exit(1)
    if unusable(result.captured):
        raise typer.Exit(UNUSABLE_EXIT)


def _catalog(delivery: Delivery, catalog: str | None, no_catalog: bool) -> Delivery:
    """Record in the catalog unless --no-catalog: as soon as triggered and again after the wait."""
    if no_catalog:
        return delivery
    return replace(delivery, catalog=catalog, record=True, record_requested=True, waiter=True)


def register(app: typer.Typer) -> None:
    @app.command("trace", epilog=EXAMPLES)
    @with_struct_options(WireOptions, into="trace_options")
    def trace(
        host: list[str] | None = DAEMON_HOSTS,
        hosts_file: str | None = HOSTS_FILE,
        job_id: str | None = JOB_ID_OPT,
        pids: str | None = PIDS_OPT,
        all_: bool = ALL_OPT,
        trace_options: dict[str, Any] | None = None,  # one flag per TraceOptions field, generated
        no_align: bool = NO_ALIGN_OPT,
        output_dir: str | None = OUTPUT_DIR_OPT,
        wait: bool = WAIT_OPT,
        when_stepping: bool = WHEN_STEPPING_OPT,
        timeout: float | None = TIMEOUT_OPT,
        trace_id: str | None = TRACE_ID_OPT,
        token: str | None = TOKEN_OPT,
        store: str | None = STORE_OPT,
        store_option: list[str] | None = STORE_OPTION_OPT,
        catalog: str | None = CATALOG_OPT,
        no_catalog: bool = NO_CATALOG_OPT,
        json_out: bool = JSON_OUT_OPT,
        tls_ca: str | None = TLS_CA,
        tls_cert: str | None = TLS_CERT,
        tls_key: str | None = TLS_KEY,
        tls_server_name: str | None = TLS_SERVER_NAME,
    ) -> None:
        """Trigger an on-demand trace of running PyTorch processes, like `dyno gputrace`."""
        apply_client_tls(tls_ca, tls_cert, tls_key, tls_server_name)
        options = TraceOptions(**(trace_options or {}), align=not no_align)
        request, notes = parse_trace_request(
            hosts=daemon_hosts(host, hosts_file),
            job_id=job_id,
            pids=pids,
            all=all_,
            options=options,
            output_dir=output_dir,
            trace_id=trace_id,
        )
        if not no_catalog:
            request = _known_step_rate(request, catalog, notes)
        if no_catalog and catalog is not None:
            raise UsageError("--catalog and --no-catalog contradict each other; give one")
        request, store_url = _store_url(request, store, notes)
        delivery = _catalog(_delivery(store_url, store_option, wait, timeout, notes), catalog, no_catalog)
        delivery = replace(delivery, token=token)
        if delivery.wait:  # the aligned roundup is chosen so the trace fits the wait (collect.window_fit)
            request = replace(request, options=request.options.replace(wait_s=delivery.timeout_s))
        out = Console(stderr=json_out, highlight=False)
        err = Console(stderr=True, highlight=False, soft_wrap=True)  # a note or an error: one line
        for note in notes:
            err.print(f"[yellow]note:[/] {escape(note)}")
        if when_stepping:
            request = _when_stepping(err, request, token, delivery.timeout_s, notes)
        with _Screen(out, err, json_out, notes) as screen:
            result = run_trace(request, delivery, screen)
        _report(out, err, result, json_out, delivery.wait)
