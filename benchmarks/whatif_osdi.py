"""The OSDI '25 what-if artifact, replayed by Kinetoscope, next to the published figures.

    PYTHONPATH=. nice -n 10 python benchmarks/whatif_osdi.py [--dir ../shared/traces/osdi25_whatif]

For each job (AR, ST, SE) it prints: replay fidelity (the replay with host gaps against the
trace's own step times), T_obs / T_ideal / slowdown against ``result-X.json``, M_W and M_S
against ``mw-X.json`` / ``ms-X.json``, and the worker / stage the replay names.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from kinetoscope.diagnosis.whatif import osdi
from kinetoscope.diagnosis.whatif.replay import build_schedule, observed_replay

DEFAULT = Path(__file__).resolve().parents[1].parent / "shared" / "traces" / "osdi25_whatif"


def fidelity(path: Path) -> float:
    """Largest relative step-time error of the unmodified replay (host gaps kept)."""
    m = osdi.load(path, with_gaps=True).model
    got = observed_replay(m, build_schedule(m))
    return float(np.abs(got / m.observed_step_time - 1.0).max())


def main() -> None:
    """Print our figures next to the published ones."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", type=Path, default=DEFAULT)
    ap.add_argument("--jobs", nargs="*", default=["AR", "ST", "SE"])
    args = ap.parse_args()
    for job in args.jobs:
        t0 = time.perf_counter()
        trace = args.dir / f"trace-{job}.parquet"
        fig = osdi.figures(osdi.load(trace))
        mw = json.loads((args.dir / f"mw-{job}.json").read_text())
        ms = json.loads((args.dir / f"ms-{job}.json").read_text())
        res = json.loads((args.dir / f"result-{job}.json").read_text())
        worst_pub = max(res["blocking_decompose_by_stage"].items(), key=lambda kv: kv[1])[0]
        print(f"{job}: fidelity max step error {fidelity(trace):.2%} ({time.perf_counter() - t0:.1f} s)")
        print(
            f"  T_obs {fig.t_obs:.3f} s (pub {mw['tori']:.3f}), T_ideal {fig.t_ideal:.3f} s "
            f"(pub {mw['tideal']:.3f}), slowdown {fig.slowdown:.3f} (pub {res['blocking_slowdown']:.3f})"
        )
        print(
            f"  M_W {fig.m_w:.3f} (pub {mw['Mw']:.3f}, diff {fig.m_w - mw['Mw']:+.3f}); "
            f"M_S {fig.m_s:.3f} (pub {ms['Ms']:.3f}, diff {fig.m_s - ms['Ms']:+.3f})"
        )
        print(
            f"  worst workers {list(fig.worst_workers)}; worst stage {fig.worst_stage} "
            f"(pub {worst_pub}); stage costs {[round(c, 3) for c in fig.stage_cost]}"
        )


if __name__ == "__main__":
    main()
