"""The decoder's step for parts written under older or other producers' spellings: it maps them
onto the field names of the typed part before the part is converted, so a view reads one name.

Only the ``evidence`` block has such spellings (the autopilot judges documents of other
producers and of older versions, docs/autopilot.md "Sample evidence"):

* ``usable`` — also ``cross_rank_usable`` (a bool), or a text verdict under ``judgement``,
  ``judgment``, ``verdict`` or ``status`` (``usable`` / ``not usable`` / ``unusable`` / ``not
  assessed``, any case, ``_``/``-`` for spaces); absent when none says;
* ``reason`` — also ``why``, ``not_usable_reason``, ``summary``: the first non-empty text (a
  list of texts is joined with ``; ``);
* ``timestamp_anomalies`` — a count, ``{kind: count}``, a list of ``{"count": n}`` items, or
  ``{"count"/"total": n}``, read as one count; absent when not counted;
* ``windows_aligned`` — also ``aligned``;
* ``steps_in_common`` — a number, else absent.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

USABLE_KEYS = ("usable", "cross_rank_usable")
VERDICT_KEYS = ("judgement", "judgment", "verdict", "status")
REASON_KEYS = ("reason", "why", "not_usable_reason", "summary")


def _int(v: Any) -> int | None:
    return int(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def anomaly_count(block: Mapping[str, Any]) -> int | None:
    """``timestamp_anomalies`` of an evidence block as one count (module docstring); None when
    absent or of no shape read here."""
    v = block.get("timestamp_anomalies")
    if _int(v) is not None:
        return _int(v)
    if isinstance(v, Mapping):
        for key in ("total", "count"):
            if _int(v.get(key)) is not None:
                return _int(v.get(key))
        return sum(_int(x) or 0 for x in v.values())
    if isinstance(v, list):
        return sum((_int(x.get("count")) or 0) if isinstance(x, Mapping) else 1 for x in v)
    return None


def usable(block: Mapping[str, Any]) -> bool | None:
    """The block's usable / not-usable judgement, whatever its spelling; None if absent."""
    for key in USABLE_KEYS:
        if isinstance(block.get(key), bool):
            return bool(block[key])
    for key in VERDICT_KEYS:
        text = block.get(key)
        if isinstance(text, str):
            low = text.strip().lower().replace("_", " ").replace("-", " ")
            if low.startswith(("not usable", "unusable", "not assessed")):
                return False
            if low.startswith("usable"):
                return True
    return None


def reason(block: Mapping[str, Any]) -> str | None:
    """The first non-empty reason text of the block, whatever its spelling."""
    for key in REASON_KEYS:
        v = block.get(key)
        if isinstance(v, str) and v.strip():
            return v.strip()
        if isinstance(v, list) and v and isinstance(v[0], str):
            return "; ".join(str(x) for x in v)
    return None


def _put(out: dict[str, Any], key: str, value: Any) -> None:
    """``out[key] = value``, or no ``key`` at all when ``value`` is None (the field's default)."""
    if value is None:
        out.pop(key, None)
    else:
        out[key] = value


def evidence_form(block: Mapping[str, Any]) -> dict[str, Any]:
    """The evidence block with its spellings mapped onto ``parts.Evidence`` (module docstring).
    A block the diagnosis wrote is unchanged but for a ``reason`` with blanks around it."""
    out = dict(block)
    _put(out, "usable", usable(block))
    _put(out, "reason", reason(block))
    _put(out, "timestamp_anomalies", anomaly_count(block))
    _put(out, "steps_in_common", _int(block.get("steps_in_common")))
    if not isinstance(block.get("windows_aligned"), bool) and isinstance(block.get("aligned"), bool):
        out["windows_aligned"] = block["aligned"]
    return out


# The decoder's step per object part key: the part's dict before it is converted.
PREPARE = {"evidence": evidence_form}
