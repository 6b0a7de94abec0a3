"""Speed of the what-if replay: a synthetic 1,024-rank job, 200 sync points per step, 10 steps.

Target (issue 27): replay + what-if search under 2 s on one core. Run::

    PYTHONPATH=. nice -n 10 python benchmarks/bench_whatif.py [--ranks 1024 --syncs 200 --steps 10]

Job: tensor-parallel groups of 8 (most sync points), data-parallel groups of ranks/8 (every 20th
sync point) and one job-wide all-reduce per step. Two near-equal persistent stragglers and one
intermittent rank are injected; the benchmark also prints whether the search names them.
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_var] = "1"  # one core, as the target says

import argparse  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402

from kinetoscope.diagnosis.whatif.model import ReplayModel, typical  # noqa: E402
from kinetoscope.diagnosis.whatif.search import WhatIf, explain, member_groups  # noqa: E402

TP = 8


def synthetic(ranks: int, syncs: int, steps: int, seed: int = 7) -> tuple[ReplayModel, set[int]]:
    """Build the job directly in topological order; returns it and the injected ranks."""
    rng = np.random.default_rng(seed)
    lanes = np.arange(ranks)
    dp_perm = np.lexsort((lanes, lanes % TP))  # DP groups: ranks with the same TP index
    dp_pos = np.empty(ranks, dtype=np.int64)
    dp_pos[dp_perm] = lanes
    blocks_per_step = syncs + 1  # + the step end
    inc_lane, inc_sync, inc_prev, kinds = [], [], [], []
    sync_base, prev_pos, prev_start = 0, None, -1
    sync_transfer: list[np.ndarray] = []
    for _step in range(steps):
        for j in range(blocks_per_step):
            if j == syncs:
                kind, order, key, n, tr = "end", lanes, lanes, ranks, 0.0
            elif j == syncs - 1:
                kind, order, key, n, tr = "all", lanes, np.zeros(ranks, np.int64), 1, 5e-3
            elif j % 20 == 19:
                kind, order, key, n, tr = "dp", dp_perm, dp_perm % TP, TP, 2e-3
            else:
                kind, order, key, n, tr = "tp", lanes, lanes // TP, ranks // TP, 5e-5
            start = len(inc_lane) * ranks
            inc_lane.append(order)
            inc_sync.append(sync_base + key)
            pos = dp_pos if kind == "dp" else lanes
            if prev_pos is None:
                inc_prev.append(np.full(ranks, -1, dtype=np.int64))
            else:
                inc_prev.append(prev_start + prev_pos[order])
            kinds.append(kind)
            sync_transfer.append(np.full(n, tr))
            prev_pos, prev_start, sync_base = pos, start, sync_base + n
    lane_a = np.concatenate(inc_lane)
    sync_a = np.concatenate(inc_sync)
    n_inc = lane_a.shape[0]
    step_a = np.repeat(np.arange(steps), blocks_per_step * ranks)
    work = rng.lognormal(np.log(1e-3), 0.05, n_inc)
    injected = {137, 600}
    work[lane_a == 137] *= 1.30
    work[lane_a == 600] *= 1.27
    hit = (lane_a == 900) & np.isin(step_a, [2, 5, 8])
    work[hit] *= 1.5
    injected.add(900)
    is_end = np.concatenate([np.full(t.shape[0], k == "end") for t, k in zip(sync_transfer, kinds)])
    group = np.where(is_end[sync_a], sync_a.max() + 1 + step_a, sync_a)
    transfer = np.concatenate(sync_transfer)
    model = ReplayModel(
        n_lanes=ranks,
        n_steps=steps,
        independent_steps=False,
        inc_lane=lane_a,
        inc_sync=sync_a,
        inc_step=step_a,
        inc_prev=np.concatenate(inc_prev),
        inc_async=np.zeros(n_inc, dtype=bool),
        inc_transfer=transfer[sync_a],
        inc_ideal_transfer=transfer[sync_a],
        sync_label=np.zeros(transfer.shape[0], dtype=np.int64),
        sync_is_end=is_end,
        item_inc=np.arange(n_inc),
        item_work=work,
        item_ideal=typical(work, group),
        item_label=np.zeros(n_inc, dtype=np.int64),
        labels=("compute",),
        lane_name=tuple(f"rank{r}" for r in range(ranks)),
        lane_stage=np.zeros(ranks, dtype=np.int64),
        observed_step_time=np.zeros(steps),
    )
    return model, injected


def main() -> None:
    """Build the job, then time the replay and the what-if search."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=1024)
    ap.add_argument("--syncs", type=int, default=200)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    t0 = time.perf_counter()
    model, injected = synthetic(args.ranks, args.syncs, args.steps)
    build_s = time.perf_counter() - t0
    best, best_cpu = np.inf, np.inf
    for _ in range(args.repeat):
        t0, c0 = time.perf_counter(), time.process_time()
        w = WhatIf(model)
        exp = explain(w, groups=member_groups(model))
        best = min(best, time.perf_counter() - t0)
        best_cpu = min(best_cpu, time.process_time() - c0)
    print(
        f"job: {args.ranks} ranks x {args.syncs} sync points x {args.steps} steps, "
        f"{model.inc_lane.shape[0]:,} incidences, {len(w.schedule.batch_inc):,} batches "
        f"(built in {build_s:.2f} s)"
    )
    print(
        f"replay + what-if search: {best:.2f} s wall, {best_cpu:.2f} s CPU "
        f"(best of {args.repeat}; target < 2 s on one core; load average {os.getloadavg()[0]:.1f})"
    )
    print(
        f"slowdown {w.slowdown:.3f}; explaining set {sorted(exp.lanes)} "
        f"(injected {sorted(injected)}), recovered {exp.recovered_fraction:.2f}"
    )


if __name__ == "__main__":
    main()
