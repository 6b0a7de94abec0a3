"""Convert a job of the OSDI '25 straggler artifact (``../shared/traces/osdi25_whatif``) into
per-rank Kineto JSON traces, as a Megatron job traced with the PyTorch profiler would give them.

Why a converter in ``benchmarks/`` and not an importer in the product: the artifact's Parquet is
one row per operation of one *worker* (tensor-parallel peers merged), with Megatron's operation
names; users have Kineto traces. Converting lets the product's own loader, group matching, clock
alignment and verdict run unchanged on a real job of 64 ranks, which is what is being tested.

Per job ``X`` (``trace-X.parquet`` + ``meta-X.yaml``), for each global rank (a worker's rank plus
``0..f-1``, ``f = world_size / workers``: the peers the artifact merged, Megatron's layout: the
peers innermost) one ``rank-<r>.pt.trace.json`` with

* ``distributedInfo``: backend ``nccl``, rank, world size, and ``pg_config``: the groups the rank
  belongs to (name, description, ranks), as the PyTorch profiler writes it;
* ``ProfilerStep#N`` on the host thread, one per converted step, laid one after the other
  (the artifact's steps are samples, each starting at 0; ``N`` counts from ``--first-step``);
* every operation as a GPU event (stream per kind) at its own start and duration:
  compute (``forward-compute``, ``backward-compute``, ``optimizer``) as computation kernels;
  collectives as ``ncclDevKernel_*`` kernels whose args carry ``Collective name``, ``Process
  Group Name``/``Description``/``Ranks`` and ``Seq`` (per group, as c10d numbers them) of
  their group: gradient reduce-scatter and parameter all-gather on the data-parallel group (same
  stage and peer index), the embedding all-reduce on the embedding group (first and last stage
  of one replica), the layernorm all-reduce on the tensor-parallel group (the merged peers; left
  out when there are none), the gradient-norm all-reduce (``optimizer-clip-main-grad``) on the
  model-parallel group (every stage and peer of one replica);
* pipeline send/recv as ``ncclDevKernel_SendRecv`` kernels on the pipeline group (same replica
  and peer index, every stage), with a ``c10d::send`` / ``c10d::recv_`` host op at their post carrying
  the peer in its ``Concrete Inputs`` (its rank in the pipeline group), as the profiler records it with shapes.

Times: the artifact's seconds, as µs. All ranks share one clock (offsets 0 are the truth).
``STEPS.tsv`` maps each ``ProfilerStep#`` to the artifact's step (not a ``.json``: a folder of
traces is read whole).

    python benchmarks/osdi_to_kineto.py ../shared/traces/osdi25_whatif AR OUT --steps 11
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import polars as pl

COMPUTE = {"forward-compute", "backward-compute", "optimizer", "gc", "data-load", "backward-wgrad-compute"}
P2P = {"forward-send", "backward-send", "forward-recv", "backward-recv"}
# optype -> (collective, group kind, kernel name)
COLLECTIVES = {
    "grads-reduce-scatter": ("reduce_scatter", "dp", "ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL"),
    "params-all-gather": ("all_gather", "dp", "ncclDevKernel_AllGather_RING_LL"),
    "embedding-grads-all-reduce": ("allreduce", "embd", "ncclDevKernel_AllReduce_Sum_bf16_RING_LL"),
    "layernorm-grads-all-reduce": ("allreduce", "tp", "ncclDevKernel_AllReduce_Sum_bf16_RING_LL"),
    "optimizer-clip-main-grad": ("allreduce", "mp", "ncclDevKernel_AllReduce_Sum_f32_RING_LL"),
    "separate-grads-all-reduce": ("allreduce", "dp", "ncclDevKernel_AllReduce_Sum_bf16_RING_LL"),
}
STREAMS = {"compute": 7, "pp": 20, "dp": 24, "embd": 28, "tp": 32, "mp": 36}
US = 1e6  # artifact seconds -> trace µs
GAP_S = 0.001  # between converted steps
T0_US = 1_000_000.0


def read_meta(path: Path) -> dict[str, int]:
    """``meta-X.yaml``: ``key: value`` lines (the artifact's sizes)."""
    out: dict[str, int] = {}
    for line in path.read_text().splitlines():
        k, _, v = line.partition(":")
        v = v.strip()
        if v.lstrip("-").isdigit():
            out[k.strip()] = int(v)
    return out


def groups_of(workers: pl.DataFrame, f: int) -> dict[str, dict[int, tuple[int, ...]]]:
    """Group kind -> global rank -> the ranks of its group of that kind."""
    pp = int(workers["stage"].max()) + 1  # type: ignore[arg-type]
    by: dict[str, dict[int, tuple[int, ...]]] = defaultdict(dict)
    rows = workers.select("rank", "dp_rank", "stage").iter_rows()
    w = {(int(d), int(s)): int(r) for r, d, s in rows}
    dps = sorted({d for d, _ in w})
    for (d, s), r0 in w.items():
        for k in range(f):
            r = r0 + k
            by["tp"][r] = tuple(r0 + j for j in range(f))
            by["dp"][r] = tuple(sorted(w[(dd, s)] + k for dd in dps))
            by["pp"][r] = tuple(w[(d, ss)] + k for ss in range(pp))
            by["embd"][r] = tuple(sorted({w[(d, 0)] + k, w[(d, pp - 1)] + k}))
            by["mp"][r] = tuple(sorted(w[(d, ss)] + j for ss in range(pp) for j in range(f)))
    return by


def _names(by: dict[str, dict[int, tuple[int, ...]]]) -> dict[tuple[int, ...], str]:
    """One name per distinct group, every rank alike (c10d numbers groups in creation order)."""
    seen: dict[tuple[int, ...], str] = {}
    for kind in ("tp", "dp", "pp", "embd", "mp"):
        for g in sorted(set(by[kind].values())):
            seen.setdefault(g, str(len(seen) + 1))
    return seen


def _ev(
    name: str, cat: str, pid: int, tid: int, ts: float, dur: float, args: dict[str, Any]
) -> dict[str, Any]:
    return {
        "ph": "X",
        "cat": cat,
        "name": name,
        "pid": pid,
        "tid": tid,
        "ts": round(ts, 3),
        "dur": round(dur, 3),
        "args": args,
    }


def convert(src: Path, job: str, out: Path, steps: int | None, first_step: int = 1) -> list[Path]:
    """Write the job's rank traces under ``out``; returns their paths."""
    meta = read_meta(src / f"meta-{job}.yaml")
    df = pl.read_parquet(src / f"trace-{job}.parquet").with_columns(pl.col("optype").cast(pl.String))
    chosen = sorted(df["step"].unique().to_list())[: steps or None]
    df = df.filter(pl.col("step").is_in(chosen))
    workers = df.select("rank", "dp_rank", "stage").unique()
    world = int(meta.get("world_size", workers.height))
    if world % workers.height:
        raise SystemExit(
            f"{src}/meta-{job}.yaml: world_size {world} is not a multiple of {workers.height} workers"
        )
    f = world // workers.height
    by = groups_of(workers, f)
    names = _names(by)
    lens = df.group_by("step").agg((pl.col("start_ts") + pl.col("duration")).max().alias("len"))
    base: dict[int, float] = {}
    t = 0.0
    for s in chosen:
        base[s] = t
        t += float(lens.filter(pl.col("step") == s)["len"][0]) + GAP_S
    out.mkdir(parents=True, exist_ok=True)
    (out / "STEPS.tsv").write_text(
        "profiler_step\tartifact_step\n" + "".join(f"{first_step + k}\t{s}\n" for k, s in enumerate(chosen))
    )
    paths = []
    per_worker = df.sort("step", "start_ts").partition_by("rank", as_dict=True)
    for (r0,), ops in sorted(per_worker.items(), key=lambda kv: int(kv[0][0])):  # type: ignore[index]
        for k in range(f):
            r = int(r0) + k  # type: ignore[call-overload]
            p = out / f"rank-{r}.pt.trace.json"
            p.write_text(json.dumps(_rank_doc(r, world, ops, by, names, chosen, base, first_step)))
            paths.append(p)
    return paths


def _rank_doc(
    r: int,
    world: int,
    ops: pl.DataFrame,
    by: dict[str, dict[int, tuple[int, ...]]],
    names: dict[tuple[int, ...], str],
    chosen: list[int],
    base: dict[int, float],
    first_step: int,
) -> dict[str, Any]:
    host_pid, host_tid = 100 + r, 1
    events: list[dict[str, Any]] = []
    seq: dict[str, int] = defaultdict(int)
    mine = {kind: by[kind][r] for kind in by if r in by[kind]}
    for k, s in enumerate(chosen):
        b = T0_US + base[s] * US
        nxt = T0_US + (
            base[chosen[k + 1]] * US if k + 1 < len(chosen) else base[s] * US + _step_len(ops, s) * US
        )
        events.append(
            _ev(f"ProfilerStep#{first_step + k}", "user_annotation", host_pid, host_tid, b, nxt - b, {})
        )
    corr = 0
    for step, optype, start, dur in ops.select("step", "optype", "start_ts", "duration").iter_rows():
        if dur is None or dur <= 0:
            continue
        ts = T0_US + (base[step] + float(start)) * US
        d = float(dur) * US
        corr += 1
        if optype in COMPUTE:
            events.append(
                _ev(
                    optype,
                    "kernel",
                    0,
                    STREAMS["compute"],
                    ts,
                    d,
                    {"device": 0, "stream": STREAMS["compute"], "correlation": corr},
                )
            )
        elif optype in P2P:
            op = "send" if optype.endswith("send") else "recv"
            g = mine["pp"]
            if len(g) < 2:
                continue
            args = _pg_args(op, g, names, None)
            events.append(
                _ev(
                    "ncclDevKernel_SendRecv(ncclDevComm*, unsigned long, ncclWork*)",
                    "kernel",
                    0,
                    STREAMS["pp"],
                    ts,
                    d,
                    {"device": 0, "stream": STREAMS["pp"], "correlation": corr, **args},
                )
            )
            events.append(
                _ev(
                    "c10d::send" if op == "send" else "c10d::recv_",
                    "cpu_op",
                    host_pid,
                    host_tid,
                    ts,
                    min(d, 5.0),
                    _p2p_inputs(optype, r, g),
                )
            )
        elif optype in COLLECTIVES:
            coll, kind, kernel = COLLECTIVES[optype]
            g = mine[kind]
            if len(g) < 2:
                continue
            name = names[g]
            seq[name] += 1
            args = _pg_args(coll, g, names, seq[name])
            events.append(
                _ev(
                    f"{kernel}(ncclDevComm*, unsigned long, ncclWork*)",
                    "kernel",
                    0,
                    STREAMS[kind],
                    ts,
                    d,
                    {"device": 0, "stream": STREAMS[kind], "correlation": corr, **args},
                )
            )
    groups = sorted({g for g in mine.values() if len(g) > 1}, key=lambda g: int(names[g]))
    kind_of = {g: kind for kind, g in mine.items()}
    return {
        "schemaVersion": 1,
        "distributedInfo": {
            "backend": "nccl",
            "rank": r,
            "world_size": world,
            "pg_count": len(names) + 1,
            "pg_config": [
                {
                    "pg_name": "0",
                    "pg_desc": "default_pg",
                    "backend_config": "cuda:nccl",
                    "pg_size": world,
                    "ranks": list(range(world)),
                }
            ]
            + [
                {
                    "pg_name": names[g],
                    "pg_desc": kind_of[g],
                    "backend_config": "cuda:nccl",
                    "pg_size": len(g),
                    "ranks": list(g),
                }
                for g in groups
            ],
        },
        "deviceProperties": [
            {"id": 0, "name": "NVIDIA A100-SXM4-80GB", "computeMajor": 8, "computeMinor": 0, "numSms": 108}
        ],
        "traceEvents": events
        + [
            {"ph": "M", "name": "process_name", "pid": host_pid, "args": {"name": f"rank {r}"}},
            {"ph": "M", "name": "process_name", "pid": 0, "args": {"name": "GPU 0"}},
        ],
    }


def _p2p_inputs(optype: str, r: int, g: tuple[int, ...]) -> dict[str, Any]:
    """The issuing op's ``Concrete Inputs`` as the profiler records them with shapes (tensors,
    group, peer, tag): the peer as its rank in the pipeline group (c10d: sorted order). Forward
    transfers go to the next stage, backward ones to the previous."""
    at = g.index(r) + (1 if optype in ("forward-send", "backward-recv") else -1)
    if not 0 <= at < len(g):
        return {}
    return {"Concrete Inputs": ["", "", str(sorted(g).index(g[at])), "0"]}


def _step_len(ops: pl.DataFrame, s: int) -> float:
    sub = ops.filter(pl.col("step") == s)
    return float(sub.select((pl.col("start_ts") + pl.col("duration")).max()).item() or 0.0)


def _pg_args(
    coll: str, g: tuple[int, ...], names: dict[tuple[int, ...], str], seq: int | None
) -> dict[str, Any]:
    args: dict[str, Any] = {
        "Collective name": coll,
        "Process Group Name": names[g],
        "Process Group Description": "",
        "Process Group Ranks": "[" + ", ".join(map(str, g)) + "]",
        "Group size": len(g),
        "In msg nelems": 1,
    }
    if seq is not None:
        args["Seq"] = seq
    return args


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("src", type=Path, help="the artifact folder (trace-X.parquet, meta-X.yaml)")
    ap.add_argument("job", help="AR, ST or SE")
    ap.add_argument("out", type=Path)
    ap.add_argument("--steps", type=int, default=11, help="the job's first N sampled steps (0: all)")
    ap.add_argument("--first-step", type=int, default=1, help="ProfilerStep number of the first step")
    a = ap.parse_args(argv)
    for need in (a.src / f"trace-{a.job}.parquet", a.src / f"meta-{a.job}.yaml"):
        if not need.is_file():
            print(f"error: {need}: not found", file=sys.stderr)
            return 2
    paths = convert(a.src, a.job, a.out, a.steps or None, a.first_step)
    print(f"{len(paths)} rank traces in {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
