"""Event Structs: one definition per kind, documented, and the page written from them."""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path
from types import ModuleType
from typing import Any

import msgspec
import msgspec.inspect as mi
import pytest
from msgspec.structs import asdict

from interactive_shard.buckets import records
from interactive_shard.buckets.events import BucketReduced, DdpIteration, DdpWatch
from interactive_shard.features import FEATURES, feature
from interactive_shard.testing import FakeRun, mlp_params

ROOT = Path(__file__).resolve().parents[2]
EVENTS = [event for f in FEATURES for event in f.event_types()]


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "gen_event_docs", ROOT / "tools/gen_event_docs.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_docs_events_md_is_current() -> None:
    gen = _generator()
    page = ROOT / "docs" / "events.md"
    written = page.read_text(encoding="utf-8") if page.exists() else ""
    assert written == gen.render(), (
        f"docs/events.md is not what the event Structs say: run `{gen.COMMAND}` and commit "
        "docs/events.md"
    )


def test_every_kind_is_defined_once_with_when_and_what() -> None:
    kinds = [event.KIND for event in EVENTS]
    assert len(kinds) == len(set(kinds)), kinds
    for event in EVENTS:
        assert (event.__doc__ or "").strip(), f"{event.__name__}: say when it is emitted"
        info = mi.type_info(event)
        assert isinstance(info, mi.StructType)
        for f in info.fields:
            described = isinstance(f.type, mi.Metadata) and (f.type.extra_json_schema or {}).get(
                "description"
            )
            assert described, f"{event.__name__}.{f.name}: add Meta(description=...)"


def test_feature_kinds_come_from_its_events() -> None:
    assert feature("buckets").kinds == {"ddp_watch", "bucket", "ddp_iteration"}
    assert feature("monitor").kinds == {"log", "scalar", "progress", "state", "rank"}
    assert records.KINDS == feature("buckets").kinds


def _old_watch_payload() -> dict[str, Any]:
    """A ``ddp_watch`` payload as the probe wrote it by hand before the Structs."""
    return {
        "fqns": ["a.weight", "a.bias"],
        "shapes": [[4, 2], [4]],
        "dtypes": ["torch.float32", "torch.float32"],
        "modules": ["a", "a"],
        "module_types": ["Linear", "Linear"],
        "bucket_cap_mb": None,
        "bucket_cap_mb_list": None,
        "bucket_bytes_cap": 26214400,
        "first_bucket_bytes": 1048576,
        "find_unused_parameters": False,
        "static_graph": False,
        "world_size": 2,
        "user_hook": None,
        "checksum": "sampled",
    }


ADDED_SINCE = {
    "delayed": None,
    "first_iteration": 1,
}  # ddp_watch fields added later, with their defaults


def test_struct_payloads_are_the_old_wire_format() -> None:
    old = _old_watch_payload()
    new = asdict(msgspec.convert(old, DdpWatch))
    # A field added later decodes to its default, so an old recording still reads.
    assert {k: new.pop(k) for k in ADDED_SINCE} == ADDED_SINCE
    # Shapes are tuples in the Struct, arrays on the wire: the bytes are the same.
    assert msgspec.msgpack.encode(new) == msgspec.msgpack.encode(old)
    assert json.loads(msgspec.json.encode(new)) == old


def test_watch_with_delayed_parameters_round_trips() -> None:
    run = FakeRun(
        mlp_params(2, 8), iterations=1, delayed=["layers.0.bias"], delay_hook="layers.0.weight"
    )
    watch = next(e for e in run.events() if e.kind == DdpWatch.KIND)
    assert watch.payload["delayed"]["fqns"] == ["layers.0.bias"]  # plain data on the wire
    info = records.decode(0, watch.kind, watch.payload)
    assert isinstance(info, records.WatchInfo) and info.delayed is not None
    assert info.delayed.hook == "layers.0.weight" and info.delayed.shapes == [(8,)]
    assert "layers.0.bias" not in info.fqns
    bad = {**watch.payload, "delayed": {**watch.payload["delayed"], "dtypes": []}}
    with pytest.raises(records.RecordError, match="different lengths"):
        records.decode(0, watch.kind, bad)


def test_recorded_payloads_round_trip_through_the_structs() -> None:
    for event in FakeRun(mlp_params(2, 8), iterations=2).events():
        record = records.decode(event.rank, event.kind, event.payload)
        wire = json.loads(msgspec.json.encode(event.payload))
        back = json.loads(msgspec.json.encode(asdict(record)))
        back.pop("rank", None)  # WatchInfo adds the event's rank
        assert back == wire


@pytest.mark.parametrize(
    ("kind", "change", "words"),
    [
        (BucketReduced.KIND, {"index": True}, "Expected `int`, got `bool`"),
        (BucketReduced.KIND, {"iteration": 0}, ">= 1"),
        (BucketReduced.KIND, {"ready_t": math.inf}, "ready_t"),
        (BucketReduced.KIND, {"dtypes": []}, "different lengths"),
        (DdpIteration.KIND, {"ready_t": [1.0]}, "one time per entry"),
        (DdpWatch.KIND, {"checksum": "some"}, "checksum"),
        (DdpWatch.KIND, {"first_iteration": 0}, ">= 1"),
        (DdpWatch.KIND, {"first_iteration": "3"}, "first_iteration"),
        ("nonsense", {}, "not a bucket event kind"),
    ],
)
def test_a_malformed_payload_is_a_record_error_naming_it(
    kind: str, change: dict[str, Any], words: str
) -> None:
    good = {
        BucketReduced.KIND: {
            "iteration": 1,
            "index": 0,
            "fqns": ["w"],
            "shapes": [[2]],
            "dtypes": ["torch.float32"],
            "nbytes": 8,
            "ready_t": 1.0,
            "start_t": 1.0,
            "end_t": None,
        },
        DdpIteration.KIND: {"iteration": 1, "ready_order": ["w", "b"], "ready_t": [1.0, 2.0]},
        DdpWatch.KIND: _old_watch_payload(),
    }
    with pytest.raises(records.RecordError, match=f"{kind}.*{words}|{words}"):
        records.decode(0, kind, {**good.get(kind, {}), **change})


def test_watch_info_is_the_event_and_its_rank() -> None:
    info = records.decode(3, DdpWatch.KIND, {**_old_watch_payload(), "rank": 99})
    assert isinstance(info, records.WatchInfo) and isinstance(info, DdpWatch)
    assert info.rank == 3 and info.shapes == [(4, 2), (4,)] and info.cap_mb == 25.0
    assert info.module_of == {"a.weight": "a", "a.bias": "a"}
