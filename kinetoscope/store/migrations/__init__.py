"""Alembic migrations of the catalog (applied by ``Catalog.open``; see ``catalog.upgrade``).

``HEAD``, the newest revision, is defined in ``kinetoscope.store.schema`` (bump it there with
every new revision) and named here too.
"""

from kinetoscope.store.schema import HEAD

__all__ = ["HEAD"]
