"""Collective instances of one rank: what each rank did at each collective, and when.

A *collective instance* is one execution of one collective by one rank, with

* ``arrival`` (ns, the rank's own clock): when this rank was ready to exchange data, i.e. when it
  started the collective; the last rank to arrive decides when everyone can finish;
* ``end`` (ns): when the collective finished on this rank. Ranks finish a collective together
  (within transfer jitter), which is what clock alignment uses.

Signals, in order of preference (the first that a trace has wins, per rank):

``kernel``
    GPU traces: communication device events (``kernel_types.COMMUNICATION``: ``ncclKernel_*``,
    ``ncclDevKernel_*``, RCCL ``Generic_*``, ...). The kernel starts when the stream reaches it
    (this rank's data is ready) and spins until every peer has joined, so its start is the
    arrival and its end is the common completion. Kernel args carry ``Collective name``,
    ``Process Group Name`` and sometimes ``Seq`` (newer PyTorch); when absent the collective
    type comes from the kernel name (``ncclDevKernel_AllReduce_...`` -> ``allreduce``).
``backend_annotation``
    CPU traces (gloo, also MPI/UCC): ``user_annotation`` events named ``gloo:<collective>``
    (``mpi:``, ``ucc:``). ProcessGroupGloo records them on its ``pt_gloo_runloop`` worker
    thread *while executing* the work: the annotation starts when the worker picks up the work
    (after the training thread's ``c10d::allreduce_`` enqueued it) and ends when the exchange
    with every peer has completed: end = completion, like an NCCL kernel. Arrival = the start of
    the ``c10d::<collective>_`` op that issued it (paired in FIFO order, ``_with_issue_times``):
    the pick-up lags the issue by up to tens of ms on a busy host, and waits for both workers
    when they are still busy with earlier buckets. (On NCCL traces, ``nccl:<collective>``
    annotations are only the host-side enqueue and are *not* used when kernels are present.)
``host_op``
    Last resort: host ops ``c10d::<collective>_`` / ``record_param_comms`` / ``nccl:*`` with no
    kernels and no backend annotation. Their start is the issue time (a usable arrival); their
    end is the enqueue, not the completion, so clock alignment on them is weak (reported).

Not used as collective signals: ``DistributedDataParallel.forward`` (a phase, not a
collective), autograd hooks, ``torch.distributed.ddp.reducer::*`` (bucket copies, compute).
"""

from __future__ import annotations

import math
import re

import numpy as np
import orjson
import polars as pl

from kinetoscope.analysis.kernel_types import COMMUNICATION_PATTERN
from kinetoscope.trace.model import Trace
from kinetoscope.trace.schema import DEVICE_KINDS

BACKEND_ANNOTATION_PATTERN = r"^(?:gloo|mpi|ucc):"
HOST_OP_PATTERN = r"^(?:c10d::|record_param_comms$|nccl:)"
# Host ops that are collectives' waits or bookkeeping, not collectives.
_HOST_NON_COLLECTIVE = r"(?i)wait|barrier_?$|coalesc|monitored"
# A thread that waited for a collective resumes as it ends: its next event starts within a
# window around the end (the worker's annotation may close a little after it signalled
# completion; a woken thread may wait for a core, the longer the busier the host). The window:
# 2 ms, or a quarter of the wait when longer. Measured on the 2-core box beside two CPU burners:
# 311-314 of 320 synchronous all-reduces of a real gloo job resumed within 2 ms, the rest within
# 2.1-20 ms, several of them after waits of 35-75 ms (a resume later than the window reads as
# the rank's own time: the host held it).
_RESUME_BEFORE_NS = 50_000
_RESUME_WITHIN_NS = 2_000_000
_RESUME_WITHIN_SHARE = 0.25

COLLECTIVES_SCHEMA: dict[str, pl.DataType] = {
    "rank": pl.Int64(),
    "ordinal": pl.Int64(),  # position of this instance among the rank's instances of `coll` (time order)
    "coll": pl.String(),  # normalised collective type: allreduce, allgather, reducescatter, ...
    "pg": pl.String(),  # process group name when recorded, else the stream it ran on, else "default"
    "pg_ranks": pl.String(),  # the group's member ranks ("0,4,8,12") when recorded (event or distributedInfo)
    "lane": pl.String(),  # where it ran on this rank: "stream 7" (kernels), "tid 8728" (gloo worker), "host"
    "seq": pl.Int64(),  # NCCL/c10d sequence number when recorded
    "arrival": pl.Int64(),  # ns, the rank's own clock
    "end": pl.Int64(),  # ns, the rank's own clock
    "nelems": pl.Int64(),
    "signal": pl.String(),  # kernel | backend_annotation | host_op
    "name": pl.String(),
    # the issuing thread waited for it (``_with_issue_times``): a synchronous backend call
    "waited": pl.Boolean(),
}

