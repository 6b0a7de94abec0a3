"""The HTML report: escaping in every context, sections (diagnosis first), offline, defensive
rendering of missing/odd documents, CPU-only traces, the input resolution and the summary."""

from __future__ import annotations

import json
import re

import pytest

from kinetoscope.analysis.names import display_name as short_name
from kinetoscope.orchestration import document_summary
from kinetoscope.report import json_for_script, plotly_text, render_report
from kinetoscope.report.escape import js_for_script
from tests.report.kscope_testkit import HOSTILE, HOSTILE_SCRIPT

SECTION_IDS = [
    "verdict",
    "recommendations",
    "overview",
    "stragglers",
    "mfu",
    "temporal",
    "idle",
    "kernels",
    "overlap",
    "launch",
    "job",
    "other",
    "traces",
]


def script_bodies(html: str) -> list[tuple[str, str]]:
    """(opening tag, body) of every <script> element, split the way an HTML parser does: a body
    ends at the first '</script'."""
    out = []
    for m in re.finditer(r"(<script\b[^>]*>)(.*?)</script", html, flags=re.S | re.I):
        out.append((m.group(1), m.group(2)))
    return out


def embedded(html: str, element_id: str):
    for tag, body in script_bodies(html):
        if f'id="{element_id}"' in tag:
            return json.loads(body)
    raise AssertionError(f"no <script id={element_id}>")


# ---------------------------------------------------------------------------------------
# Escaping primitives
# ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "value",
    [
        HOSTILE,
        HOSTILE_SCRIPT,
        "</script><script>alert(1)</script>",
        "<!-- x",
        "a & b",
        "\u2028\u2029",
        {"k</script>": ["</SCRIPT >", 1.5, None]},
        float("nan"),
    ],
)
def test_json_for_script_cannot_close_a_script_and_round_trips(value):
    text = json_for_script(value)
    assert "<" not in text and ">" not in text and "&" not in text
    assert "\u2028" not in text and "\u2029" not in text
    back = json.loads(text)
    if isinstance(value, float):
        assert back is None  # NaN -> null
    else:
        assert back == value


def test_js_for_script_breaks_up_closing_tags():
    code = 'var a = "</script>"; var b = "</SCRIPT"; var c = "<!--";'
    out = js_for_script(code)
    assert "</script" not in out.lower() and "<!--" not in out
    assert js_for_script("plain();") == "plain();"


def test_plotly_text_is_drawn_literally():
    assert plotly_text("<b>x</b> & y") == "&lt;b&gt;x&lt;/b&gt; &amp; y"
    assert plotly_text("x" * 10, limit=5) == "xxxx…"
    assert plotly_text(None) == ""


@pytest.mark.parametrize(
    ("name", "short"),
    [
        ("void at::native::foo<float, 4>(int)", "at::native::foo"),
        (
            "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long)",
            "ncclDevKernel_AllReduce_Sum_f32_RING_LL",
        ),
        ("aten::mm", "aten::mm"),
        (
            "void at::native::(anonymous namespace)::CatArrayBatchedCopy<float, 4>(int)",
            "at::native::CatArrayBatchedCopy",
        ),
        ("Memcpy HtoD (Pageable -> Device)", "Memcpy HtoD (Pageable -> Device)"),
        (HOSTILE, HOSTILE),  # not a C++ signature: shown whole (escaped), never mangled
        (HOSTILE_SCRIPT, HOSTILE_SCRIPT),
    ],
)
def test_short_name(name, short):
    assert short_name(name) == short


# ---------------------------------------------------------------------------------------
# The report of a job with hostile names
# ---------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def hostile_html(hostile_doc) -> str:
    return render_report(hostile_doc, title="<i>t</i>", inputs=[f"/tmp/{HOSTILE}"])


