"""The read form of the ``kscope stacks --json`` document (docs/stacks.md, "JSON contract"), as
the catalog keeps it (``job_stacks.document``) and the autopilot's hang alerts read it.

The document is written by ``collect.stack_groups.StacksReport``; this is the part of it a view
reads, tolerant as every read form here: unknown keys are ignored, every field has a default, so
a capture stored by an older version still decodes.
"""

from __future__ import annotations

import msgspec

from kinetoscope.document.parts import Part
from kinetoscope.protocol.structinfo import prime_structs


class StackGroupPart(Part):
    """One ``groups`` entry: ranks sharing one stack shape. ``summary``: the line the CLI
    prints; ``outlier``: the group is not where the most ranks are (docs/stacks.md)."""

    id: int | None = None
    size: int | None = None
    ranks: list[int | None] = msgspec.field(default_factory=list)
    summary: str | None = None
    outlier: bool = False


class StacksDocument(Part):
    """The stacks document's groups, outlier ranks and verdict."""

    groups: list[StackGroupPart] = msgspec.field(default_factory=list)
    outliers: list[int | None] = msgspec.field(default_factory=list)
    verdict: str | None = None
    problems: list[str] = msgspec.field(default_factory=list)  # parts that did not decode, and why


prime_structs(globals())
