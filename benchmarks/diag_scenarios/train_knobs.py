"""A small real DDP training job (CPU, gloo) with the straggler knobs of the accuracy benchmark.

Like ``kinetoscope.demo.train_ddp`` it has no profiling code (Kinetoscope traces it through the
daemon with ``KINETO_USE_DAEMON=1``) and writes the same progress files (``rank-<r>.json``,
``rank-<r>.steps.jsonl`` with ``straggle_ms`` = what was injected into that rank at that step).
Run under torchrun::

    python -m torch.distributed.run --standalone --nproc-per-node 4 \
        -m benchmarks.diag_scenarios.train_knobs --mode sleep --ranks-hit 2 --ms 30

Modes (``--ranks-hit R[,R]`` picks the ranks; ``--ms`` the amount per step, or ``--step-frac F``:
``F`` times the rank's own step period, as below):

* ``none``: nothing injected;
* ``sleep``: a sleep between the loss and ``backward()`` every step (two ranks: each draws
  ``ms * U(0.8, 1.2)`` per step, so they take turns being last);
* ``compute``: extra real compute (matrix products, busy for ``ms`` of wall time) before
  ``backward()`` every step;
* ``intermittent``: with probability ``--prob`` per step, one rank drawn at random sleeps ``ms``;
* ``slow_input``: reading a batch on the hit rank takes ``ms`` longer (a sleep in the Dataset);
* ``comm_hook``: a DDP communication hook that sleeps ``ms`` on the hit rank before each bucket's
  all-reduce (a slow collective on that rank's link);
* ``mixed``: a schedule per rank from ``--spec R:KIND:MS[:P],...`` (``--ranks-hit`` is ignored):
  ``sleep`` (``MS`` asleep every step), ``compute`` (``MS`` of busy compute every step) or
  ``intermittent`` (with probability ``P`` per step, drawn for that rank alone, ``MS`` asleep).
  Two ``sleep`` entries with the same ``MS`` hold exactly equal delays (two ranks masking each
  other); different kinds make two or three stragglers of different kinds in one job.

The schedule depends only on ``--seed`` and the step, so every rank computes the same one.

``--step-frac F`` (``sleep``, ``compute`` and ``intermittent`` modes) sizes the delay from the step instead of a
fixed ``--ms``: the hit rank holds ``F`` times the median of its last 8 step periods, each less the
delay it held (the step the job would have without the injection; ``--ms`` until 3 periods are
known). A fixed 3 ms was 3-7 % of the 41-100 ms steps of the accuracy benchmark's jobs, so on the
slower ones the "small" delay was below the 5 % of a step that the verdict reports as ``none`` by
design. In ``intermittent`` mode every rank measures its step every step and a stalled rank holds
``F`` of it (``F`` = 0.8: rotating stalls of most of a step).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from kinetoscope.demo.train_ddp import MODEL_SIZES

MODES = ("none", "sleep", "compute", "intermittent", "slow_input", "comm_hook", "mixed")
SIZED_MODES = ("sleep", "compute", "intermittent")  # the modes ``--step-frac`` sizes
SPEC_KINDS = ("sleep", "compute", "intermittent")  # the per-rank kinds of ``--spec``


@dataclass(frozen=True)
class RankSpec:
    """One rank's schedule in ``mixed`` mode: ``kind`` (``SPEC_KINDS``), ``ms`` per stall and, for
    ``intermittent``, the probability ``prob`` of a stall per step."""

    rank: int
    kind: str
    ms: float
    prob: float = 1.0


def parse_spec(text: str) -> dict[int, RankSpec]:
    """``R:KIND:MS[:P],...`` -> rank -> its schedule; a ``ValueError`` names the bad entry."""
    out: dict[int, RankSpec] = {}
    for item in filter(None, (x.strip() for x in text.split(","))):
        parts = item.split(":")
        try:
            if len(parts) not in (3, 4) or parts[1] not in SPEC_KINDS:
                raise ValueError
            prob = float(parts[3]) if len(parts) == 4 else 1.0
            spec = RankSpec(int(parts[0]), parts[1], float(parts[2]), prob)
        except ValueError:
            want = f"RANK:{'|'.join(SPEC_KINDS)}:MS[:PROB]"
            raise ValueError(f"--spec: bad entry {item!r} (want {want})") from None
        if spec.rank in out:
            raise ValueError(f"--spec: rank {spec.rank} given twice")
        out[spec.rank] = spec
    return out


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks.diag_scenarios.train_knobs")
    p.add_argument("--mode", choices=MODES, default="none")
    p.add_argument("--ranks-hit", default="", help="comma-separated ranks the injection hits")
    p.add_argument("--ms", type=float, default=0.0, help="injected milliseconds per step (or per event)")
    p.add_argument(
        "--step-frac",
        type=float,
        default=0.0,
        help="sleep/compute modes: hold this fraction of the rank's recent step period (less its delay) "
        "instead of --ms",
    )
    p.add_argument("--prob", type=float, default=0.3, help="intermittent: probability per step")
    p.add_argument("--spec", default="", help="mixed: per-rank schedules R:KIND:MS[:PROB],... (docstring)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--model", choices=sorted(MODEL_SIZES), default="tiny")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--load-ms", type=float, default=30.0, help="every rank's batch read (emulated I/O)")
    p.add_argument("--bucket-cap-mb", type=float, default=0.02)
    p.add_argument("--max-seconds", type=float, default=300.0)
    p.add_argument("--progress-dir", required=True)
    p.add_argument(
        "--device",
        choices=("cpu", "cuda"),
        default="cpu",
        help="cuda: model and batches on GPU LOCAL_RANK %% device_count (gloo still carries the "
        "all-reduces, so several ranks can share one GPU)",
    )
    return p


def injected_ms(args: argparse.Namespace, hit: list[int], step: int, rank: int, world: int) -> float:
    """What this rank gets at this step (identical on every rank for the same inputs)."""
    rng = random.Random(args.seed * 1_000_003 + step)
    if args.mode == "none":
        return 0.0
    if args.mode == "mixed":
        return mixed_ms(parse_spec(args.spec), args.seed, step, rank)
    if args.mode == "intermittent":
        if rng.random() >= args.prob:
            return 0.0
        return args.ms if rng.randrange(world) == rank else 0.0
    if rank not in hit:
        return 0.0
    if args.mode == "sleep" and len(hit) > 1:
        draws = {r: args.ms * rng.uniform(0.8, 1.2) for r in sorted(hit)}
        return draws[rank]
    return args.ms


def mixed_ms(spec: dict[int, RankSpec], seed: int, step: int, rank: int) -> float:
    """A ``mixed`` rank's delay at ``step``: its own draw (a string seed: the same in every process)."""
    s = spec.get(rank)
    if s is None:
        return 0.0
    if s.kind != "intermittent":
        return s.ms
    return s.ms if random.Random(f"mixed/{seed}/{step}/{rank}").random() < s.prob else 0.0


