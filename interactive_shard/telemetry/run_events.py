"""A run's own events: what every run records about its ranks, one Struct per kind.

The kinds are the built-in ones of ``telemetry/schema.py``: the Cluster, the Run and
``ctx.steps`` emit them (so they live in cluster/), and the monitor (``MonitorModel``)
reads them. A user's rank code sends
scalars with ``ctx.emit("scalar", name="loss", value=loss.item())``: a line per rank.
The code that emits an event builds its Struct and sends ``payload(event)``; the model
decodes a payload with ``msgspec.convert``.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

import msgspec
from msgspec import Meta

from interactive_shard.telemetry import schema
from interactive_shard.telemetry.rank_state import RankState


class Log(msgspec.Struct, kw_only=True, frozen=True):
    """One line a rank wrote to its stdout or stderr (noted in the kernel, step 0)."""

    KIND: ClassVar[str] = schema.LOG

    stream: Annotated[Literal["stdout", "stderr"], Meta(description="where it was written")]
    text: Annotated[str, Meta(description="the line, without its line break")]


class Scalar(msgspec.Struct, kw_only=True, frozen=True):
    """A number the rank's code reports at its current step (``ctx.emit("scalar", ...)``).

    The monitor plots one line per name and rank, against ``Event.step``; an event whose
    value is not a number is skipped (counted in ``MonitorModel.skipped``).
    """

    KIND: ClassVar[str] = schema.SCALAR

    name: Annotated[str, Meta(description='what the value is, e.g. `"loss"`')] = "value"
    value: Annotated[float, Meta(description="the number (an int is read as a float)")]


class Progress(msgspec.Struct, kw_only=True, frozen=True):
    """Each step of ``ctx.steps(total)``, as it begins: ``Event.step`` is that step."""

    KIND: ClassVar[str] = schema.PROGRESS

    total: Annotated[int | None, Meta(description="the last step (null: not known)")] = None


class State(msgspec.Struct, kw_only=True, frozen=True):
    """A rank's state changed (noted in the kernel, step 0). A Run's ranks go running ->
    finished or failed."""

    KIND: ClassVar[str] = schema.STATE

    state: Annotated[RankState, Meta(description="a `RankState` (`telemetry/rank_state.py`)")]
    detail: Annotated[str, Meta(description="why, in words (e.g. the error of a failed rank)")] = ""


class RankInfo(msgspec.Struct, kw_only=True, frozen=True):
    """Where a rank runs, sent first in every run of its channel (a Cluster's run, a
    listener's stream, a recording file). ``wall`` and the event's own time ``t`` are
    read together: ranks on one host share the monotonic clock ``t`` is on, and a
    recording's loader puts other hosts on rank 0's clock from ``wall - t``."""

    KIND: ClassVar[str] = schema.RANK

    host: Annotated[str, Meta(description="the host name (`socket.gethostname()`)")]
    pid: Annotated[int, Meta(description="the rank's process id")]
    node: Annotated[
        int, Meta(description="its node: torchrun's `GROUP_RANK` (0 in a Cluster)", ge=0)
    ] = 0
    local_rank: Annotated[int, Meta(description="its rank on its node (`LOCAL_RANK`)", ge=0)] = 0
    wall: Annotated[float, Meta(description="`time.time()` when `t` was read")] = 0.0


class Overhead(msgspec.Struct, kw_only=True, frozen=True):
    """What a probe's own work has cost its rank so far (cumulative: the latest counts).

    ``spent_s`` is the time in the probe's callbacks, its event sending included, of the
    ``active_s`` seconds from its first callback to its latest: their ratio is its share
    of the step (``run.overhead``). ``probe`` ``"sending"`` is the channel's background
    flushes (encoding and writing batches), which every probe shares; it and
    ``"collectives"`` (the ledger's listener and thread) run in the background: their
    ``spent_s`` is their thread's CPU time, their ``active_s`` from the run's start to
    the report. Each run counts from zero."""

    KIND: ClassVar[str] = schema.OVERHEAD

    probe: Annotated[str, Meta(description="the feature whose probe it is, or `sending`")]
    spent_s: Annotated[float, Meta(description="seconds spent in its own code", ge=0)]
    active_s: Annotated[float, Meta(description="seconds from its first call to its latest", ge=0)]
    calls: Annotated[int, Meta(description="its callbacks (or batches sent) so far", ge=0)] = 0
    iterations: Annotated[int, Meta(description="iterations of the watched model so far", ge=0)] = 0


EVENTS = (Log, Scalar, Progress, State, RankInfo)  # in docs/events.md, in this order


def payload(event: msgspec.Struct) -> dict[str, Any]:
    """The payload to send for ``event``: its fields as plain data (a ``RankState`` as its
    value), ready for ``emit`` or ``Event(event.KIND, rank, step, t, payload(event))``."""
    plain: dict[str, Any] = msgspec.to_builtins(event)
    return plain
