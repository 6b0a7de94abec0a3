"""Grouping ranks by stack shape, outliers, stuck vs progressing (kinetoscope.collect.stack_groups),
on snapshots built in the daemon's own structs."""

from __future__ import annotations

from kinetoscope.collect.stack_groups import (
    PROGRESSING,
    STUCK,
    RankStacks,
    build_report,
    compress,
    shape_of,
)
from kinetoscope.protocol import rpc

LIB = "/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py"


def _frame(name: str, file: str, line: int, local: dict[str, str] | None = None) -> rpc.StackFrame:
    return rpc.StackFrame(name=name, file=file, short_file=file.rsplit("/", 1)[-1], line=line, locals=local)


def _snap(
    pid: int, rank: int, frames: list[rpc.StackFrame], *, active: bool = False, t: float = 0.0
) -> rpc.ProcessStacks:
    main = rpc.ThreadStack(
        thread_id=1, os_thread_id=pid, name="MainThread", active=active, owns_gil=active, frames=frames
    )
    other = rpc.ThreadStack(
        thread_id=2, os_thread_id=pid + 1, name=None, active=False, owns_gil=False, frames=[]
    )
    return rpc.ProcessStacks(
        pid=pid,
        host_pid=pid,
        rank=rank,
        local_rank=rank,
        world_size=8,
        job_id="1",
        cmdline="python train.py",
        threads=[other, main],
        cpu_s=t,
        taken_at=t,
    )


def _waiting(line: int = 95, step: str = "30") -> list[rpc.StackFrame]:
    return [
        _frame("all_reduce", LIB, 3252),
        _frame("main", "/job/train.py", line, {"step": step}),
        _frame("<module>", "/job/train.py", 120),
    ]


def _loading() -> list[rpc.StackFrame]:
    return [
        _frame("DataLoader.__next__", "/venv/lib/python3.11/site-packages/torch/utils/data.py", 41),
        _frame("main", "/job/train.py", 88),
        _frame("<module>", "/job/train.py", 120),
    ]


def _ranks(frames_by_rank: dict[int, list[list[rpc.StackFrame]]]) -> list[RankStacks]:
    return [
        RankStacks(
            host="h:1778",
            hostname="h",
            pid=100 + r,
            host_pid=100 + r,
            rank=r,
            snapshots=[_snap(100 + r, r, f, t=float(i)) for i, f in enumerate(samples)],
        )
        for r, samples in frames_by_rank.items()
    ]


def _report(ranks: list[RankStacks], samples: int = 1) -> object:
    return build_report(ranks, target={"job_id": 1}, samples=samples, interval_s=1.0, hosts=[], errors=[])


def _helper() -> list[rpc.StackFrame]:
    """The loop's own helper (job code, not a library): still the same loop."""
    return [
        _frame("write_progress", "/job/train.py", 20),
        _frame("main", "/job/train.py", 99),
        _frame("<module>", "/job/train.py", 120),
    ]


def test_one_rank_elsewhere_is_the_outlier_and_prints_first() -> None:
    ranks = {r: [_waiting(line=95 if r % 2 else 96)] for r in range(8) if r != 3}  # lines differ: same shape
    ranks[3] = [_loading()]
    report = _report(_ranks(ranks))
    first, second = report.groups  # type: ignore[attr-defined]
    assert first.ranks == [3] and first.outlier
    assert first.summary == "rank 3 — DataLoader.__next__ (data.py:41), waiting ← train.py:88"
    assert second.ranks == [0, 1, 2, 4, 5, 6, 7] and not second.outlier
    assert second.summary.startswith(
        "7 ranks (0-2,4-7) — all_reduce (distributed_c10d.py:3252), waiting ← train.py:9"
    )
    assert report.outliers == [3]  # type: ignore[attr-defined]
    assert "outlier: rank 3" in report.verdict  # type: ignore[attr-defined]


def test_two_equal_groups_have_no_outlier() -> None:
    report = _report(_ranks({0: [_waiting()], 1: [_waiting()], 2: [_loading()], 3: [_loading()]}))
    assert len(report.groups) == 2 and report.outliers == []  # type: ignore[attr-defined]
    assert "no single outlier" in report.verdict  # type: ignore[attr-defined]


