"""A real pipeline-parallel training job (``torch.distributed.pipelining``, gloo, CPU) that
profiles itself: one stage per rank, GPipe or 1F1B, balanced stages or one stage with more
layers. Run under torchrun::

    torchrun --nproc-per-node 3 pipeline_job.py OUT --schedule 1f1b --microbatches 6 \
        --heavy-stage 1 --heavy-factor 2

Each rank writes ``OUT/rank-<r>.pt.trace.json`` (ProfilerStep#N steps, the schedule's
``Forward i``/``Backward i`` annotations when it records them, gloo send/recv). Every stage has
``--layers`` Linear+ReLU blocks of width ``--width``; the heavy stage has ``heavy_factor`` times
as many, so its compute per micro-batch is that many times a balanced stage's.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.profiler import ProfilerActivity, profile, schedule

SCHEDULES = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("out", type=Path)
    p.add_argument("--schedule", choices=sorted(SCHEDULES), default="gpipe")
    p.add_argument("--microbatches", type=int, default=4)
    p.add_argument("--batch", type=int, default=64, help="rows per micro-batch")
    p.add_argument("--width", type=int, default=256)
    p.add_argument("--layers", type=int, default=4, help="Linear+ReLU blocks per balanced stage")
    p.add_argument("--heavy-stage", type=int, default=-1, help="stage with more layers (-1: none)")
    p.add_argument("--heavy-factor", type=float, default=1.0)
    p.add_argument("--steps", type=int, default=6, help="profiled steps (after 2 unprofiled)")
    p.add_argument(
        "--dp",
        type=int,
        default=1,
        help="pipeline replicas: rank r is stage r % (world/dp) of replica r // (world/dp), stages wrapped in DDP across replicas",
    )
    return p.parse_args()


def stage_module(n_layers: int, width: int) -> torch.nn.Module:
    blocks: list[torch.nn.Module] = []
    for _ in range(n_layers):
        blocks += [torch.nn.Linear(width, width), torch.nn.ReLU()]
    return torch.nn.Sequential(*blocks)


def main() -> None:
    a = parse()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    pp = world // a.dp
    stage_idx, replica = rank % pp, rank // pp
    torch.manual_seed(stage_idx)
    n = round(a.layers * (a.heavy_factor if stage_idx == a.heavy_stage else 1.0))
    mod: torch.nn.Module = stage_module(n, a.width)
    pp_group = None
    if a.dp > 1:  # every rank creates every group, in the same order
        pp_groups = [dist.new_group(list(range(d * pp, (d + 1) * pp))) for d in range(a.dp)]
        dp_groups = [dist.new_group(list(range(s, world, pp))) for s in range(pp)]
        pp_group = pp_groups[replica]
        mod = DDP(mod, process_group=dp_groups[stage_idx])
    stage = PipelineStage(mod, stage_idx, pp, torch.device("cpu"), group=pp_group)
    sched = SCHEDULES[a.schedule](
        stage, n_microbatches=a.microbatches, loss_fn=lambda o, t: (o - t).pow(2).mean()
    )
    opt = torch.optim.SGD(mod.parameters(), lr=1e-4)
    x = torch.randn(a.batch * a.microbatches, a.width)
    y = torch.randn(a.batch * a.microbatches, a.width)

    def one_step() -> None:
        opt.zero_grad()
        if stage_idx == 0:
            sched.step(x)
        elif stage_idx == pp - 1:
            sched.step(target=y, losses=[])
        else:
            sched.step()
        opt.step()

    a.out.mkdir(parents=True, exist_ok=True)
    path = str(a.out / f"rank-{rank}.pt.trace.json")
    with profile(
        activities=[ProfilerActivity.CPU],
        schedule=schedule(wait=0, warmup=2, active=a.steps, repeat=1),
        on_trace_ready=lambda p: p.export_chrome_trace(path),
    ) as prof:
        for _ in range(2 + a.steps):
            one_step()
            prof.step()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
