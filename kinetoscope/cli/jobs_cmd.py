"""`kscope jobs`: every job the catalog knows, traced by hand or by the autopilot, once each
(``kinetoscope.autopilot.fleetview``, "One list"), with its state, its traces, its samples, its
latest diagnosis figures and its wasted GPU-hours (``--sort waste``, ``--where``).

Without autopilot data and without ``--sort``/``--where`` it is exactly the catalog listing of
``kinetoscope.cli.catalog_cmd`` (same table, same ``--json``). With them, the ``--json`` envelope
is the same (``kinetoscope_catalog``, ``catalog``, ``jobs``) and each job keeps the catalog's keys
and adds the autopilot's (docs/autopilot.md).
"""

from __future__ import annotations

from typing import Any

import typer

from kinetoscope.cli.catalog_cmd import (
    JOBS_EXAMPLES,
    JSON_VERSION,
    CatalogOpt,
    JsonOpt,
    LimitOpt,
    _emit_json,
    _open,
    _print,
    _table,
    _user_errors,
)
from kinetoscope.cli.examples import examples

EXAMPLES = (
    JOBS_EXAMPLES
    + "\n"
    + "\n".join(
        examples(
            ("kscope jobs --sort waste --where 'gpu_util < 30'", "autopilot jobs wasting the most GPU time"),
        ).splitlines()[1:]
    )
)


def register(app: typer.Typer) -> None:
    @app.command("jobs", epilog=EXAMPLES)
    @_user_errors
    def jobs_cmd(
        catalog: str | None = CatalogOpt,
        as_json: bool = JsonOpt,
        limit: int = LimitOpt,
        sort: str | None = typer.Option(
            None, "--sort", help="Autopilot jobs: 'waste' (most wasted GPU-hours first) or 'recent'."
        ),
        where: str | None = typer.Option(
            None,
            "--where",
            metavar="EXPR",
            help="Autopilot jobs: e.g. 'gpu_util < 30 and lost > 0.1' (fields: gpu_util, mfu, lost, "
            "launch_bound, exposed_comm, waste_h, samples).",
        ),
    ) -> None:
        """List every job the catalog has seen (by hand or by the autopilot), most recent first."""
        from kinetoscope.autopilot.fleetview import fleet_rows
        from kinetoscope.store.fleet import FleetStore

        with _open(catalog) as cat:
            store = FleetStore(cat)
            if sort is None and where is None and not store.jobs():
                _catalog_jobs(cat, as_json, limit)
                return
            rows = fleet_rows(store, sort=sort or "recent", where=where, everything=True)
            if limit:
                rows = rows[:limit]
            if as_json:
                _emit_json({"kinetoscope_catalog": JSON_VERSION, "catalog": cat.display_url, "jobs": rows})
                return
            _print_fleet(rows, cat.display_url)


def _catalog_jobs(cat: Any, as_json: bool, limit: int) -> None:
    """The catalog's own listing (kinetoscope.cli.catalog_cmd's `kscope jobs`)."""
    from kinetoscope.cli.catalog_cmd import _hosts, _when

    found = cat.jobs(limit=limit or None)
    if as_json:
        _emit_json(
            {
                "kinetoscope_catalog": JSON_VERSION,
                "catalog": cat.display_url,
                "jobs": [j.to_dict() for j in found],
            }
        )
        return
    if not found:
        _print(f"No jobs in catalog {cat.display_url}.")
        return
    t = _table(
        f"Jobs in {cat.display_url}",
        ["JOB ID", "HOSTS", "WORLD", "TRACES", "FIRST SEEN (UTC)", "LAST SEEN (UTC)", "COMMAND"],
        prose=("COMMAND",),
    )
    for j in found:
        t.add_row(
            j.job_id,
            _hosts(j.hosts),
            str(j.world_size or "-"),
            str(j.traces),
            _when(j.first_seen),
            _when(j.last_seen),
            j.cmdline or "-",
        )
    _print(t)


def _fmt(v: Any, digits: int = 1) -> str:
    return "-" if v is None else (f"{v:.{digits}f}" if isinstance(v, float) else str(v))


def _samples(r: dict[str, Any]) -> str:
    """``2/3`` usable of all samples, ``-`` for a job the autopilot never sampled."""
    if r["source"] == "manual" or not r["samples_total"]:
        return "-"
    return f"{r['samples_recorded']}/{r['samples_total']}"


def _print_fleet(rows: list[dict[str, Any]], url: str) -> None:
    if not rows:
        _print(f"No jobs match in catalog {url}.")
        return
    t = _table(
        f"Jobs in {url} (samples: usable/all; figures from the latest usable sample)",
        [
            "JOB",
            "STATE",
            "HOSTS",
            "TRACES",
            "SAMPLES",
            "WASTED GPU-H",
            "GPU BUSY %",
            "MFU",
            "STRAGGLER",
            "TOP RECOMMENDATION",
        ],
        prose=("TOP RECOMMENDATION",),
    )
    from rich.text import Text  # plain text: a job key like "torch:a:1:r" must not become an emoji

    for r in rows:
        strag = r["straggler_kind"] or "-"
        if r["straggler_ranks"]:
            strag += " " + ",".join(map(str, r["straggler_ranks"]))
        state = r["state"]
        if r["timestamp_anomaly_samples"]:
            state += f" ({r['timestamp_anomaly_samples']} corrupted)"
        cells = [
            r["job_key"],
            state,
            ",".join(r["hosts"]),
            str(r["traces"]),
            _samples(r),
            _fmt(r["wasted_gpu_hours"], 3) if r["source"] != "manual" else "-",
            _fmt(r["gpu_busy_pct"]),
            _fmt(r["mfu"], 4),
            strag,
            r["top_recommendation_title"] or r["top_recommendation"] or "-",
        ]
        t.add_row(*(Text(c) for c in cells))
    _print(t)
