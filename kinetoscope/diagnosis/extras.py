"""The diagnosis with the keys added after the first contract (``pipeline``,
``uneven_inputs``, ``recompilation``): a ``Diagnosis`` whose JSON form and Mapping view carry
them too, each ``null`` when the job does not show the problem."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from kinetoscope.analysis.runner import DIAGNOSIS_KEYS
from kinetoscope.analysis.runner import EXTRA_DIAGNOSIS_KEYS as EXTRA_KEYS
from kinetoscope.diagnosis.report import Diagnosis


@dataclass
class ExtendedDiagnosis(Diagnosis):
    """``Diagnosis`` plus ``extra``: the JSON-ready values of ``EXTRA_KEYS``."""

    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        d = super().to_dict()
        for key in EXTRA_KEYS:
            d[key] = self.extra.get(key)
        return d

    def __iter__(self) -> Iterator[str]:
        return iter(("summary", *DIAGNOSIS_KEYS, *EXTRA_KEYS))

    def __len__(self) -> int:
        return 1 + len(DIAGNOSIS_KEYS) + len(EXTRA_KEYS)
