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


EVENTS = (Log, Scalar, Progress, State)  # in docs/events.md, in this order


def payload(event: msgspec.Struct) -> dict[str, Any]:
    """The payload to send for ``event``: its fields as plain data (a ``RankState`` as its
    value), ready for ``emit`` or ``Event(event.KIND, rank, step, t, payload(event))``."""
    plain: dict[str, Any] = msgspec.to_builtins(event)
    return plain
