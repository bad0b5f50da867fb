"""Hook order and overlap timelines: forward, backward, hooks, collectives and the
optimizer step of every rank on one time axis, eager vs compiled.

``events.py`` (what the probe sends), ``probe.py`` (spans on the rank), ``model.py``
(``run.timeline``: aligned spans, phases, order, overlap, matched collectives),
``chrome.py`` (Chrome Trace Event Format export), ``figures.py`` and ``view.py``.
"""
