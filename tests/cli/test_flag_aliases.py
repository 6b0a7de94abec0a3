"""Renamed flags keep their old spelling, with one warning line (docs/cli.md, "Every flag, one meaning")."""

from __future__ import annotations

import re

from kinetoscope.cli.deprecated import RENAMED, rewrite
from tests.cli._helpers import REPO, kscope

CPU_JOB = REPO / "tests" / "data" / "cpu_jobs" / "small_steady_w4"


def test_rewrite_replaces_old_spellings_up_to_double_dash(capsys: object) -> None:
    renames = RENAMED["serve"]
    assert rewrite("serve", ["--host", "0.0.0.0", "--host=::1", "--", "--host"], renames) == [
        "--bind",
        "0.0.0.0",
        "--bind=::1",
        "--",
        "--host",
    ]
    err = capsys.readouterr().err  # type: ignore[attr-defined]
    assert err.splitlines() == [
        "warning: kscope serve --host is deprecated: use --bind (" + renames["--host"][1] + ")"
    ]


def test_analyze_all_still_prints_every_table_with_one_warning() -> None:
    old = kscope("analyze", str(CPU_JOB), "--no-record", "--all")
    new = kscope("analyze", str(CPU_JOB), "--no-record", "--full")
    assert old.returncode == new.returncode == 0, old.stderr
    assert old.stdout == new.stdout
    warnings = [ln for ln in old.stderr.splitlines() if ln.startswith("warning:")]
    assert warnings == [
        "warning: kscope analyze --all is deprecated: use --full (" + RENAMED["analyze"]["--all"][1] + ")"
    ]
    assert "deprecated" not in new.stderr


def test_serve_host_and_demo_ranks_reach_the_new_options() -> None:
    """The old spelling is parsed as the new option: its value is checked under the new name."""
    serve = kscope("serve", "--host", "127.0.0.1", "--port", "70000")
    assert serve.returncode == 2, serve.stderr
    assert "kscope serve --host is deprecated: use --bind" in serve.stderr
    assert serve.stderr.splitlines()[-1] == "error: --port must be between 0 and 65535"
    demo = kscope("demo", "--ranks", "many")
    assert demo.returncode == 2, demo.stderr
    assert "kscope demo --ranks is deprecated: use --world-size" in demo.stderr
    assert "--world-size" in demo.stderr.splitlines()[-1]


def test_help_lists_the_new_names_only() -> None:
    for command, renames in RENAMED.items():
        text = kscope(command, "--help").stdout
        for old, (new, _) in renames.items():
            assert new in text, (command, new)
            assert not re.search(rf"│\s+{old}\s", text), (command, old)  # not an option row
