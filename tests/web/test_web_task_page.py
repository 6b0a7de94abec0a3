"""The trigger task page (``/tasks/{id}``) as a new user sees it: sizes in KiB/MiB rather than raw
byte counts, and no empty "Errors"/"Notes" headings (issue 10). The page is served by the real
app; the live updates (static/app.js) are covered by the browser tests."""

from __future__ import annotations

import re
import warnings
from pathlib import Path
from typing import Any

import pytest


@pytest.fixture()
def client(tmp_path: Path) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # starlette's TestClient deprecation note about httpx
        from fastapi.testclient import TestClient

    from kinetoscope.web import WebSettings, create_app

    app = create_app(WebSettings(catalog_url=str(tmp_path / "c.db"), daemons=["127.0.0.1:9"]))
    with TestClient(app) as c:
        yield c


def _task(client: Any, *, errors: list[str], notes: list[str]) -> str:
    def work(task: Any) -> None:
        task.files = [
            {
                "rank": 0,
                "host": "node01",
                "pid": 4242,
                "file": "rank-0_4242.pt.trace.json",
                "bytes": 3 * 1024 * 1024 + 200_000,
                "delivered": True,
                "complete": True,
            }
        ]
        task.errors.extend(errors)
        task.notes.extend(notes)

    tasks = client.app.state.tasks
    task = tasks.submit("trigger", "Trace job 4242", work)
    assert tasks.wait(task.id, timeout=60) is not None
    page = client.get(f"/tasks/{task.id}")
    assert page.status_code == 200
    return page.text


def test_sizes_are_human_and_empty_lists_have_no_heading(client: Any) -> None:
    html = _task(client, errors=[], notes=[])
    assert "3.2 MiB" in html and ">3345728<" not in html
    assert re.search(r'<div id="task-errors-box" hidden>', html)
    assert re.search(r'<div id="task-notes-box" hidden>', html)


def test_errors_show_under_their_heading(client: Any) -> None:
    html = _task(client, errors=["node01:1778: connection refused"], notes=["one note"])
    assert re.search(
        r'<div id="task-errors-box" >\s*<h2>Errors</h2><ul id="task-errors"><li>node01:1778: '
        r"connection refused</li>",
        html,
    )
    assert '<div id="task-notes-box" >' in html
