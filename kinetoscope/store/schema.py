"""The whole catalog schema: every table module on the one declarative ``Base``, and ``HEAD``.

``models.py`` (jobs, trace requests, trace files, analyses), ``fleet_models.py`` (the
autopilot's tables) and ``stacks_models.py`` (stack captures) each declare tables on
``models.Base``; importing this module registers them all, so ``Base.metadata`` is the schema
that the migrations build (the alembic environment and ``tests/store/test_migrations.py`` read
it from here). The table modules import ``models``, never the reverse: no import circle.

``HEAD`` names the newest migration revision (``migrations/versions``), so that opening an
up-to-date catalog does not need to import alembic (``catalog.upgrade``);
``tests/store/test_migrations.py`` checks it against the scripts. Bump it with every new revision.
"""

from __future__ import annotations

from kinetoscope.store import fleet_models, stacks_models
from kinetoscope.store.models import Base

HEAD = "0005_job_identity"

__all__ = ["HEAD", "Base", "fleet_models", "stacks_models"]
