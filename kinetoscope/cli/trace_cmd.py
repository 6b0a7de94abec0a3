"""`kscope trace`: trigger an on-demand PyTorch Profiler trace of running processes.

Thin layer over ``kinetoscope.collect.trigger``: parse and validate arguments, call the library,
render the result (Rich tables on stderr/stdout, or one JSON document with ``--json``).
"""

from __future__ import annotations

import sys
from dataclasses import replace

import orjson
import typer
from rich.console import Console
from rich.markup import escape

from kinetoscope.cli.examples import examples
from kinetoscope.cli.host_options import DAEMON_HOSTS, HOSTS_FILE, daemon_hosts
from kinetoscope.cli.tls_options import TLS_CA, TLS_CERT, TLS_KEY, TLS_SERVER_NAME, apply_client_tls
from kinetoscope.collect.captured import UNUSABLE_EXIT, check_captured, unusable
from kinetoscope.collect.deliver import (
    job_step_rate,
    mark_abandoned_requests,
    parse_store_options,
    record_trace_result,
    store_trace_result,
    waiter_info,
)
from kinetoscope.collect.render import (
    TABLE_MAX_ROWS,
    FanoutProgress,
    fanout_summary,
    files_table,
    large_files,
    large_matched,
    matched_table,
    print_large,
    progress_bar,
    render_captured,
    stored_table,
)
from kinetoscope.collect.trigger import (
    TraceOptions,
    TraceRequest,
    TraceResult,
    parse_trace_request,
    trigger_trace,
    wait_for_trace,
)
from kinetoscope.errors import UsageError

EXAMPLES = examples(
    ("kscope trace --job-id $SLURM_JOB_ID --iterations 10 --wait", "one job, 10 steps"),
    ("kscope trace -H node01 -H node02 -p 4242 --duration-ms 2000 -w", "by pid, 2 s"),
    ("kscope trace --hosts-file fleet.txt --all --iterations 5 --store s3://b/t", "a fleet, uploaded"),
)


DEFAULT_WAIT_TIMEOUT_S = 120.0
FANOUT_MIN_HOSTS = 8  # from this many hosts: a progress bar (TTY) and a one-line fan-out summary


def _trigger(err: Console, request: TraceRequest, token: str | None, json_out: bool) -> TraceResult:
    """``trigger_trace``, with a hosts answered/failed bar on a terminal's stderr for many hosts
    (never with --json, so stdout stays one JSON document) and a summary line after it."""
    many = len(request.hosts) >= FANOUT_MIN_HOSTS
    if not many or json_out or not err.is_terminal:
        result = trigger_trace(request, token=token)
    else:
        with FanoutProgress(err, len(request.hosts)) as bar:
            result = trigger_trace(request, token=token, on_answer=bar.on_answer)
    if many and not json_out:
        err.print(escape(fanout_summary(result)))
    return result


def render_matched(console: Console, result: TraceResult) -> None:
    if len(result.matched) > TABLE_MAX_ROWS:  # a summary and the processes not traced
        print_large(console, large_matched(result, TABLE_MAX_ROWS))
    elif result.matched:
        console.print(matched_table(result))


def render_files(console: Console, result: TraceResult) -> None:
    if len(result.files) > TABLE_MAX_ROWS:  # a summary and the incomplete files
        print_large(console, large_files(result, TABLE_MAX_ROWS))
    elif result.files:
        console.print(files_table(result))


def _progress_waiter(console: Console, result: TraceResult, timeout: float, token: str | None) -> TraceResult:
    total = len(result.files)
    with progress_bar(console, "{task.completed}/{task.total} files") as progress:
        task = progress.add_task("waiting for trace files", total=total)

        def on_progress(r: TraceResult) -> None:
            done = sum(1 for f in r.files if f.complete)
            picked = sum(1 for f in r.files if f.delivered)
            desc = "waiting for trace files"
            if picked < total and not done:
                desc = f"waiting for processes to pick up the config ({picked}/{total})"
            elif done < total:
                desc = "processes are tracing"
            progress.update(task, completed=done, description=desc)

        return wait_for_trace(result, timeout=timeout, token=token, on_progress=on_progress)


