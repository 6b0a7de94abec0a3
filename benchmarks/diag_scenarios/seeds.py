"""Labelled scenarios of the seeds' problems (issue 15), run as real CPU jobs and scored.

    .venv/bin/python benchmarks/diag_scenarios/seeds.py [--quick] [--only pipeline uneven ...]
        [--workdir DIR] [--keep] [--json OUT]

Problems and what is scored (each scenario: expected vs got, ``ok`` when every check holds):

* ``pipeline`` (seed 001): ``torch.distributed.pipelining`` jobs (``pipeline_job.py``, torchrun,
  gloo, 2-4 stages, GPipe / 1F1B, balanced or one stage with ``factor`` x the layers; one job
  of 2 pipeline replicas x 2 stages with DDP across replicas). Checks: ``pipeline`` not null,
  ``schedule`` as run, stage ``i`` = ranks ``i + d * stages``, the heavy stage named
  as ``slowest_stage`` with ``excess_fraction`` >= 0.2 (balanced: no ``pipeline-imbalance``).
  Reported, not scored: measured ``bubble_fraction`` vs the schedule's ``(p-1)/(m+p-1)``.
* ``uneven`` (seed 004): DDP jobs whose ``short`` rank gets 3 fewer batches
  (``uneven_job.py``), with and without ``Join``; even jobs. Checks: ``uneven_inputs.mode``
  (``join`` / ``unmatched`` / null), ``short_ranks``, and with Join ``steps_per_rank`` equal to
  the job's own step counters.
* ``recompile`` (seed 003): torch.compile'd loops fed distinct shapes (``recompile_job.py``).
  Checks: ``recompilation.compiles`` = ``torch._dynamo`` ``frames.total``, and the step of each
  compilation = the iteration at which Dynamo's counter grew.
* ``hsgd`` (seed 000): jobs with intermittent (or persistent) stragglers laid out on hosts
  (synthetic rank traces with host names, as manifests give them). Checks: the plan's
  ``period_group_size_dict`` / refusal as the rule in docs/diagnosis.md says.

Registering it in ``benchmarks/bench_diagnosis.py``: ``from benchmarks.diag_scenarios import
seeds`` and ``doc["seeds"] = seeds.run_all(seeds.scenarios(quick), workdir, keep)``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


@dataclass
class SeedScenario:
    sid: str
    problem: str  # pipeline | uneven | recompile | hsgd
    params: dict[str, Any]
    expected: dict[str, Any]


@dataclass
class SeedOutcome:
    sid: str
    problem: str
    params: dict[str, Any]
    expected: dict[str, Any]
    got: dict[str, Any] = field(default_factory=dict)
    checks: dict[str, bool] = field(default_factory=dict)
    error: str | None = None
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.error is None and bool(self.checks) and all(self.checks.values())

    def to_dict(self) -> dict[str, Any]:
        return asdict(self) | {"ok": self.ok}


def scenarios(quick: bool = False) -> list[SeedScenario]:
    """The labelled scenarios (``quick``: one or two per problem)."""
    pp = [
        ("pp_gpipe2_bal", 2, "gpipe", 4, -1, 1.0),
        ("pp_gpipe2_heavy1", 2, "gpipe", 4, 1, 3.0),
        ("pp_1f1b3_heavy1", 3, "1f1b", 6, 1, 3.0),
        ("pp_1f1b2_bal", 2, "1f1b", 4, -1, 1.0),
        ("pp_gpipe3_heavy2", 3, "gpipe", 6, 2, 3.0),
        ("pp_1f1b4_heavy0", 4, "1f1b", 8, 0, 3.0),
        ("pp_1f1b2x2dp_heavy1", 2, "1f1b", 4, 1, 3.0, 2),
    ]
    out = [
        SeedScenario(
            sid,
            "pipeline",
            {
                "stages": p,
                "schedule": s,
                "microbatches": m,
                "heavy_stage": h,
                "factor": f,
                "dp": dp[0] if dp else 1,
            },
            {"schedule": {"gpipe": "GPipe", "1f1b": "1F1B"}[s], "slowest_stage": h if h >= 0 else None},
        )
        for sid, p, s, m, h, f, *dp in (pp[1:3] if quick else pp)
    ]
    un = [
        ("un_join_r1", 3, 1, True, "join"),
        ("un_hang_r1", 3, 1, False, "unmatched"),
        ("un_even", 3, -1, True, None),
    ]
    un += (
        [] if quick else [("un_join_r0_w2", 2, 0, True, "join"), ("un_hang_r2_w4", 4, 2, False, "unmatched")]
    )
    out += [
        SeedScenario(
            sid,
            "uneven",
            {"world": w, "short_rank": r, "join": j},
            {"mode": mode, "short_ranks": [r] if mode else []},
        )
        for sid, w, r, j, mode in (un[:2] if quick else un)
    ]
    rc = [
        ("rc_static_aot", "aot_eager", "8,8,16,16,24,8,24", True, False),
        ("rc_auto_inductor", "inductor", "8,16,16,24", False, False),
        ("rc_mark_dynamic_aot", "aot_eager", "8,16,24,32", False, True),
    ]
    out += [
        SeedScenario(sid, "recompile", {"backend": b, "shapes": sh, "static": st, "mark_dynamic": md}, {})
        for sid, b, sh, st, md in (rc[:1] if quick else rc)
    ]
    hs = [
        ("hsgd_2x4_intermittent", 4, 2, "intermittent", [[2, 8]]),
        ("hsgd_4x2_intermittent", 2, 4, "intermittent", [[2, 4], [4, 8]]),
        ("hsgd_1x8_intermittent", 8, 1, "intermittent", None),
        ("hsgd_2x4_persistent", 4, 2, "persistent", None),
    ]
    out += [
        SeedScenario(
            sid, "hsgd", {"ranks_per_host": h, "hosts": n, "kind": k}, {"period_group_size_dict": lv}
        )
        for sid, h, n, k, lv in (hs[:1] if quick else hs)
    ]
    return out


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}


def _torchrun(script: str, nproc: int, out: Path, *args: str) -> None:
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        str(nproc),
        "--master-addr",
        "127.0.0.1",
        "--master-port",
        str(_port()),
        str(HERE / script),
        str(out),
        *args,
    ]
    p = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=600, check=False)
    if p.returncode:
        raise RuntimeError(f"{script} exited {p.returncode}: {p.stderr[-800:]}")


def _diagnose(path: Path | list[Any]) -> Any:
    from kinetoscope.diagnosis import diagnose

    return diagnose(path)


def run_pipeline(sc: SeedScenario, out: Path) -> tuple[dict[str, Any], dict[str, bool]]:
    p = sc.params
    _torchrun(
        "pipeline_job.py",
        p["stages"] * p["dp"],
        out,
        "--dp",
        str(p["dp"]),
        "--schedule",
        p["schedule"],
        "--microbatches",
        str(p["microbatches"]),
        "--width",
        "512",
        "--batch",
        "64",
        "--heavy-stage",
        str(p["heavy_stage"]),
        "--heavy-factor",
        str(p["factor"]),
    )
    d = _diagnose(out)
    pp = d.to_dict()["pipeline"] or {}
    im = pp.get("imbalance") or {}
    flagged = any(r["id"] == "pipeline-imbalance" for r in d.recommendations)
    got = {
        k: pp.get(k)
        for k in ("schedule", "microbatches", "bubble_fraction", "expected_bubble_fraction", "step_time_ms")
    }
    got |= {
        "stage_ranks": [s["ranks"] for s in pp.get("stages", [])],
        "slowest_stage": im.get("slowest_stage"),
        "excess_fraction": im.get("excess_fraction"),
        "imbalance_flagged": flagged,
    }
    heavy = sc.expected["slowest_stage"]
    checks = {
        "recognised": bool(pp),
        "schedule": pp.get("schedule") == sc.expected["schedule"],
        "stages": got["stage_ranks"]
        == [[i + d * p["stages"] for d in range(p["dp"])] for i in range(p["stages"])],
        "imbalance": (flagged and im.get("slowest_stage") == heavy) if heavy is not None else not flagged,
    }
    return got, checks


def run_uneven(sc: SeedScenario, out: Path) -> tuple[dict[str, Any], dict[str, bool]]:
    p = sc.params
    args = [
        "--batches",
        "6",
        "--short-rank",
        str(max(p["short_rank"], 0)),
        "--short-by",
        "3" if p["short_rank"] >= 0 else "0",
        "--timeout-s",
        "5",
    ]
    _torchrun("uneven_job.py", p["world"], out, *args, *(["--join"] if p["join"] else []))
    truth = {f.name.split("-")[1].split(".")[0]: int(f.read_text()) for f in out.glob("rank-*.steps")}
    u = _diagnose(out).to_dict()["uneven_inputs"]
    got = {
        "mode": u and u["mode"],
        "short_ranks": u["short_ranks"] if u else [],
        "steps_per_rank": u and u["steps_per_rank"],
        "job_steps": truth,
    }
    checks = {
        "mode": got["mode"] == sc.expected["mode"],
        "short_ranks": got["short_ranks"] == sc.expected["short_ranks"],
    }
    if sc.expected["mode"] == "join":
        checks["steps_match_job"] = got["steps_per_rank"] == truth
    return got, checks


def run_recompile(sc: SeedScenario, out: Path) -> tuple[dict[str, Any], dict[str, bool]]:
    p = sc.params
    args = ["--backend", p["backend"], "--shapes", p["shapes"]] + (["--static"] if p["static"] else [])
    args += ["--mark-dynamic"] if p["mark_dynamic"] else []
    proc = subprocess.run(
        [sys.executable, str(HERE / "recompile_job.py"), str(out), *args],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    if proc.returncode:
        raise RuntimeError(f"recompile_job.py exited {proc.returncode}: {proc.stderr[-800:]}")
    truth = json.loads((out / "truth.json").read_text())
    rc = _diagnose(out / "train.pt.trace.json").to_dict()["recompilation"] or {"compiles": 0, "events": []}
    got = {
        "compiles": rc["compiles"],
        "steps": [e["step"] for e in rc["events"]],
        "durations_ms": [e["duration_ms"] for e in rc["events"]],
        "dynamo": truth,
    }
    sc.expected.update({"compiles": truth["frames_total"], "steps": truth["compiled_at_iterations"]})
    checks = {
        "compiles": got["compiles"] == truth["frames_total"],
        "steps": got["steps"] == truth["compiled_at_iterations"],
    }
    return got, checks


def run_hsgd(sc: SeedScenario, out: Path) -> tuple[dict[str, Any], dict[str, bool]]:
    del out
    import random

    sys.path.insert(0, str(ROOT / "tests" / "diagnosis"))
    from diag_synth import make_job  # the synthetic rank traces of the diagnosis tests

    h, n = sc.params["ranks_per_host"], sc.params["hosts"]
    world, steps = h * n, 24
    rng = random.Random(world * 31 + n)
    late = [[0.0] * steps for _ in range(world)]
    for s in range(steps):
        if sc.params["kind"] == "persistent":
            late[1][s] = 60.0
        elif rng.random() < 0.4:
            late[rng.randrange(world)][s] = 60.0
    jit = [[[rng.randint(0, 200_000) for _ in range(2)] for _ in range(steps)] for _ in range(world)]
    d = _diagnose(
        make_job(world, steps, late_ms=late, jitter_ns=jit, hosts=[f"host{r // h}" for r in range(world)])
    )
    rec = next((r for r in d.recommendations if r["id"].startswith("straggler-")), None)
    plan = (rec or {}).get("evidence", {}).get("hsgd_plan")
    got = {
        "kind": d.stragglers.kind,
        "plan_applies": plan and plan["applies"],
        "period_group_size_dict": plan and plan.get("period_group_size_dict"),
        "reason": plan and plan.get("reason"),
    }
    want = sc.expected["period_group_size_dict"]
    checks = {
        "kind": got["kind"] == sc.params["kind"],
        "plan": (bool(got["plan_applies"]) and got["period_group_size_dict"] == want)
        if want
        else not got["plan_applies"],
    }
    return got, checks


RUNNERS: dict[str, Callable[[SeedScenario, Path], tuple[dict[str, Any], dict[str, bool]]]] = {
    "pipeline": run_pipeline,
    "uneven": run_uneven,
    "recompile": run_recompile,
    "hsgd": run_hsgd,
}


def run_one(sc: SeedScenario, workdir: Path, keep: bool = False) -> SeedOutcome:
    """One scenario, expected vs got; a crash is a wrong verdict with its message."""
    o = SeedOutcome(sc.sid, sc.problem, sc.params, sc.expected)
    out = workdir / sc.sid
    t0 = time.monotonic()
    try:
        out.mkdir(parents=True, exist_ok=True)
        o.got, o.checks = RUNNERS[sc.problem](sc, out)
    except Exception as exc:  # noqa: BLE001 - recorded as a failed scenario
        o.error = f"{type(exc).__name__}: {exc}"[:1500]
    finally:
        if not keep:
            shutil.rmtree(out, ignore_errors=True)
    o.seconds = time.monotonic() - t0
    return o


def run_all(items: list[SeedScenario], workdir: Path, keep: bool = False) -> dict[str, Any]:
    """Every scenario (one line each) and the score: per problem, scenarios ok / run."""
    outs = []
    for k, sc in enumerate(items):
        o = run_one(sc, workdir, keep)
        print(
            f"[{k + 1}/{len(items)}] {'ok ' if o.ok else 'ERR' if o.error else 'MISS'} {o.sid} "
            f"({o.seconds:.0f} s) {json.dumps(o.checks)}{' ' + o.error if o.error else ''}",
            flush=True,
        )
        outs.append(o)
    return {"score": score(outs), "scenarios": [o.to_dict() for o in outs]}


def score(outs: list[SeedOutcome]) -> dict[str, dict[str, int]]:
    """Per problem (and ``overall``): scenarios run and scenarios whose every check held."""
    res: dict[str, dict[str, int]] = {}
    for o in outs:
        for key in (o.problem, "overall"):
            r = res.setdefault(key, {"n": 0, "ok": 0})
            r["n"] += 1
            r["ok"] += int(o.ok)
    return res


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--only", nargs="*", choices=sorted(RUNNERS))
    ap.add_argument("--workdir", type=Path)
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--json", type=Path)
    a = ap.parse_args(argv)
    items = [s for s in scenarios(a.quick) if not a.only or s.problem in a.only]
    work = a.workdir or Path(tempfile.mkdtemp(prefix="kscope-seeds-"))
    t0 = time.monotonic()
    doc = run_all(items, work, a.keep) | {"seconds": round(time.monotonic() - t0, 1)}
    for prob, r in doc["score"].items():
        print(f"{prob:10s} {r['ok']}/{r['n']}")
    if a.json:
        a.json.write_text(json.dumps(doc, indent=1, default=str))
    return 0 if doc["score"].get("overall", {}).get("ok") == len(items) else 1


if __name__ == "__main__":
    raise SystemExit(main())
