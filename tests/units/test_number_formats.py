"""kinetoscope.units: the one formatting module reads numbers exactly as the private formatters
it replaced did (report/sections, collect/render, web/app, cli/diff_cmd): every expected string
below was printed by those functions on main (cc995dc)."""

from __future__ import annotations

import datetime

from kinetoscope import units

NAN, INF = float("nan"), float("inf")
VALUES = [None, True, 0, 1234567, 0.0, 0.004, 12.0, 1234.5678, NAN, INF, "x"]


def test_fmt_num_as_the_report() -> None:
    assert [units.fmt_num(v) for v in VALUES] == [
        "–", "yes", "0", "1,234,567", "0", "0.004", "12", "1,234.57", "–", "–", "x",
    ]  # fmt: skip
    assert units.fmt_num(1234.5678, 3) == "1,234.568"


def test_percent_and_milliseconds_as_the_report() -> None:
    assert [units.fmt_pct(v) for v in [None, 0.25, 0.123456, "x", NAN]] == [
        "n/a",
        "25.0 %",
        "12.3 %",
        "n/a",
        "n/a",
    ]
    assert [units.fmt_ms(v) for v in [None, 1234567.0, 12, True]] == ["n/a", "1,234.57 ms", "0.01 ms", "n/a"]


def test_bytes_for_the_report_and_for_terminal_tables() -> None:
    sizes = [None, 0, 512, 1023, 1024, 1048575, 5 * 2**30, 3 * 2**50, -2048]
    assert [units.fmt_bytes(v) for v in sizes] == [
        "–", "0 B", "512 B", "1,023 B", "1.0 KiB", "1,024.0 KiB", "5.0 GiB", "3,072.0 TiB", "-2.0 KiB",
    ]  # fmt: skip
    plain = [
        units.fmt_bytes(v, missing="-", thousands=False)
        for v in [None, 0, 512, 1048575, 5 * 2**30, 3 * 2**50]
    ]
    assert plain == ["-", "0 B", "512 B", "1024.0 KiB", "5.0 GiB", "3072.0 TiB"]


def test_web_filters() -> None:
    assert [units.fmt_fixed(v) for v in [None, 1234.5, 3, "a"]] == ["–", "1,234.50", "3", "a"]
    when = datetime.datetime(2026, 1, 31, 12, 0, 5)
    assert [units.fmt_datetime(v) for v in [None, when, "x"]] == ["–", "2026-01-31 12:00:05", "x"]


def test_diff_table_cells() -> None:
    assert [units.fmt_compact(v) for v in [None, NAN, 1234.0, 1234.56, 7, "y"]] == [
        "-",
        "-",
        "1,234",
        "1,234.6",
        "7",
        "y",
    ]
    assert [units.fmt_signed(v) for v in [3, -2.5, 1000.0, 0]] == ["+3", "-2.5", "+1,000", "+0"]