def test_hostile_names_are_escaped_everywhere(hostile_doc, hostile_html):
    html = hostile_html
    # the analysis really carries the hostile names (else this test proves nothing)
    names = {r["name"] for r in hostile_doc["kernel_breakdown"]}
    assert HOSTILE in names and HOSTILE_SCRIPT in names
    # HTML text/attributes: escaped, never raw
    assert HOSTILE not in html
    assert "&lt;img src=x onerror=alert(1)&gt;" in html
    assert "<i>t</i>" not in html and "&lt;i&gt;t&lt;/i&gt;" in html
    assert 'q"uo' not in html  # quotes escaped in text and attributes
    # every <script> element ends where we meant it to: our scripts only
    scripts = script_bodies(html)
    assert len(scripts) == html.lower().count("<script") == html.lower().count("</script")
    assert [t for t, _ in scripts if 'type="application/json"' not in t] == [
        t for t, _ in scripts if "nonce=" in t
    ]
    for tag, body in scripts:
        if 'type="application/json"' in tag:
            assert "<" not in body
    # the embedded document gives the original strings back
    doc = embedded(html, "kscope-document")
    assert {r["name"] for r in doc["kernel_breakdown"]} == names
    charts = embedded(html, "kscope-charts")
    top = charts["chart-top-kernels"]["figure"]["data"][0]
    assert any("&lt;img src=x onerror=alert(1)&gt;" in y for y in top["y"])  # plotly-escaped labels
    assert not any(HOSTILE in y for y in top["y"])


def test_sections_in_order_with_the_diagnosis_first(hostile_html):
    pos = [hostile_html.find(f'<section id="{s}"') for s in SECTION_IDS]
    assert all(p > 0 for p in pos), dict(zip(SECTION_IDS, pos))
    assert pos == sorted(pos)
    assert "INTERMITTENT STRAGGLERS" in hostile_html
    charts = embedded(hostile_html, "kscope-charts")
    for cid in (
        "chart-steps",
        "chart-ranks",
        "chart-rank-steps",
        "chart-straggler-heatmap",
        "chart-temporal",
        "chart-idle",
        "chart-kernel-types",
        "chart-top-kernels",
        "chart-overlap",
    ):
        assert cid in charts and f'id="{cid}"' in hostile_html
    heat = charts["chart-straggler-heatmap"]["figure"]["data"][0]
    assert heat["y"] == ["rank 0", "rank 1"]
    late = dict(zip(heat["x"], heat["z"][1]))
    assert (
        late["102"] > 20 and late["105"] > 20 and late["106"] > 20 and late["101"] < 1
    )  # rank 1 straggles there


def test_step_breakdown_adds_up_to_the_step_time(hostile_doc):
    from kinetoscope.report.sections import BREAKDOWN_PARTS, step_parts

    for row in hostile_doc["steps"]:
        p = step_parts(row)
        total = sum(p[k] for k, _, _ in BREAKDOWN_PARTS)
        assert total == pytest.approx(row["step_time(us)"] / 1000.0, rel=1e-6, abs=1e-6)


def test_report_is_offline(hostile_html):
    assert hostile_html.count("plotly.js v") == 1  # the bundle, embedded once
    markup = re.sub(r"<script\b[^>]*>.*?</script", "", hostile_html, flags=re.S | re.I)  # (the browser test
    assert not re.search(r"""(?:src|href)\s*=\s*["']?(?:https?:)?//""", markup)  # checks the scripts)
    assert "@import" not in hostile_html and "fonts.googleapis" not in hostile_html
    csp = re.search(r'http-equiv="Content-Security-Policy" content="([^"]+)"', hostile_html).group(1)
    assert "connect-src 'none'" in csp and "default-src 'none'" in csp


def test_plotly_src_mode_links_the_bundle(hostile_doc):
    html = render_report(hostile_doc, plotly_src="/static/plotly.min.js", nonce="abc")
    assert "plotly.js v" not in html
    assert '<script nonce="abc" src="/static/plotly.min.js"></script>' in html
    assert "script-src 'self' 'nonce-abc'" in html


