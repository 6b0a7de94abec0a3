"""Alembic migrations of the catalog (applied by ``Catalog.open``; see ``catalog.upgrade``).

``HEAD`` names the newest revision so that opening an up-to-date catalog does not need to
import alembic; ``tests/store/test_migrations.py`` checks it against the scripts. Bump it with
every new revision.
"""

HEAD = "0005_job_identity"