_KERNEL_FAMILY = re.compile(r"(?:ncclDevKernel|ncclKernel|rcclKernel)_([A-Za-z]+)")

_CANON = {
    "allreduce": "allreduce",
    "allreducecoalesced": "allreduce",
    "allgather": "allgather",
    "allgatherbase": "allgather",
    "allgatherintotensor": "allgather",
    "allgathercoalesced": "allgather",
    "allgatherintotensorcoalesced": "allgather",
    "reducescatter": "reducescatter",
    "reducescatterbase": "reducescatter",
    "reducescattertensor": "reducescatter",
    "reducescattertensorcoalesced": "reducescatter",
    "alltoall": "alltoall",
    "alltoallbase": "alltoall",
    "alltoallv": "alltoall",
    "broadcast": "broadcast",
    "barrier": "barrier",
    "reduce": "reduce",
    "gather": "gather",
    "scatter": "scatter",
    "send": "sendrecv",
    "recv": "sendrecv",
    "sendrecv": "sendrecv",
    "recvanysource": "sendrecv",
}


def normalize_collective(name: str | None) -> str:
    """``c10d::allreduce_`` / ``gloo:all_reduce`` / ``nccl:_all_gather_base`` /
    ``ncclDevKernel_AllReduce_Sum_f32_RING_LL`` / ``AllGather`` -> ``allreduce`` / ``allgather``.
    Unknown names come back lower-cased without separators."""
    if not name:
        return "unknown"
    m = _KERNEL_FAMILY.search(name)
    if m:
        base = m.group(1)
    else:
        base = name.split("(")[0]
        base = re.sub(r"^.*?::", "", base)
        base = re.sub(r"^[a-z]+:", "", base)
    key = re.sub(r"[^a-z]", "", base.lower())
    if key in _CANON:
        return _CANON[key]
    for suffix in ("base", "coalesced", "tensor", "intotensor"):
        if key.endswith(suffix) and key[: -len(suffix)] in _CANON:
            return _CANON[key[: -len(suffix)]]
    return key or "unknown"


def _finish(df: pl.DataFrame, rank: int | None, signal: str) -> pl.DataFrame:
    df = df.with_columns(
        pl.lit(rank, dtype=pl.Int64).alias("rank"),
        pl.lit(signal).alias("signal"),
        pl.col("name").map_elements(normalize_collective, return_dtype=pl.String).alias("_from_name"),
    )
    coll = pl.coalesce(
        pl.col("collective_name").map_elements(normalize_collective, return_dtype=pl.String),
        pl.col("_from_name"),
    )
    df = df.with_columns(coll=coll).sort("arrival", "end")
    df = df.with_columns(ordinal=pl.int_range(pl.len(), dtype=pl.Int64).over("coll"))
    return df.select(list(COLLECTIVES_SCHEMA)).cast(COLLECTIVES_SCHEMA)  # type: ignore[arg-type]


def _with_launch_collective(trace: Trace, dev: pl.DataFrame, df: pl.DataFrame) -> pl.DataFrame:
    """Fill a missing ``collective_name`` of communication kernels from the host op that launched
    them: the innermost ``nccl:*`` / ``record_param_comms`` / ``c10d::*`` op enclosing the launch
    call (same thread). Needed where kernel names say nothing useful (e.g. every collective of a
    job shows as ``ncclKernel_SendRecv``)."""
    if df["collective_name"].null_count() == 0:
        return df
    ev = trace.events
    launches = ev.filter(
        pl.col("kind").is_in(["cuda_runtime", "cuda_driver"]) & pl.col("correlation").is_not_null()
    )
    host = ev.filter(
        pl.col("kind").is_in(["cpu_op", "user_annotation"])
        & pl.col("name").str.contains(HOST_OP_PATTERN)
        & ~pl.col("name").str.contains(_HOST_NON_COLLECTIVE)
    )
    if launches.is_empty() or host.is_empty():
        return df
    host = host.select(
        "tid",
        pl.col("ts").alias("_hts"),
        (pl.col("ts") + pl.col("dur")).alias("_hend"),
        pl.coalesce(pl.col("collective_name"), pl.col("name")).alias("_hname"),
    ).sort("_hts")
    link = (
        dev.select("correlation")
        .with_row_index("_row")
        .join(
            launches.select("correlation", "tid", pl.col("ts").alias("_hts")).unique("correlation"),
            on="correlation",
            how="left",
        )
        .filter(pl.col("_hts").is_not_null())
        .sort("_hts")
        .join_asof(host, on="_hts", by="tid", strategy="backward", check_sortedness=False)
        .filter(pl.col("_hend") >= pl.col("_hts"))
        .select("_row", "_hname")
    )
    out = df.with_row_index("_row").join(link, on="_row", how="left").sort("_row")
    return out.with_columns(collective_name=pl.coalesce(pl.col("collective_name"), pl.col("_hname"))).drop(
        "_row", "_hname"
    )


