"""Labelled straggler scenarios for ``benchmarks/bench_diagnosis.py``.

* ``truth``: the arrival-order ground truth of a multi-rank GPU job, computed from the raw trace
  JSON with the standard library only (independent of Kinetoscope's code).
* ``gpu``: GPU jobs derived from real rank traces, with delays injected at chosen (rank,
  collective instance) and the whole trace re-timed consistently.
* ``cpu``: real DDP jobs (torchrun + gloo) with injected stragglers, traced through a private
  ``kscope daemon`` (``train_knobs.py`` is the training script).
* ``gpu_live``: the same jobs with every rank training on a GPU (a lent GPU machine), packed
  with their labels; ``gpu_live_check`` scores them off the machine.
"""