# ---------------------------------------------------------------------------------------
# Defensive rendering
# ---------------------------------------------------------------------------------------
def test_cpu_only_trace_sections_say_why_they_are_empty(cpu_doc):
    html = render_report(cpu_doc)
    for sec in ("temporal", "idle", "kernels", "overlap"):
        part = html[html.find(f'<section id="{sec}"') :]
        part = part[: part.find("</section>")]
        assert "no GPU events in these traces (CPU-only)" in part, sec
    assert "CPU-only trace: MFU" in html  # the diagnosis' reason is shown
    assert 'id="chart-steps"' in html  # the step breakdown works from host ops


@pytest.mark.parametrize(
    "doc",
    [
        {},
        {"traces": [], "notes": {}, "errors": {"diagnosis": "RuntimeError: <boom>"}},
        {
            "steps": "not a list",
            "stragglers": ["odd"],
            "mfu": 3,
            "recommendations": {"x": 1},
            "job": None,
            "kernel_breakdown": [{"name": None, "sum (us)": "x"}],
            "something_new": [{"a": HOSTILE}],
        },
        {"steps": [], "step_durations": [{"rank": 0, "step": 1, "duration(us)": 1000.0}]},
    ],
)
def test_missing_or_odd_keys_render_with_a_reason(doc):
    html = render_report(doc)
    assert "Nothing to show:" in html
    assert HOSTILE not in html
    if "errors" in doc:
        assert "The job diagnosis failed: RuntimeError: &lt;boom&gt;" in html
    if not doc:
        assert "the document has no &#39;recommendations&#39;" in html


def test_render_refuses_a_non_object():
    with pytest.raises(TypeError):
        render_report(["not", "a", "document"])  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------
# Summary and inputs
# ---------------------------------------------------------------------------------------
def test_document_summary(hostile_doc, cpu_doc):
    s = document_summary(hostile_doc)
    assert s["straggler_kind"] == "intermittent" and s["straggler_ranks"] == [1]
    assert s["world_size"] == 2 and 39.0 < s["step_time_ms"] < 66.0
    assert s["verdict"].startswith("INTERMITTENT")
    c = document_summary(cpu_doc)
    assert c["world_size"] == 300 and c["straggler_kind"] == "none" and "mfu" not in c
    assert document_summary({}) == {}


def test_resolve_inputs(hostile_job, tmp_path):
    from kinetoscope.orchestration import InputError, resolve_inputs
    from kinetoscope.store import Catalog

    files = sorted(hostile_job.glob("rank-*.json"))
    r = resolve_inputs([str(hostile_job), str(files[0])])
    assert r.paths == files and r.trace_id is None  # folder + a file in it: each file once, no manifest
    with pytest.raises(InputError, match="no such file"):
        resolve_inputs([str(tmp_path / "missing.json")])
    with pytest.raises(InputError, match="no trace files"):
        resolve_inputs([str(tmp_path)])
    cat_url = str(tmp_path / "c.db")
    with Catalog.open(cat_url) as cat:
        cat.import_trace_dir(hostile_job)
        r = resolve_inputs(["kst-20261121-000000-test"], catalog=cat)
        assert r.trace_id == "kst-20261121-000000-test" and sorted(r.paths) == files
        with pytest.raises(InputError, match="no trace with this id"):
            resolve_inputs(["kst-nope"], catalog=cat)


def test_columns_keep_identity_first_after_a_catalog_round_trip(hostile_doc):
    """The catalog stores documents as JSON with sorted keys: tables still lead with rank/name."""
    import orjson

    sorted_doc = orjson.loads(orjson.dumps(hostile_doc, option=orjson.OPT_SORT_KEYS))
    html = render_report(sorted_doc)
    head = re.search(r'<table class="data" id="table-kernels">\s*<thead><tr>(.*?)</tr>', html, re.S).group(1)
    cols = re.findall(r"<th[^>]*>(.*?)</th>", head)
    assert cols[:4] == ["rank", "kernel_type", "name", "count"], cols