def _worker_tids(ev: pl.DataFrame, ann: pl.DataFrame) -> pl.Series:
    """The backend's worker threads: those recording its annotations but issuing no ``c10d::``
    op. ProcessGroupGloo runs a queued collective on a ``pt_gloo_runloop`` worker, but a
    point-to-point send or receive inline on the thread that called it, whose ``gloo:send`` /
    ``gloo:recv`` annotations then sit on the training thread; that thread issues the
    collectives too, and is not a worker (a pipeline's all-reduce is issued, and waited for,
    there)."""
    issuing = ev.filter((pl.col("kind") == "cpu_op") & pl.col("name").str.starts_with("c10d::"))["tid"]
    return ann.filter(~pl.col("tid").is_in(issuing.unique().implode()))["tid"].unique()


def _with_issue_times(ev: pl.DataFrame, df: pl.DataFrame, worker_tids: pl.Series) -> pl.DataFrame:
    """Backend annotations (gloo): arrival = when the rank *issued* the collective.

    The ``gloo:*`` annotation starts when a ``pt_gloo_runloop`` worker thread picks the work up,
    which on a busy host is up to tens of ms after the training thread enqueued it (measured on
    the 2-core test box: median 0.1-0.5 ms, 90th percentile 1-10 ms, max 18 ms, while every
    peer's data was long ready), and when both workers are still busy with earlier buckets
    (waiting for a late peer) the pick-up waits for them. The issue time, the start of the
    ``c10d::<collective>_`` op on the rank's own thread, is when the rank was ready. ProcessGroupGloo
    runs its work queue in FIFO order, so the k-th annotation of a type belongs to the k-th issue
    op of that type: pairs are made in order, an annotation only with an op that started before
    it (an annotation whose op is before the trace window keeps its own start). When the window
    holds the whole queue (as many ops as annotations, each annotation after its op) the pairs are
    exact, however long the pick-ups waited: with several buckets per step and two workers, the
    ranks that wait for a late peer pick most buckets up late, and their annotation starts would
    make them look as late as the straggler (docs/diagnosis-method.md §2). Otherwise, if the pairing does not look like a queue (op and
    annotation counts far apart, or a median delay beyond both 5 ms and a quarter of the median
    spacing of the annotations), the annotation starts are kept.
    """
    ops = ev.filter(
        (pl.col("kind") == "cpu_op")
        & pl.col("name").str.starts_with("c10d::")
        & ~pl.col("name").str.contains(_HOST_NON_COLLECTIVE)
        & ~pl.col("tid").is_in(worker_tids.implode())
    )
    if ops.is_empty():
        return df
    ops = _with_next_start(ev, ops, worker_tids).select(
        pl.col("name").map_elements(normalize_collective, return_dtype=pl.String).alias("_c"),
        "ts",
        "_ret",
        "_next",
    )
    df = df.with_row_index("_row").with_columns(
        pl.coalesce(
            pl.col("collective_name").map_elements(normalize_collective, return_dtype=pl.String),
            pl.col("name").map_elements(normalize_collective, return_dtype=pl.String),
        ).alias("_c")
    )
    rows, issued, waited = [], [], []
    for coll in df["_c"].unique().to_list():
        a = df.filter(pl.col("_c") == coll).sort("arrival")
        own = ops.filter(pl.col("_c") == coll).sort("ts")
        o, ret, nxt = own["ts"].to_numpy(), own["_ret"].to_numpy(), own["_next"].to_numpy()
        at, end = a["arrival"].to_numpy(), a["end"].to_numpy()
        if o.size == 0 or abs(o.size - at.size) > max(2, at.size // 10):
            continue
        # The same count of ops and annotations, each annotation after its op: the queue is
        # whole in the window, so the k-th pair is exact however long the pick-up waited.
        whole = o.size == at.size and bool(np.all(o <= at))
        out = at.copy()
        blocked = np.zeros(at.size, dtype=bool)
        i = 0
        for k in range(at.size):
            if i < o.size and o[i] <= at[k]:
                out[k] = o[i]
                blocked[k] = _resumed_at_end(ret[i], end[k], nxt[i])
                i += 1
        delay = at - out
        spacing = float(np.median(np.diff(at))) if at.size > 2 else float("inf")
        med = float(np.median(delay))
        if not whole and med > 5_000_000 and med > spacing / 4:
            continue
        rows += a["_row"].to_list()
        issued += out.tolist()
        waited += blocked.tolist()
    if not rows:
        return df.drop("_row", "_c")
    fix = pl.DataFrame(
        {"_row": rows, "_issue": issued, "_waited": waited},
        schema={"_row": pl.UInt32, "_issue": pl.Int64, "_waited": pl.Boolean},
    )
    return (
        df.join(fix, on="_row", how="left")
        .with_columns(
            arrival=pl.coalesce(pl.col("_issue"), pl.col("arrival")),
            waited=pl.col("_waited").fill_null(False),
        )
        .sort("_row")
        .drop("_row", "_c", "_issue", "_waited")
    )


def _resumed_at_end(ret: float, end: float, nxt: float) -> bool:
    """The issuing thread, back from the issue at ``ret``, next started something at ``nxt``,
    as the collective ended at ``end`` (``_RESUME_*``): it waited for it. (NaN ``nxt``, nothing
    more in the window: false.)"""
    window = max(_RESUME_WITHIN_NS, _RESUME_WITHIN_SHARE * (end - ret))
    return bool(-_RESUME_BEFORE_NS <= nxt - end <= window)


def _with_next_start(ev: pl.DataFrame, ops: pl.DataFrame, worker_tids: pl.Series) -> pl.DataFrame:
    """``ops`` with ``_next``: when their thread next started anything after the op returned
    (null: nothing more in the window). A thread that records nothing until the collective has
    ended, and resumes as it ends, waited for it (``dist.all_reduce`` without ``async_op``, a
    DDP step's last bucket): the time in between is a wait, not the rank's own work
    (``whatif.kineto``, asynchronous visits). Resuming as it ends is what tells a wait from a
    thread busy with work the trace does not record (Python, a sleep, a filtered trace)."""
    starts = (
        ev.filter(
            pl.col("tid").is_in(ops["tid"].unique().implode()) & ~pl.col("tid").is_in(worker_tids.implode())
        )
        .select("tid", pl.col("ts").alias("_next"))
        .sort("_next")
    )
    return (
        ops.with_columns(_ret=pl.col("ts") + pl.col("dur"))
        .sort("_ret")
        .join_asof(
            starts, left_on="_ret", right_on="_next", by="tid", strategy="forward", check_sortedness=False
        )  # both sorted above
    )


def _instances(events: pl.DataFrame, default_pg: pl.Expr, lane: pl.Expr) -> pl.DataFrame:
    """One row per collective event: its names, process group (``default_pg`` when the event
    names none) and member ranks when recorded, the lane it ran on, sequence number, arrival
    (start), end and message size."""
    return events.select(
        "name",
        "collective_name",
        pl.coalesce(pl.col("pg_name"), default_pg).alias("pg"),
        pl.col("pg_ranks").map_elements(canonical_ranks, return_dtype=pl.String).alias("pg_ranks"),
        lane.alias("lane"),
        "seq",
        pl.col("ts").alias("arrival"),
        (pl.col("ts") + pl.col("dur")).alias("end"),
        pl.col("in_msg_nelems").alias("nelems"),
        pl.lit(False).alias("waited"),
    )


def extract_collectives(trace: Trace) -> pl.DataFrame:
    """All collective instances of one rank (schema ``COLLECTIVES_SCHEMA``), sorted by arrival."""
    ev = trace.events
    rank = trace.meta.rank
    if ev.is_empty():
        return pl.DataFrame(schema=COLLECTIVES_SCHEMA)
    dev = ev.filter(
        pl.col("kind").is_in(list(DEVICE_KINDS)) & pl.col("name").str.contains(COMMUNICATION_PATTERN)
    )
    if dev.height:
        df = _instances(
            dev, pl.format("stream {}", pl.col("stream")), pl.format("stream {}", pl.col("stream"))
        )
        df = _with_launch_collective(trace, dev, df)
        return _with_config_ranks(trace, _finish(df, rank, "kernel"))
    ann = ev.filter(
        (pl.col("kind") == "user_annotation") & pl.col("name").str.contains(BACKEND_ANNOTATION_PATTERN)
    )
    if ann.height:
        df = _instances(ann, pl.lit("default"), pl.format("tid {}", pl.col("tid")))
        df = _with_issue_times(ev, df, _worker_tids(ev, ann))
        return _with_config_ranks(trace, _finish(df, rank, "backend_annotation"))
    host = ev.filter(
        pl.col("kind").is_in(["cpu_op", "user_annotation"])
        & pl.col("name").str.contains(HOST_OP_PATTERN)
        & ~pl.col("name").str.contains(_HOST_NON_COLLECTIVE)
    )
    if host.height:
        # Keep the outermost op of each nest (c10d::allreduce_ > record_param_comms > nccl:all_reduce).
        host = host.sort("tid", "ts", pl.col("dur"), descending=[False, False, True])
        host = host.with_columns(_enc=(pl.col("ts") + pl.col("dur")).cum_max().shift(1).over("tid"))
        host = host.filter(pl.col("_enc").is_null() | (pl.col("ts") >= pl.col("_enc")))
        host = host.filter(~pl.col("collective_name").fill_null("").str.contains(_HOST_NON_COLLECTIVE))
        df = _instances(host, pl.lit("default"), pl.lit("host"))
        return _with_config_ranks(trace, _finish(df, rank, "host_op"))
    return pl.DataFrame(schema=COLLECTIVES_SCHEMA)


def canonical_ranks(text: str | None) -> str | None:
    """A recorded ``Process Group Ranks`` value (``"[0, 4, 8]"``, ``"0 4 8"``) as ``"0,4,8"``
    (the recorded order kept: c10d sorts a group's ranks, and a pipeline group's order is its
    stage order); None when it holds no rank."""
    if text is None:
        return None
    found = re.findall(r"-?\d+", str(text))
    return ",".join(str(int(x)) for x in found) if found else None


def _with_config_ranks(trace: Trace, df: pl.DataFrame) -> pl.DataFrame:
    """Fill ``pg_ranks`` from the trace's ``distributedInfo.pg_config`` (the groups this rank
    belongs to, by ``pg_name``) where the events name their group but not its ranks."""
    config = trace.meta.distributed_info.get("pg_config") if trace.meta.distributed_info else None
    if not isinstance(config, list) or df.is_empty() or df["pg_ranks"].null_count() == 0:
        return df
    names: dict[str, str] = {}
    for entry in config:
        if isinstance(entry, dict) and "pg_name" in entry and isinstance(entry.get("ranks"), list):
            ranks = canonical_ranks(",".join(str(x) for x in entry["ranks"]))
            if ranks:
                names[str(entry["pg_name"])] = ranks
    if not names:
        return df
    return df.with_columns(
        pg_ranks=pl.coalesce(pl.col("pg_ranks"), pl.col("pg").replace_strict(names, default=None))
    )


def collective_host_ops_mask() -> pl.Expr:
    """Host events that belong to communication (excluded from host compute time)."""
    return (
        pl.col("name").str.contains(HOST_OP_PATTERN)
        | pl.col("name").str.contains(BACKEND_ANNOTATION_PATTERN)
        | pl.col("name").str.starts_with("ProcessGroup")
    )


def host_op_nelems(trace: Trace) -> dict[int, int]:
    """Elements per collective from the issuing ``c10d::<collective>_`` op's recorded shapes
    (``record_shapes=True``; CPU/gloo traces carry no ``In msg nelems``), keyed by the op's start
    (= the collective's ``arrival`` for the ``backend_annotation`` signal): the sum over the
    first argument's tensors of the product of their dimensions."""
    ops = trace.events.filter(pl.col("name").str.starts_with("c10d::") & pl.col("input_dims").is_not_null())
    out: dict[int, int] = {}
    for ts, dims in ops.select("ts", "input_dims").iter_rows():
        try:
            first = orjson.loads(dims)[0]
        except (orjson.JSONDecodeError, IndexError, TypeError):
            continue
        tensors = first if first and isinstance(first[0], list) else [first]
        if tensors and all(isinstance(t, list) and all(isinstance(x, int) for x in t) for t in tensors):
            out[int(ts)] = sum(math.prod(t) for t in tensors)
    return out
