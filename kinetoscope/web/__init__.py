"""``kscope serve``: the web app (FastAPI + Jinja2). See docs/web.md.

from kinetoscope.web import WebSettings, create_app
"""

from __future__ import annotations

from kinetoscope.lazy import lazy_exports

__all__, __getattr__, __dir__ = lazy_exports(__name__, {"WebSettings": "app", "create_app": "app"})
