"""What the replay adds to the straggler verdict (``straggler_whatif.reconcile``) and its headline.

The report and the what-if block are built here by hand (the replay itself is tested on real
jobs in ``test_whatif_kineto.py``); the breakdown table is empty, so causes read "no data".
"""

from __future__ import annotations

import polars as pl

from kinetoscope.diagnosis.breakdown import BREAKDOWN_COLUMNS
from kinetoscope.diagnosis.straggler_model import StragglerReport, StragglerThresholds
from kinetoscope.diagnosis.straggler_whatif import NamedRank, WhatIfReport, reconcile, rotating_line


def _wi(kind: str, named: list[tuple[int, float, list[int], str]]) -> WhatIfReport:
    return WhatIfReport(
        slowdown=1.4,
        per_rank={str(r): 1.0 + c for r, c, _, _ in named},
        per_optype={"between-collectives": 1.3, "step-tail": 1.0},
        m_w=0.5,
        m_s=None,
        explaining_set=[NamedRank(r, c, c, late, k) for r, c, late, k in named],
        recovered_fraction=0.8,
        kind=kind,
        lost_fraction=sum(c for _, c, _, _ in named),
        fidelity=0.0,
        steps=8,
    )


def _bd() -> pl.DataFrame:
    cols = {"rank": pl.Int64(), "step": pl.Int64()} | {f"{c}(us)": pl.Float64() for c in BREAKDOWN_COLUMNS}
    return pl.DataFrame(schema=cols)


def test_none_becomes_rotating_with_every_rank_and_its_cost():
    rep = StragglerReport(kind="none", skew_fraction=0.27, mean_step_time_us=100_000.0)
    wi = _wi(
        "rotating",
        [(4, 0.12, [1, 5], "intermittent"), (3, 0.09, [2], "intermittent"), (1, 0.07, [6], "intermittent")],
    )
    reconcile(rep, wi, StragglerThresholds(), _bd(), {})
    assert rep.kind == "rotating" and rep.ranks == [4, 3, 1]
    assert abs((rep.lost_fraction or 0) - 0.28) < 1e-9
    line = rotating_line(rep, wi.to_dict())
    assert line.startswith("ROTATING STRAGGLERS")
    assert all(f"rank {r}:" in line for r in (4, 3, 1)) and "12.0%" in line


def test_cheap_rotation_or_unassessed_job_stays_none():
    th = StragglerThresholds()
    rep = StragglerReport(kind="none", skew_fraction=0.1)
    reconcile(
        rep, _wi("rotating", [(0, 0.01, [1], "intermittent"), (2, 0.01, [3], "intermittent")]), th, _bd(), {}
    )
    assert rep.kind == "none"
    rep = StragglerReport(kind="none", skew_fraction=None)  # nothing compared
    reconcile(
        rep, _wi("rotating", [(0, 0.2, [1], "intermittent"), (2, 0.2, [3], "intermittent")]), th, _bd(), {}
    )
    assert rep.kind == "none"


def _per_rank(late: dict[int, int]) -> pl.DataFrame:
    return pl.DataFrame({"rank": list(late), "late_steps": list(late.values())})


def test_near_equal_co_straggler_joins_and_the_kind_is_mixed():
    rep = StragglerReport(kind="persistent", ranks=[2], intermittent_ranks=[5], skew_fraction=0.3)
    rep.per_rank = _per_rank({2: 8, 5: 4})
    wi = _wi("mixed", [(2, 0.20, list(range(8)), "persistent"), (5, 0.17, [1, 4], "intermittent")])
    reconcile(rep, wi, StragglerThresholds(), _bd(), {2: "persistent", 5: "intermittent"})
    assert rep.ranks == [2, 5] and rep.kind == "mixed"


def test_a_minor_rank_of_the_set_does_not_join():
    rep = StragglerReport(kind="persistent", ranks=[7], intermittent_ranks=[5], skew_fraction=0.3)
    rep.per_rank = _per_rank({7: 8, 5: 5})
    wi = _wi("persistent", [(7, 0.30, [0], "persistent"), (5, 0.05, [0], "persistent")])
    reconcile(rep, wi, StragglerThresholds(), _bd(), {7: "persistent"})
    assert rep.ranks == [7] and rep.kind == "persistent"


def test_host_stalls_and_ranks_the_rules_did_not_name_do_not_join():
    # two stalls (late in 2 steps), and a rank the rules left out: the rules' noise decisions stand
    rep = StragglerReport(kind="persistent", ranks=[1, 3], intermittent_ranks=[4], skew_fraction=0.3)
    rep.per_rank = _per_rank({1: 13, 3: 13, 4: 2, 0: 0})
    wi = _wi(
        "mixed",
        [
            (1, 0.11, [0], "persistent"),
            (3, 0.11, [0], "persistent"),
            (4, 0.12, [2, 9], "intermittent"),
            (0, 0.1, [5], "intermittent"),
        ],
    )
    reconcile(rep, wi, StragglerThresholds(), _bd(), {1: "persistent", 3: "persistent", 4: "intermittent"})
    assert rep.ranks == [1, 3] and rep.kind == "persistent"
