"""A real NCCL Flight Recorder JSON dump on a machine with one CUDA GPU, read by kscope's reader.

World size 1 (one GPU allows one NCCL rank): a few all-reduces and a broadcast on the GPU with
``TORCH_NCCL_TRACE_BUFFER_SIZE`` set, then the rank dumps its Flight Recorder in the JSON form
(``_dump_nccl_trace_json``, else ``_dump_fr_trace_json``) to ``<out>/nccl_trace_rank_0.json``
and ``kinetoscope.diagnosis.flight_recorder`` reads it back: the fields it relies on are
present in a real NCCL dump, and a finished job reads as "every rank reached the same last
collective". Prints one JSON line with what it found; exits non-zero when something is missing.

    python benchmarks/device/fr_nccl.py [OUT_DIR]     (default: $OUT, else ./fr-nccl-out)
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

os.environ.setdefault("TORCH_NCCL_TRACE_BUFFER_SIZE", "2000")
os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
os.environ.setdefault("MASTER_PORT", "29561")
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402


def main() -> int:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else os.environ.get("OUT") or "fr-nccl-out")
    out.mkdir(parents=True, exist_ok=True)
    if not torch.cuda.is_available():
        print(json.dumps({"ok": False, "why": "no CUDA device"}))
        return 2
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", rank=0, world_size=1, device_id=torch.device("cuda:0"))
    t = torch.ones(1 << 20, device="cuda")
    for _ in range(5):
        dist.all_reduce(t)
    dist.broadcast(t, src=0)
    torch.cuda.synchronize()
    import torch._C._distributed_c10d as c10d

    dump_fn = getattr(c10d, "_dump_nccl_trace_json", None) or c10d._dump_fr_trace_json
    raw = dump_fn(True, False)  # includeCollectives, onlyActive (JSON; never the pickle form)
    path = out / "nccl_trace_rank_0.json"
    path.write_bytes(raw if isinstance(raw, bytes) else str(raw).encode())
    dist.destroy_process_group()

    from kinetoscope.diagnosis.flight_recorder import analyse

    doc = json.loads(path.read_bytes())
    entries = doc.get("entries") or []
    report = analyse([path])
    needed = {"collective_seq_id", "profiling_name", "process_group", "state", "is_p2p"}
    missing = sorted(needed - set(entries[-1])) if entries else sorted(needed)
    result = {
        "ok": bool(entries) and not missing and report.culprits == [],
        "torch": torch.__version__,
        "dump_function": dump_fn.__name__,
        "file": str(path),
        "version": doc.get("version"),
        "entries": len(entries),
        "names": sorted({str(e.get("profiling_name")) for e in entries}),
        "states": sorted({str(e.get("state")) for e in entries}),
        "missing_fields": missing,
        "reader_verdict": report.verdict,
    }
    print(json.dumps(result))
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
