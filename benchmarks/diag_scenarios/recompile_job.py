"""A real torch.compile'd CPU training loop fed a few distinct batch shapes, profiling itself.

    python recompile_job.py OUT --backend inductor --shapes 8,8,16,16,24,8,24 [--static]

Writes ``OUT/train.pt.trace.json`` (steps delimited by ``Optimizer.step``) and ``OUT/truth.json``:
the iterations at which ``torch._dynamo.utils.counters["frames"]["total"]`` (compilations in
this process) grew, and the final counters. ``--static`` compiles with ``dynamic=False``: every
new shape recompiles; without it, Dynamo's automatic dynamic shapes recompile once, on the
first shape change, into a shape-generic graph. ``--mark-dynamic`` marks dim 0 dynamic up front.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from torch._dynamo.utils import counters
from torch.profiler import ProfilerActivity, profile


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("out", type=Path)
    p.add_argument("--backend", default="inductor")
    p.add_argument("--shapes", default="8,8,16,16,24,8,24")
    p.add_argument("--static", action="store_true")
    p.add_argument("--mark-dynamic", action="store_true")
    return p.parse_args()


def main() -> None:
    a = parse()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 32))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    compiled = torch.compile(model, backend=a.backend, dynamic=False if a.static else None)
    shapes = [int(s) for s in a.shapes.split(",")]
    compiled_at: list[int] = []
    a.out.mkdir(parents=True, exist_ok=True)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for i, b in enumerate(shapes):
            before = counters["frames"]["total"]
            x = torch.randn(b, 32)
            if a.mark_dynamic:
                torch._dynamo.mark_dynamic(x, 0)
            opt.zero_grad()
            compiled(x).pow(2).mean().backward()
            opt.step()
            if counters["frames"]["total"] > before:
                compiled_at.append(i)
    prof.export_chrome_trace(str(a.out / "train.pt.trace.json"))
    truth = {
        "shapes": shapes,
        "compiled_at_iterations": compiled_at,
        "frames_total": counters["frames"]["total"],
        "unique_graphs": counters["stats"]["unique_graphs"],
        "backend": a.backend,
    }
    (a.out / "truth.json").write_text(json.dumps(truth))
    print(json.dumps(truth))


if __name__ == "__main__":
    main()
