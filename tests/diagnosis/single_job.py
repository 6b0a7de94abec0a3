"""A single-process training loop (no torch.distributed, no rank anywhere), profiled to one trace.

A small MLP trained for ``STEPS`` optimizer steps on batches from a DataLoader whose dataset
sleeps ``LOAD_MS`` per batch (emulated I/O: the job is input-bound by construction). Profiled
with ``torch.profiler`` CPU activity around the loop without ``prof.step()`` (only the
``Optimizer.step#SGD.step`` annotations mark steps, as in on-demand traces) and written to
``OUT/train.pt.trace.json``: a file name with no rank in it.

``--serve SECONDS``: no profiler code at all; train until SECONDS have passed (or ``OUT/stop``
exists), printing ``STEP n`` per step: to be traced on demand through a daemon.
"""

from __future__ import annotations

import os
import sys
import time

STEPS = 8
LOAD_MS = 15.0


def main(out: str, serve_s: float = 0.0) -> int:
    import torch
    from torch.profiler import ProfilerActivity, profile

    torch.set_num_threads(1)
    torch.manual_seed(0)

    class Slow(torch.utils.data.Dataset):  # type: ignore[type-arg]
        def __len__(self) -> int:
            return 64 * STEPS

        def __getitem__(self, i: int):  # type: ignore[no-untyped-def]
            if i % 16 == 0:
                time.sleep(LOAD_MS / 1000.0)  # one sleep per batch of 16
            return torch.randn(64), int(i % 10)

    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    it = iter(torch.utils.data.DataLoader(Slow(), batch_size=16))

    def step() -> None:
        nonlocal it
        try:
            x, y = next(it)
        except StopIteration:
            it = iter(torch.utils.data.DataLoader(Slow(), batch_size=16))
            x, y = next(it)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()

    if serve_s > 0:
        deadline, n = time.monotonic() + serve_s, 0
        while time.monotonic() < deadline and not os.path.exists(os.path.join(out, "stop")):
            step()
            n += 1
            print(f"STEP {n}", flush=True)
        return 0
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(STEPS):
            x, y = next(it)
            loss = torch.nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
    os.makedirs(out, exist_ok=True)
    prof.export_chrome_trace(os.path.join(out, "train.pt.trace.json"))
    return 0


if __name__ == "__main__":
    serve = float(sys.argv[3]) if len(sys.argv) > 3 and sys.argv[2] == "--serve" else 0.0
    sys.exit(main(sys.argv[1], serve))
