"""A rule's measurements are typed ``RuleInput`` fields: ``recommend`` takes them by name and
refuses a name that is not a field (no ``extra`` dict to read from)."""

from __future__ import annotations

import dataclasses

import pytest

from kinetoscope.diagnosis.recommendations import RuleInput, recommend


def test_measurements_are_fields_and_an_unknown_one_is_refused() -> None:
    names = {f.name for f in dataclasses.fields(RuleInput)}
    assert {"pipeline", "uneven_inputs", "recompilation", "collective_bandwidth"} <= names
    assert "extra" not in names
    with pytest.raises(TypeError, match="bogus"):
        recommend(None, None, None, None, {}, {}, None, bogus={})  # type: ignore[arg-type]
