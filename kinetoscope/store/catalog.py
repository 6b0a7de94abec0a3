"""The catalog: jobs, trace requests, trace files and analysis results in SQLite or PostgreSQL.

``Catalog.open(url)`` connects and upgrades the schema to the newest alembic revision shipped in
``kinetoscope/store/migrations``. URL resolution: the ``url`` argument, else ``$KSCOPE_CATALOG``,
else ``~/.kinetoscope/catalog.db``. Plain paths mean SQLite; ``postgresql://`` /
``postgres://`` use psycopg 3.

Several processes may write at once: SQLite runs in WAL mode with a busy timeout and every
writing transaction starts with ``BEGIN IMMEDIATE`` (writers queue instead of failing on a lock
upgrade); on PostgreSQL rows are locked ``FOR UPDATE`` in a fixed order. Recording is an
idempotent upsert keyed by trace id and file name, so recording the same manifest twice (or
a newer version of it) is safe.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import logging
import os
import re
import sqlite3
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson
import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.engine.url import URL, make_url

from kinetoscope import __version__
from kinetoscope.errors import KinetoscopeError
from kinetoscope.protocol.manifest import (
    MANIFEST_NAME,
    ManifestError,
    format_time,
    parse_time,
    read_regular_bytes,
    validate_manifest,
)
from kinetoscope.store.models import analyses, jobs, trace_files, trace_requests
from kinetoscope.store.retry import RetryPolicy, call_with_retries
from kinetoscope.store.storage import StoredObject, join_url

if TYPE_CHECKING:
    import polars as pl

DEFAULT_CATALOG = Path("~/.kinetoscope/catalog.db")
ENV_CATALOG = "KSCOPE_CATALOG"
MIGRATIONS = Path(__file__).resolve().parent / "migrations"
_PG_LOCK_KEY = 0x6B73636F7065  # "kscope": serialises concurrent schema upgrades on PostgreSQL
_SQLITE_BUSY_TIMEOUT_S = 60.0  # how long a writer queues behind another before giving up


class CatalogError(KinetoscopeError):
    """The catalog cannot be opened/used (bad URL, unreachable server, newer schema...)."""


# ---------------------------------------------------------------------------------------------
# URLs and engines


def default_catalog_path() -> Path:
    return DEFAULT_CATALOG.expanduser()


def resolve_catalog_url(url: str | os.PathLike[str] | None = None) -> str:
    """The SQLAlchemy URL for ``url`` / ``$KSCOPE_CATALOG`` / the default SQLite file."""
    raw = os.fspath(url) if url is not None else None
    if not raw:
        raw = os.environ.get(ENV_CATALOG) or ""
    if not raw:
        path = default_catalog_path()
        path.parent.mkdir(parents=True, exist_ok=True)
        return f"sqlite:///{path}"
    if raw.startswith("file://"):
        raw = raw[len("file://") :]
    if "://" not in raw:
        return f"sqlite:///{Path(os.path.expanduser(raw)).absolute()}"
    scheme, rest = raw.split("://", 1)
    if scheme in ("postgresql", "postgres", "pgsql"):
        return f"postgresql+psycopg://{rest}"
    return raw


def redact(url: str | URL) -> str:
    """The URL with its password hidden (for messages and ``--json`` output)."""
    try:
        return make_url(str(url)).render_as_string(hide_password=True)
    except Exception:  # noqa: BLE001
        return re.sub(r"//([^:/@]+):[^@]*@", r"//\1:***@", str(url))


def _json_dumps(obj: Any) -> str:
    return orjson.dumps(obj, option=orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS).decode()


def make_engine(url: str) -> Engine:
    """An engine configured for concurrent kscope processes (see the module docstring)."""
    try:
        u = make_url(url)
    except Exception as exc:  # noqa: BLE001
        raise CatalogError(f"invalid catalog URL {redact(url)}: {exc}") from exc
    backend = u.get_backend_name()
    kwargs: dict[str, Any] = {"json_serializer": _json_dumps, "json_deserializer": orjson.loads}
    if backend == "sqlite":
        db = u.database or ""
        if db and db != ":memory:" and not db.startswith("file:"):
            parent = Path(db).expanduser().absolute().parent
            if not parent.is_dir():
                raise CatalogError(f"cannot open catalog {redact(url)}: directory {parent} does not exist")
        if not db or db == ":memory:":
            kwargs["poolclass"] = sa.pool.StaticPool
        kwargs["connect_args"] = {"timeout": _SQLITE_BUSY_TIMEOUT_S, "check_same_thread": False}
    elif backend == "postgresql":
        if "connect_timeout" not in u.query:
            kwargs["connect_args"] = {"connect_timeout": 10}
        kwargs["pool_pre_ping"] = True
    try:
        engine = sa.create_engine(u, **kwargs)
    except ImportError as exc:  # the driver of an optional extra is not installed
        extra = " (pip install 'kinetoscope[postgres]')" if backend == "postgresql" else ""
        raise CatalogError(
            f"cannot open catalog {redact(url)}: driver not installed: {exc.name or exc}{extra}"
        ) from exc
    except Exception as exc:  # noqa: BLE001 - unknown driver, bad argument...
        raise CatalogError(f"cannot open catalog {redact(url)}: {_first_line(exc)}") from exc
    if backend == "sqlite":
        _configure_sqlite(engine)
    return engine


def _configure_sqlite(engine: Engine) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _rec: Any) -> None:
        dbapi_conn.isolation_level = None  # we issue BEGIN ourselves (below)
        cur = dbapi_conn.cursor()
        try:
            cur.execute(f"PRAGMA busy_timeout = {int(_SQLITE_BUSY_TIMEOUT_S * 1000)}")
            if engine.url.database not in (None, "", ":memory:"):
                _enable_wal(cur)
            cur.execute("PRAGMA synchronous = NORMAL")
            cur.execute("PRAGMA foreign_keys = ON")
        finally:
            cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        mode = "DEFERRED" if conn.get_execution_options().get("kscope_readonly") else "IMMEDIATE"
        conn.exec_driver_sql(f"BEGIN {mode}")


def _sqlite_locked(exc: BaseException) -> bool:
    text = str(exc).lower()
    return isinstance(exc, sqlite3.OperationalError) and ("locked" in text or "busy" in text)


# 2 ms doubling to 0.1 s, then 0.1 s steps: about _SQLITE_BUSY_TIMEOUT_S in all
_WAL_RETRY = RetryPolicy(
    attempts=int(_SQLITE_BUSY_TIMEOUT_S / 0.1) + 7, base_delay=0.002, max_delay=0.1, jitter=0.25
)


def _enable_wal(cur: Any) -> None:
    """Switch the database to WAL, retrying while another connection holds a lock.

    Why retries: the switch upgrades a read lock to a write lock, and SQLite answers a contended
    upgrade with ``SQLITE_BUSY`` at once, without calling the busy handler (waiting could
    deadlock), so ``busy_timeout`` does not cover it. This bites only while a fresh catalog is
    still in rollback mode, e.g. two ``kscope`` processes creating it at the same moment; once
    the file is in WAL (a persistent setting) the pragma is a no-op that takes no write lock.
    """
    call_with_retries(
        lambda: cur.execute("PRAGMA journal_mode = WAL"),
        _WAL_RETRY,
        "switching the catalog to WAL",
        transient=_sqlite_locked,
        log_level=logging.DEBUG,
    )


def _first_line(exc: BaseException) -> str:
    orig = getattr(exc, "orig", None) or exc
    text = str(orig).strip() or type(orig).__name__
    return text.splitlines()[0].strip()


# ---------------------------------------------------------------------------------------------
# migrations


def _alembic_config(connection: Connection | None = None) -> Any:
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    if connection is not None:
        cfg.attributes["connection"] = connection
    return cfg


def head_revisions() -> set[str]:
    from alembic.script import ScriptDirectory

    return set(ScriptDirectory.from_config(_alembic_config()).get_heads())


def current_revisions(conn: Connection) -> set[str]:
    from alembic.runtime.migration import MigrationContext

    return set(MigrationContext.configure(conn).get_current_heads())


def _stamped(conn: Connection) -> set[str] | None:
    """The revisions recorded in ``alembic_version`` (None when there is no such table)."""
    if not sa.inspect(conn).has_table("alembic_version"):
        return None
    return set(conn.execute(sa.text("SELECT version_num FROM alembic_version")).scalars())


def upgrade(engine: Engine) -> None:
    """Bring the schema to head (no-op when current); safe with concurrent openers."""
    from kinetoscope.store.schema import HEAD

    with engine.connect().execution_options(kscope_readonly=True) as conn:
        if _stamped(conn) == {HEAD}:
            return  # the common case: no alembic import at all
    from alembic import command
    from alembic.script import ScriptDirectory

    heads = head_revisions()
    with engine.connect().execution_options(kscope_readonly=True) as conn:
        current = current_revisions(conn)
    if current == heads:
        return
    known = {s.revision for s in ScriptDirectory.from_config(_alembic_config()).walk_revisions()}
    unknown = current - known
    if unknown:
        raise CatalogError(
            f"catalog schema revision {', '.join(sorted(unknown))} is newer than this kscope "
            f"({__version__}) knows; upgrade kinetoscope"
        )
    with engine.begin() as conn:  # BEGIN IMMEDIATE on SQLite: one upgrader at a time
        if conn.dialect.name == "postgresql":
            conn.execute(sa.text("SELECT pg_advisory_xact_lock(:k)"), {"k": _PG_LOCK_KEY})
        command.upgrade(_alembic_config(conn), "head")


# ---------------------------------------------------------------------------------------------
# records


def _iso(dt: datetime | None) -> str | None:
    return format_time(dt) if dt is not None else None


@dataclass
class JobRecord:
    job_id: str
    hosts: list[str]
    world_size: int | None
    first_seen: datetime
    last_seen: datetime
    cmdline: str | None
    traces: int = 0
    job_source: str | None = None  # where the job identity came from (docs/deploy.md §5)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["first_seen"], d["last_seen"] = _iso(self.first_seen), _iso(self.last_seen)
        return d


@dataclass
class TraceFileRecord:
    file: str
    path: str | None
    host: str | None
    pid: int | None
    rank: int | None
    local_rank: int | None
    world_size: int | None
    job_id: str | None
    cmdline: str | None
    iterations: int | None
    duration_ms: float | None
    bytes: int | None
    sha256: str | None
    storage_url: str | None
    complete: bool | None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _recorded_path(path: Any, name: str, base_dir: str | os.PathLike[str] | None) -> str | None:
    """The ``path`` to record for file ``name``: the manifest's own unless it leads outside
    ``base_dir`` (then ``<base_dir>/<name>``, where the file would be in that folder)."""
    from kinetoscope.protocol.manifest import path_inside

    if base_dir is None:
        return path if isinstance(path, str) and path else None
    if isinstance(path, str) and path and path_inside(base_dir, path):
        return path
    return str(Path(base_dir) / name)


@dataclass
class TraceRequestRecord:
    trace_id: str
    created: datetime | None
    status: str
    requested_by: str | None
    config: str | None
    hosts: list[str]
    job_ids: list[str]
    file_count: int
    complete_files: int
    total_bytes: int
    store_url: str | None
    recorded_at: datetime
    updated_at: datetime
    files: list[TraceFileRecord] = field(default_factory=list)
    manifest: dict[str, Any] = field(default_factory=dict)

    def to_dict(self, *, with_manifest: bool = False) -> dict[str, Any]:
        d = asdict(self)
        for k in ("created", "recorded_at", "updated_at"):
            d[k] = _iso(getattr(self, k))
        if not with_manifest:
            d.pop("manifest")
        return d


@dataclass
class AnalysisRecord:
    id: int
    created: datetime
    name: str
    version: str
    trace_id: str | None
    inputs: list[str]
    summary: dict[str, Any]
    step_time_ms: float | None
    straggler_kind: str | None
    straggler_rank: int | None
    world_size: int | None
    document: dict[str, Any] = field(default_factory=dict)

    def to_dict(self, *, with_document: bool = True) -> dict[str, Any]:
        d = asdict(self)
        d["created"] = _iso(self.created)
        if not with_document:
            d.pop("document")
        return d


# Polars schemas of the list calls (stable even when empty). Built lazily: importing Polars
# costs ~0.5 s and the CLI does not need it.
_SCHEMA_NAMES = ("JOBS_SCHEMA", "TRACES_SCHEMA", "TRACE_FILES_SCHEMA", "ANALYSES_SCHEMA")


@functools.lru_cache(maxsize=1)
def _schemas() -> dict[str, dict[str, Any]]:
    import polars as pl

    dt = pl.Datetime("us", "UTC")
    return {
        "JOBS_SCHEMA": {
            "job_id": pl.Utf8,
            "hosts": pl.List(pl.Utf8),
            "world_size": pl.Int64,
            "first_seen": dt,
            "last_seen": dt,
            "traces": pl.Int64,
            "cmdline": pl.Utf8,
            "job_source": pl.Utf8,
        },
        "TRACES_SCHEMA": {
            "trace_id": pl.Utf8,
            "created": dt,
            "status": pl.Utf8,
            "requested_by": pl.Utf8,
            "job_ids": pl.List(pl.Utf8),
            "hosts": pl.List(pl.Utf8),
            "files": pl.Int64,
            "complete_files": pl.Int64,
            "bytes": pl.Int64,
            "store_url": pl.Utf8,
            "recorded_at": dt,
        },
        "TRACE_FILES_SCHEMA": {
            "trace_id": pl.Utf8,
            "file": pl.Utf8,
            "host": pl.Utf8,
            "pid": pl.Int64,
            "rank": pl.Int64,
            "local_rank": pl.Int64,
            "world_size": pl.Int64,
            "job_id": pl.Utf8,
            "iterations": pl.Int64,
            "duration_ms": pl.Float64,
            "bytes": pl.Int64,
            "sha256": pl.Utf8,
            "storage_url": pl.Utf8,
            "path": pl.Utf8,
            "complete": pl.Boolean,
            "cmdline": pl.Utf8,
        },
        "ANALYSES_SCHEMA": {
            "id": pl.Int64,
            "created": dt,
            "name": pl.Utf8,
            "version": pl.Utf8,
            "trace_id": pl.Utf8,
            "inputs": pl.List(pl.Utf8),
            "step_time_ms": pl.Float64,
            "straggler_kind": pl.Utf8,
            "straggler_rank": pl.Int64,
            "world_size": pl.Int64,
        },
    }


def __getattr__(name: str) -> Any:
    if name in _SCHEMA_NAMES:
        return _schemas()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _frame(rows: list[list[Any]], schema_name: str) -> pl.DataFrame:
    import polars as pl

    return pl.DataFrame(rows, schema=_schemas()[schema_name], orient="row")


_CONFIG_ITERS = re.compile(r"^\s*ACTIVITIES_ITERATIONS\s*=\s*(\d+)", re.M)
_CONFIG_DUR = re.compile(r"^\s*ACTIVITIES_DURATION_(SECS|MSECS)\s*=\s*(\d+(?:\.\d+)?)", re.M)

SUMMARY_FIELDS = ("step_time_ms", "straggler_kind", "straggler_rank", "world_size")


def _config_iterations(config: str | None) -> int | None:
    m = _CONFIG_ITERS.search(config or "")
    return int(m.group(1)) if m else None


def _config_duration_ms(config: str | None) -> float | None:
    m = _CONFIG_DUR.search(config or "")
    if not m:
        return None
    v = float(m.group(2))
    return v * 1000.0 if m.group(1) == "SECS" else v


def _int_or_none(v: Any) -> int | None:
    if v is None or isinstance(v, bool):
        return None
    try:
        return int(v)
    except (TypeError, ValueError):
        return None


def _float_or_none(v: Any) -> float | None:
    if v is None or isinstance(v, bool):
        return None
    try:
        return float(v)
    except (TypeError, ValueError):
        return None


def _now() -> datetime:
    return datetime.now(timezone.utc)


def _store_url_map(trace_id: str, store_urls: Any) -> tuple[dict[str, str], str | None]:
    """Normalise ``store_urls`` into {file name: url} and a base store URL."""
    if store_urls is None:
        return {}, None
    if isinstance(store_urls, (str, os.PathLike)):
        base = os.fspath(store_urls).rstrip("/")
        return {"*": base}, base
    out: dict[str, str] = {}
    if isinstance(store_urls, Mapping):
        for k, v in store_urls.items():
            out[str(k).rsplit("/", 1)[-1]] = str(v)
        return out, None
    base = None
    for obj in store_urls:
        if isinstance(obj, StoredObject):
            name = (obj.key or obj.url).rsplit("/", 1)[-1]
            out[name] = obj.url
            if name == MANIFEST_NAME and obj.url.endswith(f"/{trace_id}/{MANIFEST_NAME}"):
                base = obj.url[: -len(f"/{trace_id}/{MANIFEST_NAME}")]
        else:
            raise CatalogError(f"store_urls: expected StoredObject, mapping or URL, got {type(obj).__name__}")
    return out, base


class Catalog:
    """A handle on one catalog database. Use ``Catalog.open(url)``; close it (or use ``with``)."""

    def __init__(self, engine: Engine, url: str) -> None:
        self.engine = engine
        self.url = url

    # -- lifecycle ---------------------------------------------------------------------------
    @classmethod
    def open(cls, url: str | os.PathLike[str] | None = None, *, migrate: bool = True) -> Catalog:
        """Connect (``url`` / ``$KSCOPE_CATALOG`` / ``~/.kinetoscope/catalog.db``) and upgrade the
        schema to head. Raises :class:`CatalogError` with one line when that fails."""
        resolved = resolve_catalog_url(url)
        engine = make_engine(resolved)
        try:
            with engine.connect().execution_options(kscope_readonly=True) as conn:
                conn.execute(sa.text("SELECT 1"))
            if migrate:
                upgrade(engine)
        except CatalogError:
            engine.dispose()
            raise
        except Exception as exc:  # noqa: BLE001 - driver errors become one clear line
            engine.dispose()
            raise CatalogError(f"cannot open catalog {redact(resolved)}: {_first_line(exc)}") from exc
        return cls(engine, resolved)

    def close(self) -> None:
        self.engine.dispose()

    def __enter__(self) -> Catalog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Catalog({redact(self.url)!r})"

    @property
    def display_url(self) -> str:
        return redact(self.url)

    @property
    def dialect(self) -> str:
        return self.engine.dialect.name

    @contextlib.contextmanager
    def _write(self) -> Iterator[Connection]:
        try:
            with self.engine.begin() as conn:
                yield conn
        except (KinetoscopeError, ValueError, TypeError):
            raise
        except sa.exc.SQLAlchemyError as exc:
            raise CatalogError(f"catalog {self.display_url}: {_first_line(exc)}") from exc

    @contextlib.contextmanager
    def _read(self) -> Iterator[Connection]:
        try:
            with self.engine.connect().execution_options(kscope_readonly=True) as conn:
                yield conn
        except sa.exc.SQLAlchemyError as exc:
            raise CatalogError(f"catalog {self.display_url}: {_first_line(exc)}") from exc

    def _insert(self, conn: Connection, table: sa.Table) -> Any:
        if conn.dialect.name == "postgresql":
            from sqlalchemy.dialects.postgresql import insert as pg_insert

            return pg_insert(table)
        if conn.dialect.name == "sqlite":
            from sqlalchemy.dialects.sqlite import insert as sqlite_insert

            return sqlite_insert(table)
        raise CatalogError(f"unsupported catalog database {conn.dialect.name}")  # pragma: no cover

    # -- writing -----------------------------------------------------------------------------
    def record_trace_request(
        self,
        manifest: Mapping[str, Any],
        store_urls: Any = None,
        *,
        base_dir: str | os.PathLike[str] | None = None,
    ) -> TraceRequestRecord:
        """Record (or update) one trace request from its manifest; returns what is stored now.

        ``store_urls``: where the files were uploaded: the list of ``StoredObject`` returned by
        ``upload_trace_request``, a mapping {file name: URL}, or the base store URL (then each
        file is ``<base>/<trace_id>/<file>``). Entries' own ``url`` keys (written by
        ``upload_trace_request``) are used too. ``base_dir``: the folder the manifest came from
        (file paths default to ``<base_dir>/<file>``; a ``path`` outside it is never recorded,
        as ``import_trace_dir`` does: ``kscope analyze <trace_id>`` would read what is there).

        Upsert semantics: a later call for the same ``trace_id`` updates the request, adds new
        files and fills in fields (a null in the new manifest never erases a known value).
        """
        doc = validate_manifest(manifest, source="manifest")
        trace_id = doc["trace_id"]
        urls, base_from_objs = _store_url_map(trace_id, store_urls)
        store_base = base_from_objs or (urls.get("*") if "*" in urls else None) or doc.get("store_url")
        now = _now()
        created = parse_time(doc.get("created")) or None
        file_rows = _file_rows(doc, urls, base_dir, now)
        with self._write() as conn:
            # 1. the request row (exists + locked before anything else: fixed lock order)
            self._lock_request_row(conn, doc, created, now, store_base)
            # 2. files: upsert keyed by (trace_id, file); nulls never erase known values
            if file_rows:
                stmt = self._insert(conn, trace_files)
                keep = {"trace_id", "file", "recorded_at", "id"}
                stmt = stmt.on_conflict_do_update(
                    index_elements=["trace_id", "file"],
                    set_={
                        c.name: sa.func.coalesce(stmt.excluded[c.name], c)
                        for c in trace_files.columns
                        if c.name not in keep
                    },
                )
                conn.execute(stmt, file_rows)
            # 3. aggregates from every file known for this request
            rows, job_ids = self._update_request_row(conn, doc, created, now, store_base)
            # 4. jobs, locked in sorted order
            sources = {
                str(e["job_id"]): str(e["job_source"])
                for e in doc["files"]
                if e.get("job_id") is not None and isinstance(e.get("job_source"), str)
            }
            for job_id in sorted(job_ids):
                self._merge_job(conn, job_id, rows, doc, created or now, sources.get(job_id))
        rec = self.get_trace_request(trace_id)
        assert rec is not None
        return rec

    def _lock_request_row(
        self, conn: Any, doc: dict[str, Any], created: Any, now: Any, store_base: str | None
    ) -> None:
        """Insert the request's row when new, then lock it (``record_trace_request`` step 1)."""
        trace_id = doc["trace_id"]
        ins = (
            self._insert(conn, trace_requests)
            .values(
                trace_id=trace_id,
                created=created,
                recorded_at=now,
                updated_at=now,
                config=doc.get("config"),
                requested_by=doc.get("requested_by"),
                hosts=[],
                job_ids=[],
                status="requested",
                file_count=0,
                complete_files=0,
                total_bytes=0,
                store_url=store_base,
                manifest=doc,
            )
            .on_conflict_do_nothing(index_elements=["trace_id"])
        )
        conn.execute(ins)
        conn.execute(
            sa.select(trace_requests.c.trace_id)
            .where(trace_requests.c.trace_id == trace_id)
            .with_for_update()
        )

    def _update_request_row(
        self, conn: Any, doc: dict[str, Any], created: Any, now: Any, store_base: str | None
    ) -> tuple[list[Any], list[str]]:
        """The request's aggregates from every file known for it (hosts, jobs, counts, status);
        returns those files' rows and the request's job ids (``record_trace_request`` step 3)."""
        trace_id, config, top_job = doc["trace_id"], doc.get("config"), doc.get("job_id")
        rows = conn.execute(
            sa.select(
                trace_files.c.host,
                trace_files.c.job_id,
                trace_files.c.bytes,
                trace_files.c.complete,
                trace_files.c.world_size,
                trace_files.c.cmdline,
            ).where(trace_files.c.trace_id == trace_id)
        ).all()
        hosts: list[str] = list(doc.get("hosts") or [])
        job_ids: list[str] = []
        for r in rows:
            if r.host and r.host not in hosts:
                hosts.append(r.host)
            if r.job_id and r.job_id not in job_ids:
                job_ids.append(r.job_id)
        if top_job and top_job not in job_ids:
            job_ids.append(top_job)
        old = conn.execute(sa.select(trace_requests).where(trace_requests.c.trace_id == trace_id)).one()
        old_hosts = [h for h in (old.hosts or []) if h not in hosts]
        conn.execute(
            trace_requests.update()
            .where(trace_requests.c.trace_id == trace_id)
            .values(
                created=created or old.created,
                updated_at=now,
                config=config if config is not None else old.config,
                requested_by=doc.get("requested_by") or old.requested_by,
                hosts=sorted(hosts + old_hosts),
                job_ids=sorted(job_ids),
                status=_request_status(doc, rows),
                file_count=len(rows),
                complete_files=sum(1 for r in rows if r.complete is True),
                total_bytes=sum(r.bytes or 0 for r in rows),
                store_url=store_base or old.store_url,
                manifest=doc,
            )
        )
        return rows, job_ids

    def _merge_job(
        self, conn: Any, job_id: str, rows: list[Any], doc: dict[str, Any], seen: Any, source: str | None
    ) -> None:
        """Insert or merge one job of the request (hosts, world size, first/last seen, command)."""
        jrows = [r for r in rows if r.job_id == job_id]
        j_hosts = {r.host for r in jrows if r.host} or (
            set(doc.get("hosts") or []) if job_id == doc.get("job_id") else set()
        )
        j_ws = max((r.world_size for r in jrows if r.world_size is not None), default=None)
        j_cmd = next((r.cmdline for r in jrows if r.cmdline), None)
        conn.execute(
            self._insert(conn, jobs)
            .values(
                job_id=job_id,
                hosts=sorted(j_hosts),
                world_size=j_ws,
                first_seen=seen,
                last_seen=seen,
                cmdline=j_cmd,
                job_source=source,
            )
            .on_conflict_do_nothing(index_elements=["job_id"])
        )
        cur = conn.execute(sa.select(jobs).where(jobs.c.job_id == job_id).with_for_update()).one()
        ws = max([w for w in (cur.world_size, j_ws) if w is not None], default=None)
        conn.execute(
            jobs.update()
            .where(jobs.c.job_id == job_id)
            .values(
                hosts=sorted(set(cur.hosts or []) | j_hosts),
                world_size=ws,
                first_seen=min(cur.first_seen, seen),
                last_seen=max(cur.last_seen, seen),
                cmdline=cur.cmdline or j_cmd,
                job_source=source or cur.job_source,
            )
        )

    def import_trace_dir(
        self, trace_dir: str | os.PathLike[str], *, compute_sha256: bool = True
    ) -> TraceRequestRecord:
        """Record an existing request folder (``manifest.json`` and/or ``manifest.<host>.json``).

        Files found beside the manifest get their real ``bytes`` (and ``sha256`` unless
        ``compute_sha256=False``) and ``path``; an entry without ``complete`` is marked complete
        when its file exists. Only files inside the folder are read (a ``path`` leading elsewhere
        is a ``ManifestError`` naming the manifest and field, or, when nothing is there, is not
        recorded)."""
        from kinetoscope.protocol.manifest import find_local_file, load_trace_dir, path_inside
        from kinetoscope.store.storage import sha256_file

        d = Path(trace_dir).absolute()
        doc = load_trace_dir(d)
        for i, e in enumerate(doc["files"]):
            local = find_local_file(d, e, index=i)  # inside the folder only (ManifestError else)
            if local is None:
                p = e.get("path")
                if isinstance(p, str) and p and not path_inside(d, p):
                    # not here: record where it would be in this folder, never a path elsewhere
                    # on this machine (a later `kscope analyze <trace_id>` would read it)
                    e["path"] = None
                continue
            e["path"] = str(local)
            try:
                e["bytes"] = local.stat().st_size
                if compute_sha256 and not e.get("sha256"):
                    e["sha256"] = sha256_file(local)[0]
            except OSError as exc:
                raise ManifestError(f"{local}: cannot read: {exc.strerror or exc}") from exc
            if e.get("complete") is None:
                e["complete"] = True
        return self.record_trace_request(doc, base_dir=d)

    def record_analysis(
        self,
        inputs: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
        document: Mapping[str, Any],
        *,
        name: str = "analyze",
        version: str | None = None,
        summary: Mapping[str, Any] | None = None,
        trace_id: str | None = None,
    ) -> AnalysisRecord:
        """Record one analysis result (``kscope analyze --json`` document) for trace ids and/or
        paths; returns the stored record (the same one when recorded twice).

        Summary fields for listing come from ``summary`` or the document's top-level
        ``"summary"`` object: ``step_time_ms``, ``straggler_kind``, ``straggler_rank``,
        ``world_size`` (others are kept in ``summary``). ``trace_id`` defaults to the single
        trace request the inputs belong to, when there is one.
        """
        if not isinstance(document, Mapping):
            raise CatalogError("analysis document must be a JSON object")
        if isinstance(inputs, (str, os.PathLike)):
            inputs = [inputs]
        norm = [self._normalise_input(i) for i in inputs]
        if not norm:
            raise CatalogError("record_analysis needs at least one trace id or path")
        summ: dict[str, Any] = {}
        if isinstance(document.get("summary"), Mapping):
            summ.update(document["summary"])
        if summary:
            summ.update(summary)
        version = version or __version__
        doc_bytes = orjson.dumps(
            document, option=orjson.OPT_SORT_KEYS | orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS
        )
        doc_sha = hashlib.sha256(doc_bytes).hexdigest()
        inputs_key = hashlib.sha256("\n".join(sorted(norm)).encode()).hexdigest()
        doc_clean = orjson.loads(doc_bytes)  # NaN → null, numpy → lists: valid JSON everywhere
        summ_clean = orjson.loads(
            orjson.dumps(summ, option=orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS)
        )
        ranks = summ.get("straggler_rank", summ.get("straggler_ranks"))
        if isinstance(ranks, (list, tuple)):
            ranks = ranks[0] if len(ranks) == 1 else None
        with self._write() as conn:
            tid = trace_id or self._trace_id_for(conn, norm)
            if tid is not None:
                exists = conn.execute(
                    sa.select(trace_requests.c.trace_id).where(trace_requests.c.trace_id == tid)
                ).first()
                if exists is None:
                    tid = None if trace_id is None else tid
                    if tid is not None:
                        raise CatalogError(f"record_analysis: unknown trace id {tid!r}")
            ins = (
                self._insert(conn, analyses)
                .values(
                    trace_id=tid,
                    inputs=norm,
                    inputs_key=inputs_key,
                    name=name,
                    version=version,
                    created=_now(),
                    document_sha256=doc_sha,
                    document=doc_clean,
                    summary=summ_clean,
                    step_time_ms=_float_or_none(summ.get("step_time_ms")),
                    straggler_kind=str(summ["straggler_kind"])
                    if summ.get("straggler_kind") is not None
                    else None,
                    straggler_rank=_int_or_none(ranks),
                    world_size=_int_or_none(summ.get("world_size")),
                )
                .on_conflict_do_nothing(index_elements=["inputs_key", "name", "version", "document_sha256"])
            )
            conn.execute(ins)
            aid = conn.execute(
                sa.select(analyses.c.id).where(
                    analyses.c.inputs_key == inputs_key,
                    analyses.c.name == name,
                    analyses.c.version == version,
                    analyses.c.document_sha256 == doc_sha,
                )
            ).scalar_one()
        rec = self.get_analysis(aid)
        assert rec is not None
        return rec

    @staticmethod
    def _normalise_input(i: str | os.PathLike[str]) -> str:
        s = os.fspath(i)
        if "://" in s:
            return s
        p = Path(os.path.expanduser(s))
        if p.exists():
            return str(p.absolute())
        return s

    def _trace_id_for(self, conn: Connection, inputs: list[str]) -> str | None:
        found: set[str] = set()
        for s in inputs:
            tid: str | None = None
            if "://" not in s and Path(s).exists():
                p = Path(s)
                d = p if p.is_dir() else p.parent
                m = d / MANIFEST_NAME
                if m.is_file():
                    try:
                        raw = read_regular_bytes(m, follow=False)  # no FIFO, device or symlink
                        tid = validate_manifest(orjson.loads(raw))["trace_id"]
                    except (ValueError, ManifestError):
                        tid = None
            if tid is None:
                row = conn.execute(
                    sa.select(trace_requests.c.trace_id).where(trace_requests.c.trace_id == s)
                ).first()
                if row is None:
                    row = conn.execute(
                        sa.select(trace_files.c.trace_id)
                        .where(sa.or_(trace_files.c.path == s, trace_files.c.storage_url == s))
                        .limit(1)
                    ).first()
                tid = row[0] if row else None
            if tid is not None:
                found.add(tid)
        return found.pop() if len(found) == 1 else None

    def delete_trace_request(self, trace_id: str) -> bool:
        """Forget a request and its files (analyses keep their documents). True if it existed."""
        with self._write() as conn:
            conn.execute(trace_files.delete().where(trace_files.c.trace_id == trace_id))
            conn.execute(analyses.update().where(analyses.c.trace_id == trace_id).values(trace_id=None))
            res = conn.execute(trace_requests.delete().where(trace_requests.c.trace_id == trace_id))
            return bool(res.rowcount)

    # -- reading -----------------------------------------------------------------------------
    def jobs(self, limit: int | None = None) -> list[JobRecord]:
        counts = (
            sa.select(trace_files.c.job_id, sa.func.count(sa.distinct(trace_files.c.trace_id)).label("n"))
            .where(trace_files.c.job_id.is_not(None))
            .group_by(trace_files.c.job_id)
            .subquery()
        )
        q = (
            sa.select(jobs, sa.func.coalesce(counts.c.n, 0).label("traces"))
            .select_from(jobs.outerjoin(counts, counts.c.job_id == jobs.c.job_id))
            .order_by(jobs.c.last_seen.desc(), jobs.c.job_id)
        )
        if limit:
            q = q.limit(limit)
        with self._read() as conn:
            return [
                JobRecord(
                    r.job_id,
                    list(r.hosts or []),
                    r.world_size,
                    r.first_seen,
                    r.last_seen,
                    r.cmdline,
                    int(r.traces),
                    r.job_source,
                )
                for r in conn.execute(q)
            ]

    def get_job(self, job_id: str) -> JobRecord | None:
        return next((j for j in self.jobs() if j.job_id == job_id), None)

    def list_jobs(self, limit: int | None = None) -> pl.DataFrame:
        """Jobs, most recently seen first (columns: ``JOBS_SCHEMA``)."""
        return _frame([_row(j.__dict__, "JOBS_SCHEMA") for j in self.jobs(limit)], "JOBS_SCHEMA")

    def trace_requests(
        self,
        job_id: str | None = None,
        limit: int | None = 100,
        status: str | None = None,
        *,
        with_manifest: bool = False,
    ) -> list[TraceRequestRecord]:
        q = sa.select(trace_requests)
        if job_id is not None:
            q = q.where(
                sa.exists(
                    sa.select(trace_files.c.id).where(
                        trace_files.c.trace_id == trace_requests.c.trace_id,
                        trace_files.c.job_id == str(job_id),
                    )
                )
            )
        if status is not None:
            q = q.where(trace_requests.c.status == status)
        q = q.order_by(
            sa.func.coalesce(trace_requests.c.created, trace_requests.c.recorded_at).desc(),
            trace_requests.c.trace_id.desc(),
        )
        if limit:
            q = q.limit(limit)
        with self._read() as conn:
            return [_trace_record(r, with_manifest) for r in conn.execute(q)]

    def list_traces(
        self, job_id: str | None = None, limit: int | None = 100, status: str | None = None
    ) -> pl.DataFrame:
        """Trace requests, newest first, optionally of one job (columns: ``TRACES_SCHEMA``)."""
        rows = []
        for t in self.trace_requests(job_id=job_id, limit=limit, status=status):
            rows.append(_row({**t.__dict__, "files": t.file_count, "bytes": t.total_bytes}, "TRACES_SCHEMA"))
        return _frame(rows, "TRACES_SCHEMA")

    def list_trace_files(
        self, trace_id: str | None = None, job_id: str | None = None, limit: int | None = None
    ) -> pl.DataFrame:
        """Trace files (columns: ``TRACE_FILES_SCHEMA``), by request then rank."""
        q = sa.select(trace_files)
        if trace_id is not None:
            q = q.where(trace_files.c.trace_id == trace_id)
        if job_id is not None:
            q = q.where(trace_files.c.job_id == str(job_id))
        q = q.order_by(
            trace_files.c.trace_id,
            trace_files.c.rank.is_(None),
            trace_files.c.rank,
            trace_files.c.host,
            trace_files.c.file,
        )
        if limit:
            q = q.limit(limit)
        with self._read() as conn:
            rows = [_row(r._mapping, "TRACE_FILES_SCHEMA") for r in conn.execute(q)]
        return _frame(rows, "TRACE_FILES_SCHEMA")

    def get_trace_request(self, trace_id: str) -> TraceRequestRecord | None:
        """One request with its files and manifest; None when unknown."""
        with self._read() as conn:
            r = conn.execute(sa.select(trace_requests).where(trace_requests.c.trace_id == trace_id)).first()
            if r is None:
                return None
            rec = _trace_record(r, with_manifest=True)
            frows = conn.execute(
                sa.select(trace_files)
                .where(trace_files.c.trace_id == trace_id)
                .order_by(
                    trace_files.c.rank.is_(None), trace_files.c.rank, trace_files.c.host, trace_files.c.file
                )
            ).all()
        rec.files = [
            TraceFileRecord(**{k: getattr(f, k) for k in TraceFileRecord.__dataclass_fields__}) for f in frows
        ]
        return rec

    def analyses(
        self, trace_id: str | None = None, name: str | None = None, limit: int | None = 100
    ) -> list[AnalysisRecord]:
        cols = [c for c in analyses.columns if c.name not in ("document", "inputs_key", "document_sha256")]
        q = sa.select(*cols)
        if trace_id is not None:
            q = q.where(analyses.c.trace_id == trace_id)
        if name is not None:
            q = q.where(analyses.c.name == name)
        q = q.order_by(analyses.c.created.desc(), analyses.c.id.desc())
        if limit:
            q = q.limit(limit)
        with self._read() as conn:
            return [_analysis_record(r) for r in conn.execute(q)]

    def list_analyses(
        self, trace_id: str | None = None, name: str | None = None, limit: int | None = 100
    ) -> pl.DataFrame:
        """Analysis results without their documents, newest first (columns: ``ANALYSES_SCHEMA``)."""
        rows = [_row(a.__dict__, "ANALYSES_SCHEMA") for a in self.analyses(trace_id, name, limit)]
        return _frame(rows, "ANALYSES_SCHEMA")

    def get_analysis(self, analysis_id: int) -> AnalysisRecord | None:
        """One analysis with its full document; None when unknown."""
        with self._read() as conn:
            r = conn.execute(sa.select(analyses).where(analyses.c.id == int(analysis_id))).first()
        return _analysis_record(r, with_document=True) if r is not None else None

    def latest_analysis(self, trace_id: str, name: str | None = None) -> AnalysisRecord | None:
        found = self.analyses(trace_id=trace_id, name=name, limit=1)
        return self.get_analysis(found[0].id) if found else None


