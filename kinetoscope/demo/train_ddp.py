"""A small real DDP training job (CPU, gloo) with an emulated straggler.

It knows nothing about profiling: it never imports ``torch.profiler`` and has no tracing code.
Kinetoscope traces it from outside (``KINETO_USE_DAEMON=1`` in its environment is all it takes).

Run it under torchrun::

    python -m torch.distributed.run --standalone --nproc-per-node 2 -m kinetoscope.demo.train_ddp \
        --steps 200 --straggler intermittent

or let it launch torchrun itself (``--ranks N`` when not already under torchrun)::

    python -m kinetoscope.demo.train_ddp --ranks 4 --straggler intermittent --straggler-rank 2

Stragglers are emulated as in the PyTorch straggler-mitigation post: a sleep between the loss and
``backward()``, so the other ranks wait for it inside DDP's gradient all-reduce.

* ``none``: no sleeps.
* ``intermittent``: each step, with probability ``--straggler-prob``, one rank
  (``--straggler-rank``, or a random rank per event when it is -1) sleeps a uniform random
  ``--straggler-ms LO,HI`` milliseconds. With ``--straggler-block B`` the stalls are stratified
  instead: exactly ``round(prob x B)`` random steps of every block of ``B`` steps (steps
  ``1..B``, ``B+1..2B``, ...), so a traced window of ``B`` aligned steps always holds the same
  number of stalls (``kscope demo``: 3 of every 10, docs/demo.md).
* ``persistent``: ``--straggler-rank`` (default: the last rank) sleeps every step.

The straggler schedule depends only on ``--seed`` and the step number, so every rank computes the
same schedule and the events are reproducible. With ``--progress-dir`` each rank writes
``rank-<r>.json`` (latest step, rewritten every step) and ``rank-<r>.steps.jsonl`` (one line per
step: start time, duration, straggler sleep, end of ``optimizer.step()``) — ground truth for tests
and diagnosis.

Batches are read through a real ``torch.utils.data.DataLoader`` (``num_workers=0``) over a small
in-memory dataset; ``--load-ms`` makes every batch take that long to load (a sleep in
``Dataset.__getitem__``), which emulates I/O and shows up as the DataLoader's ``__next__`` in
traces. ``--bucket-cap-mb`` sets DDP's gradient bucket size (small buckets: several all-reduces
per step).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MODEL_SIZES = {
    # name: (input features, hidden width, hidden layers, classes)
    "tiny": (64, 128, 2, 10),
    "small": (256, 512, 3, 10),
    "medium": (512, 1024, 4, 10),
    "large": (1024, 2048, 4, 10),
}
STRAGGLER_MODES = ("none", "intermittent", "persistent")


@dataclass(frozen=True)
class StragglerPlan:
    mode: str = "none"
    rank: int = -1  # -1: intermittent -> random rank per event; persistent -> last rank
    prob: float = 0.3
    lo_ms: float = 50.0
    hi_ms: float = 200.0
    seed: int = 0
    block: int = 0  # intermittent: > 0 -> exactly round(prob * block) steps of every block of steps

    def sleep_ms(self, step: int, rank: int, world_size: int) -> float:
        """How long ``rank`` sleeps at ``step`` (identical on every rank for the same inputs)."""
        if self.mode == "none" or world_size <= 0:
            return 0.0
        rng = random.Random(self.seed * 1_000_003 + step)
        if self.mode == "persistent":
            victim = self.rank if self.rank >= 0 else world_size - 1
            ms = rng.uniform(self.lo_ms, self.hi_ms)
            return ms if victim % world_size == rank else 0.0
        # intermittent
        if self.block > 0:  # stratified: the same number of stalls in every block (steps 1..B, B+1..2B, ...)
            b = (step - 1) // self.block
            picks = random.Random(self.seed * 1_000_003 + 7_919 * b + 1).sample(
                range(self.block), min(self.block, round(self.prob * self.block))
            )
            if (step - 1) % self.block not in picks:
                return 0.0
        elif rng.random() >= self.prob:
            return 0.0
        victim = self.rank if self.rank >= 0 else rng.randrange(world_size)
        ms = rng.uniform(self.lo_ms, self.hi_ms)
        return ms if victim % world_size == rank else 0.0


def parse_ms_range(text: str) -> tuple[float, float]:
    parts = [p for p in text.replace(":", ",").split(",") if p.strip()]
    try:
        values = [float(p) for p in parts]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected LO[,HI] milliseconds, got {text!r}") from None
    if len(values) == 1:
        values.append(values[0])
    if len(values) != 2 or values[0] < 0 or values[1] < values[0]:
        raise argparse.ArgumentTypeError(f"expected LO[,HI] milliseconds with 0 <= LO <= HI, got {text!r}")
    return values[0], values[1]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m kinetoscope.demo.train_ddp",
        description="Small DDP (gloo, CPU) training job with an emulated straggler; no profiling code.",
    )
    p.add_argument(
        "--steps", type=int, default=200, help="optimizer steps to run; 0 = until stopped (default 200)"
    )
    p.add_argument(
        "--ranks",
        type=int,
        default=None,
        help="when not under torchrun: launch torchrun with this many ranks (default: run as one process)",
    )
    p.add_argument("--straggler", choices=STRAGGLER_MODES, default="none")
    p.add_argument(
        "--straggler-rank",
        type=int,
        default=-1,
        help="the straggling rank; -1: random per event (intermittent) or the last rank (persistent)",
    )
    p.add_argument(
        "--straggler-prob", type=float, default=0.3, help="intermittent: probability per step (0.3)"
    )
    p.add_argument(
        "--straggler-block",
        type=int,
        default=0,
        help="intermittent: stall in exactly round(prob x B) of every B consecutive steps "
        "(steps 1..B, B+1..2B, ...) instead of independently per step; 0 = off (default)",
    )
    p.add_argument(
        "--straggler-ms",
        type=parse_ms_range,
        default=(50.0, 200.0),
        help="sleep in milliseconds, LO[,HI] uniform (default 50,200)",
    )
    p.add_argument("--model", choices=sorted(MODEL_SIZES), default="small", help="MLP size (default small)")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--step-sleep-ms",
        type=float,
        default=0.0,
        help="extra sleep at the end of every step on every rank (stretches the job cheaply)",
    )
    p.add_argument(
        "--load-ms",
        type=float,
        default=0.0,
        help="emulated data loading: each batch takes this long to load (a sleep in the "
        "Dataset read through a DataLoader); default 0",
    )
    p.add_argument(
        "--bucket-cap-mb",
        type=float,
        default=None,
        help="DDP gradient bucket size in MiB (default: PyTorch's 25); small -> several all-reduces per step",
    )
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads per rank (default 1)")
    p.add_argument(
        "--max-seconds",
        type=float,
        default=0.0,
        help="safety net: exit (code 3) after this many seconds even if steps remain; 0 = off",
    )
    p.add_argument("--progress-dir", default=None, help="write rank-<r>.json and rank-<r>.steps.jsonl here")
    p.add_argument("--quiet", action="store_true", help="print only start and end lines")
    return p


def _under_torchrun() -> bool:
    return "LOCAL_RANK" in os.environ or "TORCHELASTIC_RUN_ID" in os.environ


def _launch_torchrun(args: argparse.Namespace, argv: list[str]) -> None:
    """Replace this process by torchrun running this module with ``args.ranks`` ranks."""
    rest: list[str] = []
    skip = False
    for a in argv:
        if skip:
            skip = False
            continue
        if a == "--ranks":
            skip = True
            continue
        if a.startswith("--ranks="):
            continue
        rest.append(a)
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={args.ranks}",
        "-m",
        "kinetoscope.demo.train_ddp",
        *rest,
    ]
    sys.stdout.flush()
    os.execv(sys.executable, cmd)


def _start_watchdog(max_seconds: float, rank: int) -> None:
    def bomb() -> None:
        time.sleep(max_seconds)
        print(f"[rank {rank}] --max-seconds {max_seconds:g} reached, exiting", file=sys.stderr, flush=True)
        os._exit(3)

    threading.Thread(target=bomb, name="max-seconds", daemon=True).start()


def _write_json_atomic(path: Path, obj: dict[str, Any]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj))
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    if args.ranks is not None and args.ranks < 1:
        print("--ranks must be at least 1", file=sys.stderr)
        return 2
    if args.ranks is not None and args.ranks > 1 and not _under_torchrun():
        _launch_torchrun(args, argv)  # does not return

    import torch.distributed as dist  # after the launch decision: the launcher need not pay for it twice

    rank, world_size, distributed = _start_rank(args)

    plan = StragglerPlan(
        mode=args.straggler,
        rank=args.straggler_rank,
        prob=args.straggler_prob,
        lo_ms=args.straggler_ms[0],
        hi_ms=args.straggler_ms[1],
        seed=args.seed,
        block=max(0, args.straggler_block),
    )
    model, optimizer, loss_fn = _model(args, distributed)
    data = _batches(args, rank)

    progress_dir = Path(args.progress_dir) if args.progress_dir else None
    steps_log = None
    if progress_dir is not None:
        progress_dir.mkdir(parents=True, exist_ok=True)
        steps_log = open(progress_dir / f"rank-{rank}.steps.jsonl", "a", buffering=1)  # noqa: SIM115

    if rank == 0:
        print(
            f"[train_ddp] world_size={world_size} model={args.model} steps={args.steps or 'until stopped'} "
            f"straggler={_describe(plan, world_size)} pid={os.getpid()}",
            flush=True,
        )

    t_begin = time.time()
    step = 0
    loss_value = float("nan")
    try:
        while args.steps <= 0 or step < args.steps:
            t0 = time.time()
            x, y = next(data)
            optimizer.zero_grad(set_to_none=True)
            out = model(x)
            loss = loss_fn(out, y)
            slept = plan.sleep_ms(step, rank, world_size)
            if slept > 0:  # the emulated straggler: between the loss and backward, as in the post
                time.sleep(slept / 1000.0)
            loss.backward()
            optimizer.step()
            t_opt = time.time()
            if args.step_sleep_ms > 0:
                time.sleep(args.step_sleep_ms / 1000.0)
            step += 1
            t1 = time.time()
            if step % 20 == 0:
                loss_value = float(loss.detach())
            if progress_dir is not None:
                assert steps_log is not None
                _log_step(progress_dir, steps_log, rank, world_size, step, (t0, t_opt, t1), slept)
            if not args.quiet and rank == 0 and step % 50 == 0:
                print(
                    f"[train_ddp] step {step} loss {loss_value:.4f} "
                    f"({(t1 - t_begin) / step * 1000:.1f} ms/step)",
                    flush=True,
                )
    finally:
        if steps_log is not None:
            steps_log.close()
    if distributed:
        dist.barrier()
        dist.destroy_process_group()
    if rank == 0:
        print(f"[train_ddp] done: {step} steps in {time.time() - t_begin:.1f} s", flush=True)
    return 0


def _start_rank(args: argparse.Namespace) -> tuple[int, int, bool]:
    """(rank, world size, distributed) of this process, its watchdog and threads set, and its
    gloo process group joined when it is one rank of a distributed job."""
    import torch
    import torch.distributed as dist

    rank = int(os.environ.get("RANK", "0"))
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if args.max_seconds > 0:
        _start_watchdog(args.max_seconds, rank)
    torch.set_num_threads(max(1, args.threads))
    distributed = world_size > 1 or "MASTER_ADDR" in os.environ
    if distributed:
        dist.init_process_group("gloo")
        rank, world_size = dist.get_rank(), dist.get_world_size()
    return rank, world_size, distributed


def _model(args: argparse.Namespace, distributed: bool) -> tuple[Any, Any, Any]:
    """(model, optimizer, loss) of ``--model``: an MLP with the same initial weights on every
    rank, wrapped in DDP when the job is distributed."""
    import torch
    from torch import nn

    features, hidden, layers, classes = MODEL_SIZES[args.model]
    torch.manual_seed(args.seed)  # same initial weights on every rank
    mods: list[nn.Module] = [nn.Linear(features, hidden), nn.ReLU()]
    for _ in range(layers - 1):
        mods += [nn.Linear(hidden, hidden), nn.ReLU()]
    mods.append(nn.Linear(hidden, classes))
    model: nn.Module = nn.Sequential(*mods)
    if distributed:
        ddp_kw = {} if args.bucket_cap_mb is None else {"bucket_cap_mb": args.bucket_cap_mb}
        model = nn.parallel.DistributedDataParallel(model, **ddp_kw)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    return model, optimizer, nn.CrossEntropyLoss()


def _batches(args: argparse.Namespace, rank: int) -> Iterator[Any]:
    """The rank's data shard (8 random batches, its own seed) through a DataLoader, endlessly;
    reading a batch takes ``--load-ms`` (emulated I/O)."""
    import torch

    features, _hidden, _layers, classes = MODEL_SIZES[args.model]
    gen = torch.Generator().manual_seed(args.seed * 7919 + rank)  # each rank its own data shard
    batches = [
        (
            torch.randn(args.batch_size, features, generator=gen),
            torch.randint(0, classes, (args.batch_size,), generator=gen),
        )
        for _ in range(8)
    ]
    load_s = max(0.0, args.load_ms) / 1000.0

    class Batches(torch.utils.data.Dataset[Any]):
        """The rank's batches; reading one takes ``--load-ms`` (emulated I/O)."""

        def __len__(self) -> int:
            return len(batches)

        def __getitem__(self, i: int) -> Any:
            if load_s:
                time.sleep(load_s)
            return batches[i]

    loader = torch.utils.data.DataLoader(Batches(), batch_size=None, shuffle=False, num_workers=0)

    def forever() -> Iterator[Any]:
        while True:  # one epoch after the other, until --steps
            yield from loader

    return forever()


