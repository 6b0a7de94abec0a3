"""Alembic migrations: an empty database upgraded to head matches the ORM models exactly."""

from __future__ import annotations

import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext

from kinetoscope.store.catalog import Catalog, current_revisions, head_revisions
from kinetoscope.store.schema import Base


def test_migrate_empty_db_to_head_matches_models(catalog_url: str) -> None:
    with Catalog.open(catalog_url) as cat:
        with cat.engine.connect() as conn:
            assert current_revisions(conn) == head_revisions()
            mc = MigrationContext.configure(conn, opts={"compare_type": True, "compare_server_default": True})
            diff = compare_metadata(mc, Base.metadata)
            assert diff == [], diff
            tables = set(sa.inspect(conn).get_table_names())
        assert {"jobs", "trace_requests", "trace_files", "analyses", "alembic_version"} <= tables
    # opening again is a no-op (already at head)
    with Catalog.open(catalog_url) as cat:
        with cat.engine.connect() as conn:
            assert current_revisions(conn) == head_revisions()


def test_downgrade_and_upgrade_again(catalog_url: str) -> None:
    from alembic import command

    from kinetoscope.store.catalog import _alembic_config, upgrade

    with Catalog.open(catalog_url) as cat:
        with cat.engine.begin() as conn:
            command.downgrade(_alembic_config(conn), "base")
        with cat.engine.connect() as conn:
            assert set(sa.inspect(conn).get_table_names()) <= {"alembic_version"}
        upgrade(cat.engine)
        assert cat.list_jobs().height == 0


def test_head_constant_matches_scripts() -> None:
    from kinetoscope.store.migrations import HEAD

    assert head_revisions() == {HEAD}


def test_newer_schema_is_refused(tmp_path) -> None:
    import pytest

    from kinetoscope.store.catalog import CatalogError

    url = str(tmp_path / "c.db")
    with Catalog.open(url) as cat:
        with cat.engine.begin() as conn:
            conn.execute(sa.text("UPDATE alembic_version SET version_num = '9999_future'"))
    with pytest.raises(CatalogError, match="9999_future.*newer"):
        Catalog.open(url)
