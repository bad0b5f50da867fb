"""DDP lifecycle inspector: what a DDP instance did from its construction on.

``events.py`` (what the probe sends), ``probe.py`` (the rank side: settings, the
construction-time sync, buffer broadcasts, hooks per parameter, per-iteration forwards,
reduction and ready order, and the checks that fire before a hang; Note [Lifecycle
probe]); the process-wide collective recorder the cluster's worker starts when it creates
the process group is ``probing/collective_log.py``.
"""