def _row(src: Mapping[Any, Any], schema_name: str) -> list[Any]:
    return [src.get(k) for k in _schemas()[schema_name]]


def _trace_record(r: Any, with_manifest: bool = False) -> TraceRequestRecord:
    return TraceRequestRecord(
        trace_id=r.trace_id,
        created=r.created,
        status=r.status,
        requested_by=r.requested_by,
        config=r.config,
        hosts=list(r.hosts or []),
        job_ids=list(r.job_ids or []),
        file_count=r.file_count,
        complete_files=r.complete_files,
        total_bytes=r.total_bytes,
        store_url=r.store_url,
        recorded_at=r.recorded_at,
        updated_at=r.updated_at,
        manifest=dict(r.manifest or {}) if with_manifest else {},
    )


def _analysis_record(r: Any, with_document: bool = False) -> AnalysisRecord:
    return AnalysisRecord(
        id=r.id,
        created=r.created,
        name=r.name,
        version=r.version,
        trace_id=r.trace_id,
        inputs=list(r.inputs or []),
        summary=dict(r.summary or {}),
        step_time_ms=r.step_time_ms,
        straggler_kind=r.straggler_kind,
        straggler_rank=r.straggler_rank,
        world_size=r.world_size,
        document=dict(r.document or {}) if with_document else {},
    )


