"""The straggler verdict: which ranks hold the job back, of which kind, and at what cost.

``verdict`` is the entry (``analyze_stragglers``); ``model`` its report and thresholds;
``naming``, ``steady`` and ``slow_link`` the evidence that names ranks; ``tables`` the per-rank
and per-step tables; ``causes`` why a named rank is late; ``reconcile`` what the what-if replay
adds (``stragglers.whatif``); ``kinds`` the one taxonomy of kinds the verdict and the benchmark
labels share. The package imports nothing itself, so ``model`` stays cheap to import.
"""
