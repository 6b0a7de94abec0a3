"""The order of a pipeline's stages: one definition for every line that names a stage.

Stage 0 is what opens its steps with a send (it holds the input); each further stage is one
transfer hop further along the point-to-point links. Used by the replay
(``whatif.kineto.pipeline_stages``, on peer classes) and by the pipeline analysis
(``pipeline``, on ranks), so the verdict's stage and the pipeline line's stage are one number.
A stage's place is its position in the chain of transfers, not when it starts working: a
heavy stage receives its first activation no later than a light one behind it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping


def hop_stages(heads: Iterable[int], near: Mapping[int, Iterable[int]]) -> dict[int, int]:
    """Stage of each node reached from ``heads`` (stage 0) along ``near`` (node -> the nodes it
    exchanges transfers with, either direction): its number of hops from the heads."""
    frontier = sorted(set(heads))
    stage_of = dict.fromkeys(frontier, 0)
    while frontier:
        nxt = sorted({c for f in frontier for c in near.get(f, ()) if c not in stage_of})
        for c in nxt:
            stage_of[c] = stage_of[frontier[0]] + 1
        frontier = nxt
    return stage_of
