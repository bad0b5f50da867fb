"""Synthetic runs for tests, benchmarks and offline demos: events exactly as the
probes emit them, without ranks.

Each feature's synthetic run lives in its own folder (``buckets/fake.py``,
``splits/fake.py``, ...; ``Feature.fake`` names its ``sample``); this module gathers
them under one name and adds what spans features: ``payload_types`` (what a decoded
payload holds, from an event Struct) and ``split_net_params`` (the graph-split test
model's parameters, for a bucket run of the same model).
"""

from __future__ import annotations

from typing import Any

import msgspec.inspect as mi

from interactive_shard.buckets.fake import (
    FakeParam,
    FakeRun,
    mlp_params,
    module_params,
)
from interactive_shard.ddp.fake import (
    FakeLifecycle,
)
from interactive_shard.precision.fake import (
    FakePrecision,
    FakeUnit,
    ddp_policy,
    fsdp1_policy,
    fsdp2_policy,
    mp_net,
    precision_batch,
)
from interactive_shard.splits.fake import (
    DDP_BREAK_REASON,
    NOTHING_REASON,
    FakeSplits,
    captured,
    mlp_graph,
    split_event,
    split_net,
    traced_graph,
)
from interactive_shard.timeline.fake import (
    FakeTimeline,
)


def payload_types(event: type[Any]) -> dict[str, Any]:
    """Field name -> what ``isinstance`` accepts for it in a decoded payload (lists for
    lists and tuples, ``type(None)`` for null), from an event Struct."""
    info = mi.type_info(event)
    assert isinstance(info, mi.StructType), event
    return {f.encode_name: _python_types(f.type) for f in info.fields}


def _python_types(t: mi.Type) -> Any:
    if isinstance(t, mi.Metadata):
        return _python_types(t.type)
    if isinstance(t, mi.UnionType):
        return tuple(_python_types(u) for u in t.types)
    if isinstance(t, mi.LiteralType):
        return tuple({type(v) for v in t.values})
    simple = {
        mi.StrType: str,
        mi.IntType: int,
        mi.FloatType: float,
        mi.BoolType: bool,
        mi.NoneType: type(None),
        mi.ListType: list,
        mi.VarTupleType: list,  # a tuple on this side, an array on the wire
        mi.DictType: dict,
        mi.StructType: dict,  # a nested record is a map on the wire
    }
    for cls, python in simple.items():
        if isinstance(t, cls):
            return python
    raise TypeError(f"payload_types: no Python type for {t!r}")


def split_net_params(layers: int = 4, width: int = 64, *, out: int = 1) -> list[FakeParam]:
    """``split_net``'s parameters, for a ``FakeRun`` of the same model (the bucket map)."""
    head = [
        FakeParam("head.weight", (out, width), "head"),
        FakeParam("head.bias", (out,), "head"),
    ]
    return [*mlp_params(layers, width), *head]


__all__ = [
    "DDP_BREAK_REASON",
    "NOTHING_REASON",
    "FakeLifecycle",
    "FakeParam",
    "FakePrecision",
    "FakeRun",
    "FakeSplits",
    "FakeTimeline",
    "FakeUnit",
    "captured",
    "ddp_policy",
    "fsdp1_policy",
    "fsdp2_policy",
    "mlp_graph",
    "mlp_params",
    "module_params",
    "mp_net",
    "payload_types",
    "precision_batch",
    "split_event",
    "split_net",
    "split_net_params",
    "traced_graph",
]