def holds_busy(args: argparse.Namespace, rank: int) -> bool:
    """Whether this rank holds its delay as real compute (else asleep)."""
    if args.mode == "mixed":
        s = parse_spec(args.spec).get(rank)
        return s is not None and s.kind == "compute"
    return bool(args.mode == "compute")


class StepFraction:
    """``frac`` of the recent step period without the injected delay (module docstring)."""

    def __init__(self, frac: float, fallback_ms: float, window: int = 8) -> None:
        self.frac, self.fallback_ms, self.window = frac, fallback_ms, window
        self.bases: list[float] = []
        self.last: tuple[float, float] | None = None  # (start, ms held) of the previous step

    def ms(self, t0: float, hold: bool = True) -> float:
        """The delay for the step starting at ``t0`` (``time.time()``); call once per step
        (``hold`` False: a step that holds no delay, measured all the same)."""
        if self.last is not None:
            start, held = self.last
            self.bases = [*self.bases, (t0 - start) * 1000.0 - held][-self.window :]
        ms = self.fallback_ms
        if len(self.bases) >= 3:
            ordered = sorted(self.bases)
            ms = self.frac * ordered[len(ordered) // 2]
        self.last = (t0, ms if hold else 0.0)
        return ms


def busy(ms: float, a, b) -> None:  # type: ignore[no-untyped-def]
    """Real compute for ``ms`` of wall time (matrix products). On a GPU each product is waited
    for, so the wall time is the GPU's and the launch queue stays short."""
    import torch

    end = time.perf_counter() + ms / 1000.0
    while time.perf_counter() < end:
        a = (a @ b).tanh()
        if a.is_cuda:
            torch.cuda.synchronize(a.device)


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    import threading

    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    threading.Timer(args.max_seconds, lambda: os._exit(3)).start()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    hit = [int(x) for x in args.ranks_hit.split(",") if x.strip()]
    busy_rank = holds_busy(args, rank)
    features, hidden, layers, classes = MODEL_SIZES[args.model]
    device = torch.device("cpu")
    if args.device == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count())
        torch.cuda.set_device(device)
    torch.manual_seed(args.seed)
    mods: list[nn.Module] = [nn.Linear(features, hidden), nn.ReLU()]
    for _ in range(layers - 1):
        mods += [nn.Linear(hidden, hidden), nn.ReLU()]
    model = nn.parallel.DistributedDataParallel(
        nn.Sequential(*mods, nn.Linear(hidden, classes)).to(device),
        device_ids=[device.index] if device.type == "cuda" else None,
        bucket_cap_mb=args.bucket_cap_mb,
    )
    state = {"ms": 0.0}
    if args.mode == "comm_hook":

        def slow_hook(pg, bucket):  # type: ignore[no-untyped-def]
            if state["ms"] > 0:
                time.sleep(state["ms"] / 1000.0)
            return allreduce_hook(pg, bucket)

        model.register_comm_hook(None, slow_hook)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    gen = torch.Generator().manual_seed(args.seed * 7919 + rank)
    batches = [
        (
            torch.randn(args.batch_size, features, generator=gen),
            torch.randint(0, classes, (args.batch_size,), generator=gen),
        )
        for _ in range(8)
    ]
    load = {"s": args.load_ms / 1000.0}

    class Batches(torch.utils.data.Dataset):
        def __len__(self) -> int:
            return len(batches)

        def __getitem__(self, i: int):  # type: ignore[no-untyped-def]
            time.sleep(load["s"])
            return batches[i]

    loader = torch.utils.data.DataLoader(Batches(), batch_size=None, num_workers=0)
    side = 4096 if device.type == "cuda" else 128  # a GPU product of ~2 ms, a CPU one of ~0.1 ms
    mat = torch.randn(side, side, device=device) / (side**0.5)
    progress = Path(args.progress_dir)
    progress.mkdir(parents=True, exist_ok=True)
    log = open(progress / f"rank-{rank}.steps.jsonl", "a", buffering=1)  # noqa: SIM115
    sized = StepFraction(args.step_frac, args.ms) if args.step_frac > 0 and args.mode in SIZED_MODES else None
    step = 0
    while True:
        for x_cpu, y_cpu in loader:
            t0 = time.time()
            x, y = x_cpu.to(device), y_cpu.to(device)
            ms = injected_ms(args, hit, step, rank, world)
            if sized is not None and (ms > 0 or args.mode == "intermittent"):
                size = sized.ms(t0, hold=ms > 0)  # intermittent: every step measured
                ms = size if ms > 0 else 0.0
            load["s"] = (args.load_ms + (ms if args.mode == "slow_input" else 0.0)) / 1000.0  # next read
            state["ms"] = ms if args.mode == "comm_hook" else 0.0
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(model(x), y)
            if ms > 0 and busy_rank:
                busy(ms, torch.randn(side, side, device=device), mat)
            elif ms > 0 and args.mode in ("sleep", "intermittent", "mixed"):
                time.sleep(ms / 1000.0)
            loss.backward()
            opt.step()
            if device.type == "cuda":
                torch.cuda.synchronize(device)  # the step's wall time in the log includes its kernels
            step += 1
            t1 = time.time()
            log.write(
                json.dumps({"step": step - 1, "t0": t0, "dur_ms": (t1 - t0) * 1000, "straggle_ms": ms}) + "\n"
            )
            tmp = progress / f"rank-{rank}.json.tmp"
            tmp.write_text(
                json.dumps({"rank": rank, "world_size": world, "pid": os.getpid(), "step": step, "t": t1})
            )
            os.replace(tmp, progress / f"rank-{rank}.json")


if __name__ == "__main__":
    sys.exit(main())