def test_same_stack_and_locals_is_stuck_changed_locals_is_progressing() -> None:
    stuck = {r: [_waiting(step="30"), _waiting(step="30"), _waiting(step="30")] for r in range(3)}
    report = _report(_ranks(stuck), samples=3)
    assert report.states == {STUCK: 3}  # type: ignore[attr-defined]
    assert "every rank is stuck" in report.verdict  # type: ignore[attr-defined]
    # a busy job: the same line twice, but the step moved; and a rank in the loader once
    busy = {
        0: [_waiting(step="30"), _waiting(step="31"), _helper()],
        1: [_waiting(step="30"), _loading(), _waiting(step="32")],
        2: [_loading(), _waiting(step="31"), _loading()],
    }
    report = _report(_ranks(busy), samples=3)
    assert report.states == {PROGRESSING: 3}  # type: ignore[attr-defined]
    [group] = report.groups  # type: ignore[attr-defined]
    assert (
        group.ranks == [0, 1, 2] and not group.outlier and "progressing, in main (train.py)" in group.summary
    )
    assert "every rank is progressing" in report.verdict  # type: ignore[attr-defined]


def test_a_failed_snapshot_is_reported_not_grouped() -> None:
    ranks = _ranks({0: [_waiting()], 1: [_waiting()]})
    ranks[1].snapshots = [
        rpc.ProcessStacks(
            pid=101,
            host_pid=101,
            rank=1,
            local_rank=1,
            world_size=2,
            job_id="1",
            cmdline=None,
            threads=[],
            error="pid 101: ptrace refused: ...",
            error_kind="permission",
        )
    ]
    report = _report(ranks)
    assert [g.ranks for g in report.groups] == [[0]]  # type: ignore[attr-defined]
    assert report.ranks[1].error_kind == "permission" and report.ranks[1].state == "error"  # type: ignore[attr-defined]
    assert "1 ranks could not be read" in report.verdict  # type: ignore[attr-defined]


def test_shape_ignores_lines_and_native_frames() -> None:
    a = rpc.ThreadStack(
        thread_id=1, os_thread_id=1, name=None, active=True, owns_gil=True, frames=[_frame("f", "/a/x.py", 1)]
    )
    b = rpc.ThreadStack(
        thread_id=1,
        os_thread_id=1,
        name=None,
        active=True,
        owns_gil=True,
        frames=[
            rpc.StackFrame(
                name="gloo::wait", file="libgloo.so", short_file="libgloo.so", line=0, native=True
            ),
            _frame("f", "/a/x.py", 7),
        ],
    )
    assert shape_of(a) == shape_of(b) == ("f (x.py)",)
    assert compress([0, 1, 2, 4, 6, 7]) == "0-2,4,6-7"


def _in_helper(step: str, line: int) -> list[rpc.StackFrame]:
    """A rank inside the loop's own helper (writing its progress file), at a given step."""
    return [
        _frame("Path.rename", "/usr/lib/python3.11/pathlib.py", 1175),
        _frame("write_progress", "/job/train.py", line, {"step": step}),
        _frame("main", "/job/train.py", 99, {"step": step}),
        _frame("<module>", "/job/train.py", 120),
    ]


def test_a_rank_caught_in_the_same_helper_every_time_is_in_the_same_loop() -> None:
    # seen on a real busy 4-rank job: a rank spends much of a tiny step writing its progress
    # file, so now and then all three snapshots catch it there; its loop is still main's
    busy = {r: [_waiting(step="30"), _loading(), _waiting(step="32")] for r in range(3)}
    busy[3] = [_in_helper("30", 20), _in_helper("31", 21), _in_helper("33", 20)]
    report = _report(_ranks(busy), samples=3)
    assert report.states == {PROGRESSING: 4}  # type: ignore[attr-defined]
    [group] = report.groups  # type: ignore[attr-defined]
    assert group.ranks == [0, 1, 2, 3] and "progressing, in main (train.py)" in group.summary


def test_a_rank_iterating_in_its_own_inner_loop_is_apart() -> None:
    # a rank retrying a read forever: main's step stays, the retry loop's locals move
    busy = {r: [_waiting(step="30"), _loading(), _waiting(step="32")] for r in range(3)}
    busy[3] = [
        [
            _frame("retry_read", "/job/train.py", 40, {"attempt": a}),
            _frame("main", "/job/train.py", 88, {"step": "30"}),
        ]
        + [_frame("<module>", "/job/train.py", 120)]
        for a in ("1", "2", "3")
    ]
    report = _report(_ranks(busy), samples=3)
    first, second = report.groups  # type: ignore[attr-defined]
    assert first.ranks == [3] and first.outlier and "retry_read" in first.summary
    assert second.ranks == [0, 1, 2]
