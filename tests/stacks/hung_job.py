"""A tiny gloo training job that hangs on purpose (run under torchrun; tests/stacks).

Each step: a forward/backward of a tiny MLP, an explicit ``dist.all_reduce`` of the gradients in
the default process group, ``optimizer.step()``. Modes:

* ``stuck``: at step ``--stuck-step`` rank ``--stuck-rank`` enters ``stuck_here`` and never
  leaves; the others wait in the next all-reduce forever.
* ``barrier``: at step ``--stuck-step`` the ranks of ``--pair`` enter a barrier of a second
  process group (over every rank) that the others never reach, while the others wait in the
  all-reduce of the default group that the pair never reaches: a deadlock.
* ``healthy``: trains until ``--max-seconds``.

``--progress-dir``: each rank writes ``rank-<r>.json`` (its step) after every step. With
``--fr-dir`` and ``TORCH_FR_BUFFER_SIZE`` set, a watchdog thread writes the rank's Flight
Recorder (``_dump_fr_trace_json``) to ``<fr-dir>/fr_trace_rank_<r>.json`` once the step counter
has not moved for ``--fr-after-s`` seconds: what ``TORCH_NCCL_DUMP_ON_TIMEOUT`` does for NCCL.
"""

from __future__ import annotations

import argparse
import json
import os
import threading
import time
from pathlib import Path

import torch
import torch.distributed as dist

STEP = [0]


def stuck_here() -> None:
    """Rank ``--stuck-rank`` blocks here forever (a stand-in for a lost file read, a deadlock)."""
    while True:
        time.sleep(0.2)


def _bomb(max_seconds: float) -> None:
    time.sleep(max_seconds)
    os._exit(3)


def _fr_watchdog(fr_dir: Path, rank: int, after_s: float) -> None:
    import torch._C._distributed_c10d as c10d

    last, since = -1, time.monotonic()
    while True:
        time.sleep(0.2)
        if STEP[0] != last or STEP[0] == 0:  # armed once training has stepped
            last, since = STEP[0], time.monotonic()
            continue
        if time.monotonic() - since >= after_s:
            fr_dir.mkdir(parents=True, exist_ok=True)
            tmp = fr_dir / f".fr_trace_rank_{rank}.json.tmp"
            tmp.write_bytes(c10d._dump_fr_trace_json(True, False))
            tmp.rename(fr_dir / f"fr_trace_rank_{rank}.json")
            return


def _progress(progress_dir: Path | None, rank: int, step: int) -> None:
    if progress_dir is None:
        return
    tmp = progress_dir / f".rank-{rank}.json.tmp"
    tmp.write_text(json.dumps({"rank": rank, "step": step, "pid": os.getpid(), "t": time.time()}))
    tmp.rename(progress_dir / f"rank-{rank}.json")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--mode", choices=("stuck", "barrier", "healthy"), default="stuck")
    p.add_argument("--stuck-rank", type=int, default=2)
    p.add_argument("--stuck-step", type=int, default=30)
    p.add_argument("--pair", default="3,5")
    p.add_argument("--max-seconds", type=float, default=600)
    p.add_argument("--progress-dir", default=None)
    p.add_argument("--fr-dir", default=None)
    p.add_argument("--fr-after-s", type=float, default=3.0)
    p.add_argument("--threads", type=int, default=0, help="extra busy Python threads (benchmark)")
    args = p.parse_args()
    threading.Thread(target=_bomb, args=(args.max_seconds,), daemon=True).start()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    other = dist.new_group(list(range(world))) if args.mode == "barrier" else None
    pair = {int(x) for x in args.pair.split(",")}
    progress_dir = Path(args.progress_dir) if args.progress_dir else None
    if progress_dir is not None:
        progress_dir.mkdir(parents=True, exist_ok=True)
    if args.fr_dir:
        threading.Thread(
            target=_fr_watchdog, args=(Path(args.fr_dir), rank, args.fr_after_s), daemon=True
        ).start()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(64, 32), torch.randn(64, 1)
    step = 0
    while True:
        step += 1
        if args.mode == "stuck" and step == args.stuck_step and rank == args.stuck_rank:
            stuck_here()
        if args.mode == "barrier" and step == args.stuck_step and rank in pair:
            dist.barrier(group=other)
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        flat = torch.cat([q.grad.reshape(-1) for q in model.parameters() if q.grad is not None])
        dist.all_reduce(flat)
        opt.step()
        STEP[0] = step
        _progress(progress_dir, rank, step)


if __name__ == "__main__":
    main()
