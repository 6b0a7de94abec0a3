"""Alembic environment for the catalog; works on SQLite and PostgreSQL.

``Catalog.open`` passes an open connection (inside a transaction that holds the write lock:
``BEGIN IMMEDIATE`` on SQLite, an advisory lock on PostgreSQL) in ``config.attributes``.
Developers can also run ``alembic -x url=sqlite:///x.db upgrade head`` with a config whose
``script_location`` is ``kinetoscope.store:migrations``.
"""

from __future__ import annotations

from alembic import context
from sqlalchemy import create_engine
from sqlalchemy.engine import Connection

from kinetoscope.store.schema import Base

config = context.config
target_metadata = Base.metadata


def _run(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        compare_type=True,
        render_as_batch=connection.dialect.name == "sqlite",
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_offline() -> None:
    url = context.get_x_argument(as_dictionary=True).get("url") or config.get_main_option("sqlalchemy.url")
    if url is None:
        raise RuntimeError("offline migration: no database URL (pass -x url=... or set sqlalchemy.url)")
    context.configure(
        url=url, target_metadata=target_metadata, literal_binds=True, render_as_batch=url.startswith("sqlite")
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _run(connection)
        return
    from kinetoscope.store.catalog import make_engine, resolve_catalog_url

    url = context.get_x_argument(as_dictionary=True).get("url") or config.get_main_option("sqlalchemy.url")
    engine = make_engine(resolve_catalog_url(url)) if url else create_engine("sqlite://")
    try:
        with engine.begin() as conn:
            _run(conn)
    finally:
        engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
