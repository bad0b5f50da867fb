"""Events from ranks to the kernel: schema, channel, store, recording."""

from interactive_shard.telemetry.channel import Collector, Emitter
from interactive_shard.telemetry.recording import RecordingError, RecordingWarning
from interactive_shard.telemetry.schema import SCHEMA_VERSION, Batch, Event, PayloadError
from interactive_shard.telemetry.store import RunInfo, RunStore

__all__ = [
    "SCHEMA_VERSION",
    "Batch",
    "Collector",
    "Emitter",
    "Event",
    "PayloadError",
    "RecordingError",
    "RecordingWarning",
    "RunInfo",
    "RunStore",
]
