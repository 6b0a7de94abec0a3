"""`kscope jobs`, `kscope traces` and `kscope catalog ...`: what the catalog knows.

Heavy imports (SQLAlchemy, Polars, alembic) happen inside the commands so `kscope --help` stays
fast. ``--json`` output is documented in docs/storage-and-catalog.md and is stable:
``{"kinetoscope_catalog": 1, "catalog": <url, password hidden>, "<kind>": [...]}``.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, Optional, TypeVar

import typer

from kinetoscope.cli.examples import examples
from kinetoscope.units import fmt_bytes

JOBS_EXAMPLES = examples(
    ("kscope jobs", "jobs in ~/.kinetoscope/catalog.db, newest first"),
    ("kscope jobs --catalog postgresql://kscope@db/kscope --json", "a shared catalog, as JSON"),
)
TRACES_EXAMPLES = examples(
    ("kscope traces --job-id 36199 --files", "one job's requests and their files"),
    ("kscope traces --limit 5 --json", "the five newest requests, as JSON"),
)
CATALOG_EXAMPLES = examples(
    ("kscope catalog import /tmp/kinetoscope/traces/", "record trace folders written earlier"),
    ("kscope catalog show kst-20261121-053012-3f9a", "one request: files, sizes, analyses"),
)
IMPORT_EXAMPLES = examples(
    ("kscope catalog import /tmp/kinetoscope/traces/kst-20261121-053012-3f9a/", "one request folder"),
    ("kscope catalog import /data/traces/ --store s3://bucket/traces", "upload, then record"),
)
SHOW_EXAMPLES = examples(
    ("kscope catalog show kst-20261121-053012-3f9a", "files, sizes, sha256, analyses"),
    ("kscope catalog show kst-20261121-053012-3f9a --json", "the same, as JSON"),
)

JSON_VERSION = 1
F = TypeVar("F", bound=Callable[..., Any])


def _user_errors(fn: F) -> F:
    """OS errors (unreadable folder, full disk...) become one-line user errors."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        from kinetoscope.errors import KinetoscopeError

        try:
            return fn(*args, **kwargs)
        except KinetoscopeError:
            raise
        except OSError as exc:
            where = f"{exc.filename}: " if exc.filename else ""
            raise KinetoscopeError(f"{where}{exc.strerror or exc}") from exc

    return wrapper  # type: ignore[return-value]


CatalogOpt = typer.Option(
    None,
    "--catalog",
    metavar="URL",
    help="Catalog database: a SQLite path or sqlite:///..., or postgresql://user@host/db. "
    "Default: $KSCOPE_CATALOG, else ~/.kinetoscope/catalog.db.",
)
JsonOpt = typer.Option(False, "--json", help="Print JSON (stable; see docs/storage-and-catalog.md).")
LimitOpt = typer.Option(
    0, "--limit", min=0, metavar="N", help="Show at most N, newest first (default 0: no limit)."
)


def _emit_json(doc: dict[str, Any]) -> None:
    import orjson

    sys.stdout.write(orjson.dumps(doc, option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS).decode() + "\n")
    sys.stdout.flush()


def _size(n: int | None) -> str:
    """A file size for the catalog tables (``-`` when unknown)."""
    return fmt_bytes(n, missing="-", thousands=False)


def _hosts(hosts: list[str], show: int = 2) -> str:
    if not hosts:
        return "-"
    head = ", ".join(hosts[:show])
    return head + (f" +{len(hosts) - show}" if len(hosts) > show else "")


def _when(dt: Any) -> str:
    from kinetoscope.protocol.manifest import format_time

    return (format_time(dt) or "-").replace("T", " ").replace("Z", "")


def _open(url: Optional[str]) -> Any:
    from kinetoscope.store.catalog import Catalog

    return Catalog.open(url)


PIPE_WIDTH = 250  # piped output (no terminal, no $COLUMNS): wide enough that no table folds


def _table(title: str, columns: list[str], prose: tuple[str, ...] = ()) -> Any:
    """A catalog table: every column a value (ids, names, sizes: never broken) except the
    ``prose`` ones (command lines, recommendations), which wrap between words."""
    from kinetoscope.termtext import Col, table, text

    return table(title, [text(c) if c in prose else Col(c) for c in columns], [])


def _console() -> Any:
    import os

    from rich.console import Console

    console = Console(highlight=False)
    if not console.is_terminal and "COLUMNS" not in os.environ:
        console = Console(highlight=False, width=PIPE_WIDTH)
    return console