def _describe(plan: StragglerPlan, world_size: int) -> str:
    """The straggler plan in the start line (``none``, or mode, rank, probability, delays)."""
    if plan.mode == "none":
        return plan.mode
    who = plan.rank if plan.rank >= 0 else ("random" if plan.mode == "intermittent" else world_size - 1)
    return (
        f"{plan.mode} (rank {who}"
        + (f", p={plan.prob:g}" if plan.mode == "intermittent" else "")
        + f", {plan.lo_ms:g}-{plan.hi_ms:g} ms)"
    )


def _log_step(
    progress_dir: Path,
    steps_log: Any,
    rank: int,
    world_size: int,
    step: int,
    times: tuple[float, float, float],
    slept: float,
) -> None:
    """One line of the rank's step log, and its progress file (the driver reads both).
    ``times``: the step's start, the end of its ``optimizer.step()`` (what a trace's
    ``Optimizer.step#`` annotation ends at, before ``--step-sleep-ms``) and its end."""
    t0, t_opt, t1 = times
    line = {"step": step - 1, "t0": t0, "dur_ms": (t1 - t0) * 1000.0, "straggle_ms": slept, "opt_end": t_opt}
    steps_log.write(json.dumps(line) + "\n")
    _write_json_atomic(
        progress_dir / f"rank-{rank}.json",
        {"rank": rank, "world_size": world_size, "pid": os.getpid(), "step": step, "t": t1},
    )


if __name__ == "__main__":
    sys.exit(main())
