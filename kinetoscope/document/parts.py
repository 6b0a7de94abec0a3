"""Typed parts of the analysis document that the diagnosis produces (job, steps, MFU,
recommendations, evidence, pipeline, uneven inputs) and the per-trace metadata.

Each Struct is the *read* form of one key of the ``kscope analyze --json`` document
(docs/analysis.md, docs/diagnosis.md): field names are the JSON keys (``name=`` where the key is
not an identifier, e.g. ``step_time(us)``), every field has a default so a document written
before a field existed still decodes, and unknown keys are ignored (a producer may add fields
without breaking a reader). One Struct is both forms where the part is complete (every key the
producer writes, in its order): the diagnosis's builders (``kinetoscope.diagnosis.builders``)
return it and encode it with ``msgspec.to_builtins``; :func:`kinetoscope.document.decode` turns
the JSON form back into it.
"""

from __future__ import annotations

from typing import Any

import msgspec

from kinetoscope.protocol.structinfo import prime_structs


class Part(msgspec.Struct, kw_only=True):
    """Base of every document part: keyword-only fields, unknown keys ignored."""


class TraceMeta(Part):
    """One ``traces`` entry: what was read from one trace file."""

    path: str | None = None
    rank: int | None = None
    world_size: int | None = None
    rank_source: str | None = None
    hostname: str | None = None
    job_id: str | None = None
    pid: int | None = None
    trace_id: str | None = None
    device_type: str | None = None
    num_trace_events: int | None = None
    warnings: list[str] = msgspec.field(default_factory=list)


class ClockOffset(Part):
    """One rank's clock offset (``job.clock.offsets``; the producer's columns are
    ``diagnosis.clock.CLOCK_SCHEMA``, in its order): the offset applied, the one measured and its
    causality bounds, how many collective pairs matched, the residual of those pairs, how it was
    aligned (``method``) and the rank it was paired with (``aligned_via``)."""

    rank: int | None = None
    host: str | None = None
    offset_us: float | None = None
    measured_us: float | None = None
    lower_bound_us: float | None = None
    upper_bound_us: float | None = None
    matched: int | None = None
    residual_us: float | None = None
    method: str | None = None
    aligned_via: int | None = None


class Clock(Part):
    """How the ranks' clocks were aligned (``job.clock``)."""

    reference_rank: int | None = None
    match_method: str | None = None
    window_us: float | None = None
    residual_us: float | None = None
    offsets: list[ClockOffset] = msgspec.field(default_factory=list)  # shown as a table
    notes: list[str] = msgspec.field(default_factory=list)


class OtherJob(Part):
    """A job found in the inputs besides the diagnosed one (``job.other_jobs``)."""

    key: str | None = None
    ranks: list[int] = msgspec.field(default_factory=list)
    world_size: int | None = None


class Job(Part):
    """The ``job`` part: which ranks were found, steps, devices and clocks."""

    key: str | None = None
    job_id: str | None = None
    world_size: int | None = None
    world_size_source: str | None = None
    ranks_found: list[int] = msgspec.field(default_factory=list)
    num_ranks_found: int | None = None
    missing_ranks: list[int] = msgspec.field(default_factory=list)
    num_missing_ranks: int = 0
    duplicate_ranks: dict[str, Any] = msgspec.field(default_factory=dict)
    unranked_files: list[str] = msgspec.field(default_factory=list)
    hosts: dict[str, str | None] = msgspec.field(default_factory=dict)
    rank_sources: dict[str, str | None] = msgspec.field(default_factory=dict)
    notes: list[str] = msgspec.field(default_factory=list)
    steps_found: int | None = None
    step_source: str | None = None
    device_types: list[str] = msgspec.field(default_factory=list)
    backends: list[str] = msgspec.field(default_factory=list)
    collective_signal: list[str] = msgspec.field(default_factory=list)
    clock: Clock | None = None
    other_jobs: list[OtherJob] = msgspec.field(default_factory=list)


class StepRow(Part):
    """One rank's one step of the diagnosis ``steps`` table (µs)."""

    rank: int | None = None
    step: int | None = None
    step_time_us: float | None = msgspec.field(default=None, name="step_time(us)")
    compute_us: float | None = msgspec.field(default=None, name="compute(us)")
    exposed_comm_us: float | None = msgspec.field(default=None, name="exposed_comm(us)")
    sync_wait_us: float | None = msgspec.field(default=None, name="sync_wait(us)")
    idle_us: float | None = msgspec.field(default=None, name="idle(us)")
    launch_gap_us: float | None = msgspec.field(default=None, name="launch_gap(us)")
    dataloader_us: float | None = msgspec.field(default=None, name="dataloader(us)")
    lateness_us: float | None = msgspec.field(default=None, name="lateness(us)")
    self_time_us: float | None = msgspec.field(default=None, name="self_time(us)")


class Mfu(Part):
    """The ``mfu`` part: model FLOPs utilisation and what it rests on."""

    mfu: float | None = None
    flops_per_step: float | None = None
    flops_source: str | None = None
    step_time_s: float | None = None
    chips: int | None = None
    achieved_flops_per_chip: float | None = None
    peak_flops_per_chip: float | None = None
    peak_source: str | None = None
    device: str | None = None
    device_key: str | None = None
    precision: str | None = None
    reason: str | None = None
    assumptions: list[str] = msgspec.field(default_factory=list)
    formula: str | None = None