def _print(renderable: Any) -> None:
    """A message wrapped between words; a table as a table when it fits the width with every
    value whole, else as one block of ``header: value`` pairs per row, so that no id, file name
    or path is folded mid-token on an 80-column terminal (kinetoscope.termtext)."""
    from kinetoscope.termtext import print_table, print_wrapped

    console = _console()
    if isinstance(renderable, str):
        print_wrapped(console, renderable, indent="", subsequent="  ")
        return
    if renderable.title:
        print_wrapped(console, str(renderable.title), indent="", subsequent="  ", style="bold")
        renderable.title = None
    print_table(console, renderable)


def _traces_table(title: str, traces: list[Any]) -> Any:
    t = _table(title, ["TRACE ID", "CREATED (UTC)", "STATUS", "JOBS", "HOSTS", "FILES", "SIZE"])
    for r in traces:
        t.add_row(
            r.trace_id,
            _when(r.created),
            r.status,
            ", ".join(r.job_ids) or "-",
            _hosts(r.hosts),
            f"{r.complete_files}/{r.file_count}",
            _size(r.total_bytes),
        )
    return t


def _print_stores(traces: list[Any]) -> None:
    """Where each request was stored, one whole URL per line (a table would fold it)."""
    for r in traces:
        if r.store_url:
            _print(f"{r.trace_id} stored in {r.store_url}")


def _files_table(title: str, traces: list[Any]) -> Any:
    many = len(traces) > 1
    t = _table(
        title,
        (["TRACE ID"] if many else []) + ["RANK", "HOST", "PID", "JOB", "FILE", "SIZE", "COMPLETE", "SHA256"],
    )
    for r in traces:
        for f in r.files:
            t.add_row(
                *([r.trace_id] if many else []),
                "-" if f.rank is None else str(f.rank),
                f.host or "-",
                str(f.pid or "-"),
                f.job_id or "-",
                f.file,
                _size(f.bytes),
                {True: "yes", False: "no", None: "?"}[f.complete],
                (f.sha256 or "-")[:12],
            )
    return t


def _print_file_locations(traces: list[Any]) -> None:
    """Each file's full location (storage URL, else local path) on its own line, never folded,
    so that it can be copied as it is."""
    for r in traces:
        for f in r.files:
            if f.storage_url or f.path:
                _print(f"{r.trace_id} rank {'-' if f.rank is None else f.rank}: {f.storage_url or f.path}")


def register(app: typer.Typer) -> None:
    @app.command("traces", epilog=TRACES_EXAMPLES)
    @_user_errors
    def traces_cmd(
        job_id: Optional[str] = typer.Option(
            None, "--job-id", metavar="ID", help="Only trace requests of this job."
        ),
        catalog: Optional[str] = CatalogOpt,
        as_json: bool = JsonOpt,
        limit: int = LimitOpt,
        status: Optional[str] = typer.Option(
            None, "--status", help="Only requests with this status (complete, incomplete, requested)."
        ),
        files: bool = typer.Option(
            False,
            "--files",
            help='Also list each request\'s files (size, sha256, storage URL); in --json as "file_list".',
        ),
    ) -> None:
        """List recorded trace requests, newest first."""
        with _open(catalog) as cat:
            found = cat.trace_requests(job_id=job_id, limit=limit or None, status=status)
            if files:
                found = [cat.get_trace_request(r.trace_id) or r for r in found]
            if as_json:
                _emit_json(
                    {
                        "kinetoscope_catalog": JSON_VERSION,
                        "catalog": cat.display_url,
                        "traces": [_trace_json(r, files=files) for r in found],
                    }
                )
                return
            if not found:
                what = f" for job {job_id}" if job_id else ""
                _print(f"No trace requests{what} in catalog {cat.display_url}.")
                return
            _print(_traces_table(f"Trace requests in {cat.display_url}", found))
            _print_stores(found)
            if files:
                _print(_files_table("Files", found))
                _print_file_locations(found)

    catalog_app = typer.Typer(
        help="Manage the trace catalog (record existing trace folders, show requests).",
        epilog=CATALOG_EXAMPLES,
        no_args_is_help=True,
        add_completion=False,
        pretty_exceptions_enable=False,
    )

    @catalog_app.command("import", epilog=IMPORT_EXAMPLES)
    @_user_errors
    def import_cmd(
        trace_dir: Path = typer.Argument(
            ..., help="A request folder with manifest.json (or a folder of such folders)."
        ),
        catalog: Optional[str] = CatalogOpt,
        store: Optional[str] = typer.Option(
            None, "--store", metavar="URL", help="Also upload the files to this store (path or s3://...)."
        ),
        store_option: Optional[list[str]] = typer.Option(
            None,
            "--store-option",
            metavar="KEY=VALUE",
            help="fsspec/s3fs option for --store, repeatable (e.g. endpoint_url=http://minio:9000).",
        ),
        no_hash: bool = typer.Option(False, "--no-hash", help="Do not compute sha256 of the files."),
        as_json: bool = JsonOpt,
    ) -> None:
        """Record an existing trace folder (with its manifest.json) in the catalog."""
        from kinetoscope.errors import UsageError
        from kinetoscope.store.storage import parse_store_options

        storage_options = parse_store_options(store_option)
        if storage_options and not store:
            raise UsageError("--store-option only applies with --store URL")
        dirs = _request_dirs(Path(trace_dir))
        with _open(catalog) as cat:
            records = [_import_one(cat, d, store, storage_options, not no_hash) for d in dirs]
            if as_json:
                _emit_json(
                    {
                        "kinetoscope_catalog": JSON_VERSION,
                        "catalog": cat.display_url,
                        "imported": [_trace_json(r, files=True) for r in records],
                    }
                )
                return
            _print(_traces_table(f"Recorded in {cat.display_url}", records))

    @catalog_app.command("show", epilog=SHOW_EXAMPLES)
    @_user_errors
    def show_cmd(
        trace_id: str = typer.Argument(..., help="Trace request id."),
        catalog: Optional[str] = CatalogOpt,
        as_json: bool = JsonOpt,
    ) -> None:
        """Show one trace request with its files and analyses."""
        from kinetoscope.errors import KinetoscopeError

        with _open(catalog) as cat:
            rec = cat.get_trace_request(trace_id)
            if rec is None:
                raise KinetoscopeError(f"no trace request {trace_id!r} in catalog {cat.display_url}")
            found = cat.analyses(trace_id=trace_id)
            if as_json:
                doc = _trace_json(rec, files=True)
                doc["config"] = rec.config
                doc["analyses"] = [a.to_dict(with_document=False) for a in found]
                _emit_json({"kinetoscope_catalog": JSON_VERSION, "catalog": cat.display_url, "trace": doc})
                return
            _print(_traces_table(f"Trace request {trace_id}", [rec]))
            _print_stores([rec])
            _print(_files_table("Files", [rec]))
            _print_file_locations([rec])
            if found:
                _print(_analyses_table(found))

    app.add_typer(catalog_app, name="catalog")


