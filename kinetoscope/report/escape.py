"""Escaping for untrusted strings from traces (kernel and op names, host names, command lines).

Three contexts, three functions:

* HTML text and attributes: Jinja2 autoescape (``markupsafe``) in every template; nothing here.
* JSON embedded in ``<script type="application/json">``: :func:`json_for_script` — the JSON text
  has ``<``, ``>``, ``&``, U+2028 and U+2029 written as ``\\uXXXX`` escapes, so no string can
  contain ``</script>`` or ``<!--`` and close or confuse the script element; ``JSON.parse``
  gives the original strings back.
* Plotly labels: :func:`plotly_text` — Plotly renders a small HTML subset in tick labels,
  hover text and titles (``<b>``, ``<br>``, ``<a href>``...), so a name like ``<b>x</b>`` would
  be styled, and links could be injected. Writing ``&``, ``<`` and ``>`` as entities makes
  Plotly draw the characters literally.
"""

from __future__ import annotations

import re
from typing import Any

import orjson

_SCRIPT_UNSAFE = {
    ord("<"): "\\u003c",
    ord(">"): "\\u003e",
    ord("&"): "\\u0026",
    0x2028: "\\u2028",
    0x2029: "\\u2029",
}
_JS_CLOSE = re.compile(r"</(script)", re.IGNORECASE)


def json_for_script(obj: Any) -> str:
    """``obj`` as JSON text that is safe inside a ``<script>`` element (see module doc).

    NaN and infinities become ``null`` (orjson); numpy values are serialised; non-string keys
    are turned into strings."""
    text = orjson.dumps(obj, option=orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS, default=str).decode(
        "utf-8"
    )
    return text.translate(_SCRIPT_UNSAFE)


def js_for_script(code: str) -> str:
    """Trusted JavaScript (e.g. plotly.min.js) made safe to inline in a ``<script>`` element:
    ``</script`` and ``<!--`` sequences, should a bundle ever contain them, are broken up
    (``<\\/script`` means the same inside JS strings and regular expressions)."""
    return _JS_CLOSE.sub(r"<\\/\1", code).replace("<!--", "<\\!--")


def plotly_text(value: Any, limit: int | None = None) -> str:
    """A label for Plotly that is drawn literally (entities for ``& < >``), cut to ``limit``."""
    s = "" if value is None else str(value)
    if limit is not None and len(s) > limit:
        s = s[: limit - 1] + "…"
    return s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
