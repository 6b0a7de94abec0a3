"""A real training job on a 2-D device mesh (CPU, gloo), DP x TP or DP x PP, with no profiling
code (traced through the daemon, ``KINETO_USE_DAEMON=1``). Run under torchrun::

    python -m torch.distributed.run --standalone --nproc-per-node 8 \
        -m benchmarks.diag_scenarios.mesh_job --layout dp_tp --dp 2 --slow-ranks 5 --slow-ms 30 \
        --progress-dir P

Layouts (``torch.distributed.device_mesh.init_device_mesh("cpu", (dp, k))``, rank = d * k + j):

``dp_tp``
    tensor parallel: each rank holds a column shard of the first and a row shard of the second
    Linear; the partial output is all-reduced over the tensor-parallel group (differentiable:
    once forward, once backward); gradients are all-reduced over the data-parallel group.
``dp_pp``
    pipeline parallel (``torch.distributed.pipelining``, GPipe, 4 micro-batches) over the
    pipeline group; gradients all-reduced over the data-parallel group. ``--heavy-stage S``
    gives stage S ``--heavy-factor`` times the layers.

``--slow-ranks R,..`` sleep ``--slow-ms`` before their backward every step (one rank, or every
rank of one replica). The job writes the daemon harness's progress files (``rank-<r>.json``,
``rank-<r>.steps.jsonl``) and, per rank, ``rank-<r>.colls.jsonl``: for every collective it
issues, the group (its ranks), a per-group count and the wall time it was issued: the
arrival-order truth per process group, from the job itself (``mesh.group_truth``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.diag_scenarios.mesh_job")
    p.add_argument("--layout", choices=("dp_tp", "dp_pp"), default="dp_tp")
    p.add_argument("--dp", type=int, default=2)
    p.add_argument("--width", type=int, default=256)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--slow-ranks", default="")
    p.add_argument("--slow-ms", type=float, default=0.0)
    p.add_argument("--heavy-stage", type=int, default=-1)
    p.add_argument("--heavy-factor", type=float, default=1.0)
    p.add_argument("--step-sleep-ms", type=float, default=20.0, help="emulated input loading per step")
    p.add_argument("--max-seconds", type=float, default=300.0)
    p.add_argument("--progress-dir", required=True)
    return p.parse_args(argv)


class Log:
    """Per-rank logs: steps (the harness's) and issued collectives (the truth's)."""

    def __init__(self, folder: Path, rank: int, world: int) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.folder, self.rank, self.world = folder, rank, world
        self.steps = open(folder / f"rank-{rank}.steps.jsonl", "a", buffering=1)  # noqa: SIM115
        self.colls = open(folder / f"rank-{rank}.colls.jsonl", "a", buffering=1)  # noqa: SIM115
        self.count: dict[str, int] = {}
        self.step = 0

    def issue(self, ranks: list[int]) -> None:
        key = ",".join(map(str, ranks))
        k = self.count.get(key, 0)
        self.count[key] = k + 1
        self.colls.write(json.dumps({"group": key, "k": k, "step": self.step, "t": time.time()}) + "\n")

    def stepped(self, t0: float, ms: float) -> None:
        t1 = time.time()
        self.steps.write(
            json.dumps({"step": self.step, "t0": t0, "dur_ms": (t1 - t0) * 1000, "straggle_ms": ms}) + "\n"
        )
        self.step += 1
        tmp = self.folder / f"rank-{self.rank}.json.tmp"
        tmp.write_text(
            json.dumps(
                {"rank": self.rank, "world_size": self.world, "pid": os.getpid(), "step": self.step, "t": t1}
            )
        )
        os.replace(tmp, self.folder / f"rank-{self.rank}.json")


def grads_all_reduce(params: list[torch.nn.Parameter], group: Any, ranks: list[int], log: Log) -> None:
    """One flat all-reduce of the gradients over the data-parallel group."""
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return
    flat = torch.cat([g.reshape(-1) for g in grads])
    log.issue(ranks)
    dist.all_reduce(flat, group=group)
    flat /= len(ranks)
    off = 0
    for g in grads:
        g.copy_(flat[off : off + g.numel()].view_as(g))
        off += g.numel()


class LoggedAllReduce(torch.autograd.Function):
    """Sum over the tensor-parallel group, forward and backward (the gradient of a sum of
    partial outputs is the same all-reduce), each issue logged for the truth."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Any, ranks: list[int], log: Log) -> torch.Tensor:
        ctx.group, ctx.ranks, ctx.log = group, ranks, log
        out = x.clone()
        log.issue(ranks)
        dist.all_reduce(out, group=group)
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None, None]:
        g = grad.contiguous().clone()
        ctx.log.issue(ctx.ranks)
        dist.all_reduce(g, group=ctx.group)
        return g, None, None, None


