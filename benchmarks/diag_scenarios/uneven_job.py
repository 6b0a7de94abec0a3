"""A real DDP job (gloo, CPU) whose ranks get different numbers of batches, profiling itself.

    torchrun --nproc-per-node 3 uneven_job.py OUT --batches 6 --short-rank 1 --short-by 3 [--join]

Every rank trains on ``--batches`` batches except ``--short-rank``, which gets ``--short-by``
fewer (its shard ran out: no DistributedSampler padding). ``--input-ms`` sleeps before each
batch (its input loading): steps long against the host's scheduling delays, so a loaded host
does not start the ranks' windows further apart than a step. With ``--join`` the loop runs under
``torch.distributed.algorithms.Join([ddp])``: the short rank shadows the others' gradient
all-reduces until all are done. Without it the others block in an all-reduce the short rank
never joins, until the process group's ``--timeout-s`` expires (the job would hang; here each
rank catches the error so that its trace is still written). Each rank writes
``OUT/rank-<r>.pt.trace.json``; ``OUT/rank-<r>.steps`` holds how many steps it ran.
"""

from __future__ import annotations

import argparse
import datetime
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.algorithms.join import Join
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.profiler import ProfilerActivity, profile


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("out", type=Path)
    p.add_argument("--batches", type=int, default=6)
    p.add_argument("--short-rank", type=int, default=1)
    p.add_argument("--short-by", type=int, default=3)
    p.add_argument("--join", action="store_true")
    p.add_argument("--timeout-s", type=float, default=8.0)
    p.add_argument("--record-shapes", action="store_true", help="record message sizes (record_param_comms)")
    p.add_argument(
        "--input-ms", type=float, default=0.0, help="sleep this long before each batch (its input loading)"
    )
    return p.parse_args()


def main() -> None:
    a = parse()
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=a.timeout_s))
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 256)))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    n = a.batches - (a.short_by if rank == a.short_rank else 0)
    data = [torch.randn(64, 256) for _ in range(n)]
    done = 0
    a.out.mkdir(parents=True, exist_ok=True)
    dist.barrier()  # the ranks' trace windows start together, as a daemon's trigger starts them
    with profile(activities=[ProfilerActivity.CPU], record_shapes=a.record_shapes) as prof:
        try:
            with Join([model], enable=a.join):
                for x in data:
                    time.sleep(a.input_ms / 1e3)
                    opt.zero_grad()
                    model(x).pow(2).mean().backward()
                    opt.step()
                    done += 1
        except RuntimeError as exc:  # without Join: the all-reduce the short rank never joins times out
            print(f"rank {rank}: {type(exc).__name__} after {done} steps: {str(exc)[:120]}", flush=True)
    prof.export_chrome_trace(str(a.out / f"rank-{rank}.pt.trace.json"))
    (a.out / f"rank-{rank}.steps").write_text(str(done))
    if a.join:
        dist.barrier()
        dist.destroy_process_group()
    else:
        time.sleep(a.timeout_s + 2.0)  # as a real job would: stay up while the others wait


if __name__ == "__main__":
    main()
