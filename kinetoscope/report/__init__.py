"""The self-contained HTML report (``kscope report``).

    from kinetoscope.orchestration import analyze_inputs
    from kinetoscope.report import render_report, write_report

    run = analyze_inputs(["run/traces/kst-.../"])          # files, folders, URLs or catalog trace ids
    html = render_report(run.document, inputs=run.inputs)   # one offline HTML page
    write_report(run.document, "report.html")

See docs/report.md for the sections and the escaping guarantees.
"""

from __future__ import annotations

from kinetoscope.lazy import lazy_exports

_EXPORTS = {
    "render_report": "render",
    "write_report": "render",
    "check_output_path": "render",
    "ReportWriteError": "render",
    "plotly_js": "render",
    "json_for_script": "escape",
    "plotly_text": "escape",
}

__all__, __getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