class Recommendation(Part):
    """One ``recommendations`` entry. ``evidence`` holds the numbers that triggered it, keyed
    by the rule's own measurement names (units in the suffix: ``_fraction``, ``_ms``, ...)."""

    id: str = ""
    severity: str = "info"
    title: str = ""
    evidence: dict[str, Any] = msgspec.field(default_factory=dict)
    action: str = ""


class EvidenceTimestamps(Part):
    total: int = 0


class EvidenceRank(Part):
    """One rank of the ``evidence`` part: its window, steps and anomalies."""

    rank: int | None = None
    path: str | None = None
    events: int | None = None
    steps: int | None = None
    first_step: int | None = None
    last_step: int | None = None
    window_start_ms: float | None = None
    window_end_ms: float | None = None
    salvaged: Any = None
    empty: bool = False
    near_empty: bool = False
    startup_step_ratio: float | None = None
    fell_back_to_duration: bool = False
    timestamps: EvidenceTimestamps | None = None


class Anomaly(Part):
    kind: str | None = None
    ranks: list[int] = msgspec.field(default_factory=list)
    count: int | None = None
    message: str | None = None
    left_out: Any = None


class Evidence(Part):
    """The ``evidence`` part: what the verdict rests on (docs/diagnosis.md §Evidence), the
    producer's fields (``diagnosis.evidence.Evidence.to_dict``) in its order. ``usable``: whether
    the set can carry a cross-rank verdict (the autopilot's name of ``assessed``; None: the block
    does not say). ``timestamp_anomalies``: device events stamped before their launch (None: not
    counted). Older and other producers' spellings are mapped by the decoder
    (``document.spellings``)."""

    assessed: bool = True
    reason: str | None = None
    command: str | None = None
    confidence_lowered: bool = False
    ranks: list[EvidenceRank] = msgspec.field(default_factory=list)
    steps_in_common: int | None = None
    instances_in_common: int | None = None
    steps_asked: int | None = None
    windows_overlap: bool | None = None
    windows_aligned: bool | None = None
    starts_aligned: bool | None = None
    start_spread_ms: float | None = None
    end_spread_ms: float | None = None
    clock_residual_us: float | None = None
    unaligned_ranks: list[int] = msgspec.field(default_factory=list)
    timestamp_anomalies: int | None = None
    excluded_steps: list[int] = msgspec.field(default_factory=list)
    anomalies: list[Anomaly] = msgspec.field(default_factory=list)
    anomalous: bool = False
    usable: bool | None = None
    lines: list[str] = msgspec.field(default_factory=list)


class ReplicaRank(Part):
    stage: int | None = None
    excess_fraction: float = 0.0


class ReplicaIssue(Part):
    ranks: list[int] = msgspec.field(default_factory=list)
    per_rank: list[ReplicaRank] = msgspec.field(default_factory=list)


class Imbalance(Part):
    slowest_stage: int | None = None
    slowest_ranks: list[int] = msgspec.field(default_factory=list)
    excess_fraction: float | None = None
    est_step_time_balanced_ms: float | None = None


class Pipeline(Part):
    """The ``pipeline`` part (pipeline-parallel jobs, docs/diagnosis.md §11.1)."""

    schedule: str | None = None
    schedule_source: str | None = None
    num_stages: int | None = None
    replicas: int | None = None
    microbatches: int | None = None
    bubble_fraction: float | None = None
    expected_bubble_fraction: float | None = None
    step_time_ms: float | None = None
    steps_analysed: int | None = None
    stages: list[dict[str, Any]] = msgspec.field(default_factory=list)  # shown as a table
    imbalance: Imbalance | None = None
    replica_issue: ReplicaIssue | None = None


class UnevenInputs(Part):
    """The ``uneven_inputs`` part: ranks that ran out of data first (docs/diagnosis.md §11.2).
    Rank-keyed maps have the rank as text; ``idle_ms``: each rank's idle time while the others
    ran on; ``unmatched_collective``: the collective left without a peer (mode ``unmatched``)."""

    mode: str | None = None
    short_ranks: list[int] = msgspec.field(default_factory=list)
    waiting_ranks: list[int] = msgspec.field(default_factory=list)
    steps_per_rank: dict[str, int] = msgspec.field(default_factory=dict)
    collectives_per_rank: dict[str, int] = msgspec.field(default_factory=dict)
    shadow_collectives: dict[str, int] = msgspec.field(default_factory=dict)
    idle_ms: dict[str, float] = msgspec.field(default_factory=dict)
    lost_fraction: float | None = None
    unmatched_collective: dict[str, Any] | None = None


class Recompilation(Part):
    """The ``recompilation`` part: torch.compile compilations inside the window (docs/diagnosis.md
    section 11). ``events`` stay row objects (one per compilation, shown as a table)."""

    compiles: int = 0
    recompiles: int = 0
    compile_time_ms: float | None = None
    recompile_time_ms: float | None = None
    recompile_steps: list[int] = msgspec.field(default_factory=list)
    events: list[dict[str, Any]] = msgspec.field(default_factory=list)


prime_structs(globals())
