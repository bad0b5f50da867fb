"""OverheadModel: ``run.overhead``, the telemetry reader of ``Overhead`` events as a
feature's model (display shows its view). The reading and Note [Share of the step] are
``telemetry/overhead.py``'s: the badge on every view (``ui/``) reads the same numbers,
and ``ui/`` imports no feature."""

from __future__ import annotations

from interactive_shard.telemetry import overhead
from interactive_shard.telemetry.overhead import Row, percent
from interactive_shard.ui.live import ShowsView

__all__ = ["OverheadModel", "Row", "percent"]


class OverheadModel(overhead.OverheadModel, ShowsView):
    """What each probe cost each rank (``share(probe, rank)``, ``table()``, ``badge()``);
    see ``telemetry.overhead.OverheadModel``."""
