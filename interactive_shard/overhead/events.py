"""The overhead feature's event: ``Overhead``, defined with the run's own events.

Every probe (``probing.attachment.Attachment``), the collective ledger's recorder and the
channel's background flushes send it (``telemetry/meter.py``), so it lives in
``telemetry/run_events.py``; this feature reads it.
"""

# docs/events.md is written from this file (tools/gen_event_docs.py). No torch here.

from __future__ import annotations

from interactive_shard.telemetry.run_events import Overhead

__all__ = ["EVENTS", "Overhead"]

EVENTS = (Overhead,)