def _request_dirs(root: Path) -> list[Path]:
    """``root`` when it is a request folder (a manifest in it), else its request sub-folders."""
    from kinetoscope.protocol.manifest import MANIFEST_NAME, ManifestError

    def is_request(p: Path) -> bool:
        return (p / MANIFEST_NAME).is_file() or any(p.glob("manifest.*.json"))

    if not root.is_dir():
        raise ManifestError(f"{root}: not a directory")
    dirs = [root] if is_request(root) else sorted(p for p in root.iterdir() if p.is_dir() and is_request(p))
    if not dirs:
        raise ManifestError(
            f"{root}: no {MANIFEST_NAME} here or in its sub-folders (not a kscope trace folder)"
        )
    return dirs


def _import_one(cat: Any, d: Path, store: str | None, storage_options: Any, sha256: bool) -> Any:
    """Record one request folder, uploading its files to ``store`` first when given."""
    if not store:
        return cat.import_trace_dir(d, compute_sha256=sha256)
    from kinetoscope.protocol.manifest import load_trace_dir
    from kinetoscope.store.upload import PartialUploadError, upload_trace_request

    try:
        objs = upload_trace_request(d, store, storage_options=storage_options)
    except PartialUploadError as exc:
        # say so in the catalog (status "partial", the reason), then fail
        cat.record_trace_request(exc.manifest, exc.stored, base_dir=d.absolute())
        raise
    return cat.record_trace_request(load_trace_dir(d), objs, base_dir=d.absolute())


def _analyses_table(found: list[Any]) -> Any:
    a = _table("Analyses", ["ID", "CREATED (UTC)", "NAME", "VERSION", "STEP TIME", "STRAGGLER"])
    for r in found:
        a.add_row(
            str(r.id),
            _when(r.created),
            r.name,
            r.version,
            "-" if r.step_time_ms is None else f"{r.step_time_ms:.2f} ms",
            r.straggler_kind or "-",
        )
    return a


def _trace_json(r: Any, files: bool = False) -> dict[str, Any]:
    from kinetoscope.protocol.manifest import format_time

    doc: dict[str, Any] = {
        "trace_id": r.trace_id,
        "created": format_time(r.created),
        "status": r.status,
        "requested_by": r.requested_by,
        "job_ids": list(r.job_ids),
        "hosts": list(r.hosts),
        "files": r.file_count,
        "complete_files": r.complete_files,
        "bytes": r.total_bytes,
        "store_url": r.store_url,
        "recorded_at": format_time(r.recorded_at),
        "updated_at": format_time(r.updated_at),
    }
    if files:
        doc["file_list"] = [f.to_dict() for f in r.files]
    return doc
