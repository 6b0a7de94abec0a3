"""Soak: N consecutive duration-mode traces of one real 4-rank torchrun job (gloo, CPU).

Not a pytest test (a long run; issue 10 item 3's acceptance): it starts a private daemon and
``kinetoscope.demo.train_ddp`` under torchrun, then triggers ``--duration-ms`` traces by the
launcher's pid (``kscope trace --pids <torchrun pid> --duration-ms D --wait``), one after the
other, and prints one line per trace and a count of complete ones::

    PYTHONPATH=. .venv/bin/python tests/collect/soak_duration.py OUT_DIR [--traces 20] [--ranks 4]

Exit code 0 when every trace completed on every rank.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from kinetoscope.collect.trigger import (  # noqa: E402
    KINETO_WARMUP_S,
    STALL_GRACE_S,
    Target,
    TraceOptions,
    TraceRequest,
    trigger_trace,
    wait_for_trace,
)
from kinetoscope.demo.local import LocalDaemon, TrainingJob  # noqa: E402


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", type=Path)
    p.add_argument("--traces", type=int, default=20)
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--duration-ms", type=int, default=500)
    p.add_argument("--timeout", type=float, default=60.0)
    p.add_argument("--model", default="tiny", help="train_ddp --model (tiny, small, ...)")
    p.add_argument("--step-sleep-ms", type=float, default=20.0, help="train_ddp --step-sleep-ms")
    p.add_argument("--load-ms", type=float, default=20.0, help="train_ddp --load-ms")
    p.add_argument("--kineto-log-level", default=None, help="KINETO_LOG_LEVEL for the ranks (0 = verbose)")
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    complete = 0
    worst_all = 0.0
    with LocalDaemon(args.out) as daemon:
        env = dict(daemon.kineto_env())
        if args.kineto_log_level is not None:
            env["KINETO_LOG_LEVEL"] = args.kineto_log_level
        with TrainingJob(
            args.out,
            ranks=args.ranks,
            steps=0,
            model=args.model,
            max_seconds=args.traces * 60 + 120,
            env=env,
            load_ms=args.load_ms,
            extra_args=["--quiet", "--step-sleep-ms", f"{args.step_sleep_ms:g}"],
        ) as job:
            daemon.wait_for_processes(args.ranks, timeout=120, alive=job.alive)
            job.wait_for_steps(3, timeout=120)
            for i in range(args.traces):
                t0 = time.monotonic()
                res = trigger_trace(
                    TraceRequest(
                        [daemon.address], Target(pids=(job.pid,)), TraceOptions(duration_ms=args.duration_ms)
                    )
                )
                if len(res.files) != args.ranks:
                    print(
                        f"trace {i}: triggered {len(res.files)}/{args.ranks}: {[e.message for e in res.errors]}",
                        flush=True,
                    )
                    continue
                # how long after its nominal window end (pickup + 5 s warmup + duration) each file
                # was seen complete: the margin a healthy trace leaves below STALL_GRACE_S
                lateness: dict[int, float] = {}

                def seen(r: object, lateness: dict[int, float] = lateness) -> None:
                    now = time.monotonic()
                    for f in r.files:  # type: ignore[attr-defined]
                        if f.complete and f.pid not in lateness and f.delivered_mono is not None:
                            lateness[f.pid] = now - (
                                f.delivered_mono + KINETO_WARMUP_S + args.duration_ms / 1000
                            )

                res = wait_for_trace(res, timeout=args.timeout, poll_interval=0.3, on_progress=seen)
                took = time.monotonic() - t0
                done = sum(f.complete for f in res.files)
                complete += res.ok
                worst = max(lateness.values(), default=float("nan"))
                worst_all = max(worst_all, worst) if lateness else worst_all
                print(
                    f"trace {i}: {res.trace_id} {done}/{len(res.files)} complete in {took:.1f} s, "
                    f"at most {worst:.1f} s after the nominal window end, "
                    f"{sum(f.retries for f in res.files)} re-sent"
                    + ("" if res.ok else " | " + " | ".join(e.message for e in res.errors)),
                    flush=True,
                )
            if not job.alive():
                print(f"job exited:\n{job.tail()}")
    print(
        f"{complete}/{args.traces} duration traces complete on all {args.ranks} ranks; the latest file came "
        f"{worst_all:.1f} s after its nominal window end (stalled after {STALL_GRACE_S:g} s)",
        flush=True,
    )
    return 0 if complete == args.traces else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