def record_request_dir(
    catalog_url: str | None,
    trace_dir: str | os.PathLike[str],
    store_objects: Iterable[StoredObject] | None = None,
) -> TraceRequestRecord:
    """One-call helper for ``kscope trace``: open the catalog, record the folder, close."""
    with Catalog.open(catalog_url) as cat:
        if store_objects is None:
            return cat.import_trace_dir(trace_dir)
        from kinetoscope.protocol.manifest import load_trace_dir

        d = Path(trace_dir).absolute()
        return cat.record_trace_request(load_trace_dir(d), list(store_objects), base_dir=d)


__all__ = [
    "Catalog",
    "CatalogError",
    "JobRecord",
    "TraceRequestRecord",
    "TraceFileRecord",
    "AnalysisRecord",
    "resolve_catalog_url",
    "record_request_dir",
    "join_url",
]


def _request_status(doc: Mapping[str, Any], rows: list[Any]) -> str:
    """The manifest's own ``status`` (abandoned, partial), else what the files say."""
    if doc.get("status"):
        return str(doc["status"])
    if not rows:
        return "requested"
    return "incomplete" if any(r.complete is False for r in rows) else "complete"


def _file_rows(
    doc: Mapping[str, Any], urls: Mapping[str, str], base_dir: str | os.PathLike[str] | None, now: Any
) -> list[dict[str, Any]]:
    """The ``trace_files`` rows of a validated manifest (``record_trace_request``)."""
    trace_id, config, top_job = doc["trace_id"], doc.get("config"), doc.get("job_id")
    out: list[dict[str, Any]] = []
    for e in doc["files"]:
        name = e["file"]
        url = e.get("url") or urls.get(name) or (f"{urls['*']}/{trace_id}/{name}" if "*" in urls else None)
        out.append(
            {
                "trace_id": trace_id,
                "file": name,
                "path": _recorded_path(e.get("path"), name, base_dir),
                "host": e.get("host"),
                "pid": _int_or_none(e.get("pid")),
                "rank": _int_or_none(e.get("rank")),
                "local_rank": _int_or_none(e.get("local_rank")),
                "world_size": _int_or_none(e.get("world_size")),
                "job_id": str(e["job_id"]) if e.get("job_id") is not None else top_job,
                "cmdline": e.get("cmdline"),
                "iterations": _int_or_none(e.get("iterations")) or _config_iterations(config),
                "duration_ms": _float_or_none(e.get("duration_ms")) or _config_duration_ms(config),
                "bytes": _int_or_none(e.get("bytes")),
                "sha256": e.get("sha256"),
                "storage_url": url,
                "complete": e.get("complete"),
                "recorded_at": now,
                "updated_at": now,
                "host_pid": _int_or_none(e.get("host_pid")),
                "container_pid": _int_or_none(e.get("container_pid")),
            }
        )
    return out
