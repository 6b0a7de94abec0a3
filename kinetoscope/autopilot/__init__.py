"""The fleet autopilot (``kscope autopilot``, docs/autopilot.md): keeps every job of a fleet
profiled with no person in the loop — discovery of the daemons' jobs, a policy of when to
trace, the per-sample pipeline (trigger, wait, store, analyse, record) with its state in the
catalog, alerts, and its own metrics. Nothing is imported here, so that ``kscope jobs`` and the
web app's Fleet page load only what they use."""
