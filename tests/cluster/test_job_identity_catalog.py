"""Job identity in the catalog: an old catalog migrates (job "0" marked unattributed, Slurm jobs
marked slurm), and new manifests record each job's identity, source and both pids."""

from __future__ import annotations

from pathlib import Path

import sqlalchemy as sa

from kinetoscope.store.catalog import Catalog, _alembic_config


def _old_catalog(url: str) -> None:
    """A catalog at revision 0002 (before job identity) holding job "0" and Slurm job 4242."""
    from alembic import command

    with Catalog.open(url) as cat:
        with cat.engine.begin() as conn:
            command.downgrade(_alembic_config(conn), "0002_fleet")
            for job in ("0", "4242"):
                conn.execute(
                    sa.text(
                        "INSERT INTO jobs (job_id, hosts, world_size, first_seen, last_seen, cmdline) "
                        "VALUES (:j, '[]', 2, '2026-11-20 10:00:00', '2026-11-20 10:00:00', 'train.py')"
                    ),
                    {"j": job},
                )


def test_old_catalog_migrates(tmp_path: Path) -> None:
    url = str(tmp_path / "old.db")
    _old_catalog(url)
    with Catalog.open(url) as cat:  # opening upgrades to head
        sources = {j.job_id: j.job_source for j in cat.jobs()}
    assert sources == {"0": "unattributed", "4242": "slurm"}


def _manifest(trace_id: str, job: str, source: str, pids: tuple[int, int]) -> dict:
    return {
        "kinetoscope_manifest": 1,
        "trace_id": trace_id,
        "created": "2026-11-28T10:00:00Z",
        "files": [
            {
                "file": f"rank-{r}_{pids[0] + r}.pt.trace.json",
                "host": "node1",
                "pid": pids[0] + r,
                "rank": r,
                "world_size": 2,
                "job_id": job,
                "job_source": source,
                "kineto_job_id": "0",
                "host_pid": pids[1] + r,
                "container_pid": pids[0] + r,
                "complete": True,
                "bytes": 10,
            }  # fmt: skip
            for r in (0, 1)
        ],
    }


def test_jobs_of_other_launchers_stay_apart(tmp_path: Path) -> None:
    with Catalog.open(str(tmp_path / "c.db")) as cat:
        cat.record_trace_request(_manifest("kst-a", "torchrun:aaa", "torchrun", (7, 4100)))
        cat.record_trace_request(_manifest("kst-b", "launcher:0123456789abcdef", "launcher", (7, 5100)))
        jobs = {j.job_id: j for j in cat.jobs()}
        assert set(jobs) == {"torchrun:aaa", "launcher:0123456789abcdef"}
        assert jobs["torchrun:aaa"].job_source == "torchrun" and jobs["torchrun:aaa"].traces == 1
        with cat.engine.connect() as conn:
            rows = conn.execute(
                sa.text(
                    "SELECT pid, host_pid, container_pid FROM trace_files WHERE trace_id = 'kst-b' ORDER BY pid"
                )
            ).all()
        assert [tuple(r) for r in rows] == [(7, 5100, 7), (8, 5101, 8)]


def test_web_pages_show_jobs_by_identity(tmp_path: Path) -> None:
    """The web app lists both jobs and serves each one's page at its identity."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from fastapi.testclient import TestClient

    from kinetoscope.web import WebSettings, create_app

    url = str(tmp_path / "c.db")
    with Catalog.open(url) as cat:
        cat.record_trace_request(_manifest("kst-a", "torchrun:aaa", "torchrun", (7, 4100)))
        cat.record_trace_request(_manifest("kst-b", "k8s:ml:bert", "kubernetes", (7, 5100)))
    app = create_app(WebSettings(catalog_url=url, daemons=["127.0.0.1:9"]))
    with TestClient(app) as client:
        listing = client.get("/jobs")
        assert listing.status_code == 200
        assert "torchrun:aaa" in listing.text and "k8s:ml:bert" in listing.text
        for job, trace in (("torchrun:aaa", "kst-a"), ("k8s:ml:bert", "kst-b")):
            page = client.get(f"/jobs/{job}")
            assert page.status_code == 200 and trace in page.text
            api = client.get(f"/api/jobs/{job}")
            assert api.status_code == 200, api.text