def _record(err: Console, result: TraceResult, catalog: str | None) -> None:
    """Record in the catalog; a failure is a warning (and a note in --json), never a failed trace."""
    before = len(result.notes)
    record_trace_result(result, catalog)
    for note in result.notes[before:]:
        err.print(f"[yellow]warning:[/] {escape(note)}")


def _mark_abandoned(err: Console, result: TraceResult, catalog: str | None) -> None:
    """Earlier requests of this host whose `kscope trace --wait` was killed: ``abandoned``."""
    if not result.files:
        return
    marked = mark_abandoned_requests(catalog)
    if marked:
        note = (
            f"catalog: marked {len(marked)} earlier request(s) abandoned ({', '.join(marked)}): the `kscope trace` "
            "that waited for them was killed before it recorded their outcome; `kscope catalog import <dir>` "
            "records what their folders hold"
        )
        result.notes.append(note)
        err.print(f"[yellow]note:[/] {escape(note)}")


def _when_stepping(
    err: Console, request: TraceRequest, token: str | None, deadline_s: float, notes: list[str]
) -> TraceRequest:
    """Probe until the job steps steadily (``collect.stepping``); the request with the measured
    step rate for the aligned roundup. Not steady by the deadline: said, and traced anyway."""
    from kinetoscope.collect.stepping import wait_until_stepping

    probe = wait_until_stepping(
        request, token=token, deadline_s=deadline_s, say=lambda line: err.print(f"[dim]{escape(line)}[/]")
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
    return replace(request, options=replace(request.options, steps_per_s=probe.rate))


def register(app: typer.Typer) -> None:
    @app.command("trace", epilog=EXAMPLES)
    def trace(
        host: list[str] | None = DAEMON_HOSTS,
        hosts_file: str | None = HOSTS_FILE,
        job_id: str | None = typer.Option(
            None,
            "--job-id",
            "-j",
            help="Trace the processes of this job: SLURM_JOB_ID (a Slurm array id like 36199_0 counts "
            "by its numeric prefix, as in Kineto), or a job identity as `kscope jobs` shows it "
            "(torchrun:..., k8s:NS:NAME, launcher:...; docs/deploy.md).",
        ),
        pids: str | None = typer.Option(
            None,
            "--pids",
            "-p",
            metavar="P[,P...]",
            help="Trace these processes (a pid also matches its descendants, e.g. a launcher's ranks).",
        ),
        all_: bool = typer.Option(False, "--all", help="Trace every registered process."),
        duration_ms: int | None = typer.Option(None, "--duration-ms", help="Record this many milliseconds."),
        iterations: int | None = typer.Option(
            None, "--iterations", help="Record this many training iterations (optimizer.step() calls)."
        ),
        iteration_roundup: int | None = typer.Option(
            None,
            "--iteration-roundup",
            metavar="R",
            help="Start at the next iteration that is a multiple of R. Default for several processes: a "
            "multiple chosen so that every rank starts at the same iteration (docs/collect.md); for one: 1.",
        ),
        no_align: bool = typer.Option(
            False,
            "--no-align",
            help="With --iterations: start each process at its own next step (no common start iteration).",
        ),
        output_dir: str | None = typer.Option(
            None,
            "--output-dir",
            "-o",
            help="Root folder for trace files (default: the daemon's trace root, /tmp/kinetoscope/traces); "
            "files go to <output-dir>/<trace-id>/.",
        ),
        record_shapes: bool = typer.Option(False, "--record-shapes", help="Record operator input shapes."),
        profile_memory: bool = typer.Option(
            False, "--profile-memory", help="Record memory (duration mode only)."
        ),
        with_stack: bool = typer.Option(False, "--with-stack", "--with-stacks", help="Record Python stacks."),
        with_flops: bool = typer.Option(
            False, "--with-flops", help="Estimate FLOPs of matmul/conv operators."
        ),
        with_modules: bool = typer.Option(False, "--with-modules", help="Record the nn.Module hierarchy."),
        process_limit: int | None = typer.Option(
            None, "--process-limit", help="Trace at most N processes per host (default: no limit)."
        ),
        include_launchers: bool = typer.Option(
            False, "--include-launchers", help="Also trace launcher processes (torchrun), skipped by default."
        ),
        wait: bool = typer.Option(False, "--wait", "-w", help="Wait until every trace file is complete."),
        when_stepping: bool = typer.Option(
            False,
            "--when-stepping",
            help="Trigger once the job steps steadily: short probe traces of one process measure its steps "
            "first (within --timeout), and its rate sets the aligned roundup (docs/collect.md).",
        ),
        timeout: float | None = typer.Option(
            None,
            "--timeout",
            help=f"With --wait: give up after S seconds (default {DEFAULT_WAIT_TIMEOUT_S:g}).",
        ),
        trace_id: str | None = typer.Option(
            None, "--trace-id", help="Name this request (letters, digits, '-'; default kst-<time>-<random>)."
        ),
        token: str | None = typer.Option(
            None,
            "--token",
            envvar="KSCOPE_TOKEN",
            help="Shared secret the daemons require (env KSCOPE_TOKEN).",
        ),
        store: str | None = typer.Option(
            None,
            "--store",
            metavar="URL",
            help="Upload the complete files and the manifest here once they are written: a local/NFS folder or "
            "s3://bucket/prefix (implies --wait).",
        ),
        store_option: list[str] | None = typer.Option(
            None,
            "--store-option",
            metavar="KEY=VALUE",
            help="fsspec/s3fs option for --store, repeatable (e.g. endpoint_url=http://minio:9000, "
            "region=us-east-1); AWS_* environment variables apply too.",
        ),
        catalog: str | None = typer.Option(
            None,
            "--catalog",
            metavar="URL",
            help="Record the request in this catalog (SQLite path or postgresql://...). "
            "Default: $KSCOPE_CATALOG, else ~/.kinetoscope/catalog.db.",
        ),
        no_catalog: bool = typer.Option(
            False, "--no-catalog", help="Do not record the request in a catalog."
        ),
        json_out: bool = typer.Option(False, "--json", help="Print one JSON document (see docs/collect.md)."),
        tls_ca: str | None = TLS_CA,
        tls_cert: str | None = TLS_CERT,
        tls_key: str | None = TLS_KEY,
        tls_server_name: str | None = TLS_SERVER_NAME,
    ) -> None:
        """Trigger an on-demand trace of running PyTorch processes, like `dyno gputrace`."""
        apply_client_tls(tls_ca, tls_cert, tls_key, tls_server_name)
        options = TraceOptions(
            duration_ms=duration_ms,
            iterations=iterations,
            iteration_roundup=iteration_roundup,
            record_shapes=record_shapes,
            profile_memory=profile_memory,
            with_stack=with_stack,
            with_flops=with_flops,
            with_modules=with_modules,
            process_limit=process_limit,
            include_launchers=include_launchers,
            align=not no_align,
        )
        host = daemon_hosts(host, hosts_file)
        request, notes = parse_trace_request(
            hosts=host,
            job_id=job_id,
            pids=pids,
            all=all_,
            options=options,
            output_dir=output_dir,
            trace_id=trace_id,
        )
        jid = request.target.job_id
        if (
            jid is not None
            and str(jid) != "0"  # Kineto's "no job": many unrelated jobs, never one step rate
            and iterations is not None
            and iteration_roundup is None
            and not no_align
            and not no_catalog
        ):
            known = job_step_rate(jid, catalog)  # a tighter alignment roundup (docs/collect.md)
            if known is not None:
                request = replace(request, options=replace(options, steps_per_s=known[0]))
                notes.append(f"job {jid} steps at {known[0]:.3g} steps/s (catalog: analysis of {known[1]})")
        if no_catalog and catalog is not None:
            raise UsageError("--catalog and --no-catalog contradict each other; give one")
        store_url = store
        if output_dir is not None and "://" in output_dir:
            if output_dir.startswith("file://"):
                output_dir = output_dir[len("file://") :]
            else:
                if store is not None and store.rstrip("/") != output_dir.rstrip("/"):
                    raise UsageError(
                        f"--output-dir {output_dir} is not a local folder, so it is used as the store, but --store "
                        f"names another one ({store}); give one of them"
                    )
                notes.append(
                    f"--output-dir {output_dir}: Kineto writes local files only, so the daemons write to their "
                    f"trace root and the files are uploaded to {output_dir} when complete (as --store)"
                )
                store_url, output_dir = output_dir, None
            request = replace(request, output_dir=output_dir)
        storage_options = parse_store_options(store_option)
        if storage_options and store_url is None:
            raise UsageError("--store-option only applies with --store URL")
        target_store = None
        if store_url is not None:
            from kinetoscope.store.storage import StoreError, TraceStore

            try:  # a URL that cannot work is refused before anything is traced (no network here)
                target_store = TraceStore(store_url, storage_options=storage_options)
            except StoreError as exc:
                raise UsageError(f"--store {store_url}: {exc}") from exc
        if store_url is not None and not wait:
            wait = True
            notes.append("--store waits for the trace files (as --wait) to upload them")
        if timeout is not None and not wait:
            raise UsageError("--timeout only applies with --wait")
        if timeout is not None and timeout <= 0:
            raise UsageError(f"--timeout must be positive, got {timeout:g}")
        limit = timeout if timeout is not None else DEFAULT_WAIT_TIMEOUT_S
        if wait:  # the aligned roundup is chosen so the trace fits the wait (collect.window_fit)
            request = replace(request, options=replace(request.options, wait_s=limit))

        out = Console(stderr=json_out, highlight=False)
        err = Console(stderr=True, highlight=False)
        for note in notes:
            err.print(f"[yellow]note:[/] {escape(note)}")

        if when_stepping:
            request = _when_stepping(err, request, token, limit, notes)
        result = _trigger(err, request, token, json_out)
        result.notes[:0] = notes
        for note in result.notes[len(notes) :]:
            err.print(f"[yellow]note:[/] {escape(note)}")
        if store_url is not None:
            result.store_url = store_url
        if not json_out:
            render_matched(out, result)
            if result.triggered and result.output_dir:
                out.print(f"trace files go to [bold]{escape(result.output_dir)}[/]")
        if not no_catalog:  # as soon as the request is made (status "requested")
            if wait:  # so that a later run can tell when this one was killed while waiting
                result.waiter = waiter_info()
            _mark_abandoned(err, result, catalog)
            _record(err, result, catalog)

        if wait and result.files:
            if json_out or not err.is_terminal:
                result = wait_for_trace(result, timeout=limit, token=token)
            else:
                result = _progress_waiter(err, result, limit, token)
            captured = check_captured(result)
            result.captured = captured.to_json()

        if store_url is not None and result.files:
            if not json_out:
                err.print(f"storing trace files in [bold]{escape(store_url)}[/]")
            store_trace_result(result, target_store or store_url, storage_options=storage_options)
        if not no_catalog and wait:  # again: sizes, completeness, sha256 and storage URLs
            _record(err, result, catalog)

        if json_out:
            sys.stdout.write(orjson.dumps(result.to_json(), option=orjson.OPT_INDENT_2).decode() + "\n")
            sys.stdout.flush()
        else:
            render_files(out, result)
            if result.captured:
                render_captured(out, err, result.captured)
            if result.manifest_paths:
                out.print(f"manifest: {escape(result.manifest_paths[0])}")
            if result.stored:
                out.print(stored_table(result))
            if result.catalog:
                out.print(f"recorded in catalog {escape(result.catalog)}")
            if result.files and not wait:
                out.print("files appear once each process has traced; use --wait to wait for them")
        for problem in result.errors:
            err.print(f"[bold red]error:[/] {escape(problem.message)}")
        if result.errors:
            raise typer.Exit(1)
        if unusable(result.captured):
            raise typer.Exit(UNUSABLE_EXIT)