def tp_model(a: argparse.Namespace, tp: int) -> torch.nn.ModuleList:
    shard = a.width // tp
    return torch.nn.ModuleList(
        [
            torch.nn.ModuleDict(
                {"col": torch.nn.Linear(a.width, shard), "row": torch.nn.Linear(shard, a.width, bias=False)}
            )
            for _ in range(a.layers)
        ]
    )


def run_dp_tp(a: argparse.Namespace, log: Log, slow: set[int]) -> None:
    rank, world = dist.get_rank(), dist.get_world_size()
    tp = world // a.dp
    mesh = init_device_mesh("cpu", (a.dp, tp), mesh_dim_names=("dp", "tp"))
    tp_group, dp_group = mesh["tp"].get_group(), mesh["dp"].get_group()
    tp_ranks, dp_ranks = dist.get_process_group_ranks(tp_group), dist.get_process_group_ranks(dp_group)
    torch.manual_seed(0)
    model = tp_model(a, tp)
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    x, y = torch.randn(a.batch, a.width), torch.randn(a.batch, a.width)
    deadline = time.time() + a.max_seconds
    while time.time() < deadline:
        t0 = time.time()
        time.sleep(a.step_sleep_ms / 1000.0)
        opt.zero_grad(set_to_none=True)
        h = x
        for blk in model:
            part = blk["row"](torch.relu(blk["col"](h)))  # type: ignore[index]
            h = LoggedAllReduce.apply(part, tp_group, tp_ranks, log)
        loss = (h - y).pow(2).mean()
        ms = a.slow_ms if rank in slow else 0.0
        if ms:
            time.sleep(ms / 1000.0)
        loss.backward()
        grads_all_reduce(list(model.parameters()), dp_group, dp_ranks, log)
        opt.step()
        log.stepped(t0, ms)


def run_dp_pp(a: argparse.Namespace, log: Log, slow: set[int]) -> None:
    from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

    rank, world = dist.get_rank(), dist.get_world_size()
    pp = world // a.dp
    mesh = init_device_mesh("cpu", (a.dp, pp), mesh_dim_names=("dp", "pp"))
    pp_group, dp_group = mesh["pp"].get_group(), mesh["dp"].get_group()
    dp_ranks = dist.get_process_group_ranks(dp_group)
    stage_idx = mesh["pp"].get_local_rank()
    torch.manual_seed(stage_idx)
    n = round(a.layers * (a.heavy_factor if stage_idx == a.heavy_stage else 1.0))
    blocks: list[torch.nn.Module] = []
    for _ in range(n):
        blocks += [torch.nn.Linear(a.width, a.width), torch.nn.ReLU()]
    mod = torch.nn.Sequential(*blocks)
    stage = PipelineStage(mod, stage_idx, pp, torch.device("cpu"), group=pp_group)
    sched = ScheduleGPipe(stage, n_microbatches=4, loss_fn=lambda o, t: (o - t).pow(2).mean())
    opt = torch.optim.SGD(mod.parameters(), lr=1e-4)
    x, y = torch.randn(a.batch * 4, a.width), torch.randn(a.batch * 4, a.width)
    deadline = time.time() + a.max_seconds
    while time.time() < deadline:
        t0 = time.time()
        time.sleep(a.step_sleep_ms / 1000.0)
        opt.zero_grad(set_to_none=True)
        ms = a.slow_ms if rank in slow else 0.0
        if ms:
            time.sleep(ms / 1000.0)
        if stage_idx == 0:
            sched.step(x)
        elif stage_idx == pp - 1:
            sched.step(target=y, losses=[])
        else:
            sched.step()
        grads_all_reduce(list(mod.parameters()), dp_group, dp_ranks, log)
        opt.step()
        log.stepped(t0, ms)


def main(argv: list[str] | None = None) -> int:
    a = parse(argv)
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    log = Log(Path(a.progress_dir), dist.get_rank(), dist.get_world_size())
    slow = {int(r) for r in a.slow_ranks.split(",") if r.strip()}
    try:
        (run_dp_tp if a.layout == "dp_tp" else run_dp_pp)(a, log, slow)
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.exit(main())
