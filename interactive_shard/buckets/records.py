"""Typed records of the DDP bucket events (schema: ``docs/bucket-events.md``).

Payloads arrive from rank processes, so they are parsed defensively: a payload that
does not match the schema raises ``RecordError`` naming the field, and the model skips
that event (counting it) instead of failing the notebook. No widgets, no torch here.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

WATCH = "ddp_watch"
BUCKET = "bucket"
ITERATION = "ddp_iteration"
KINDS = frozenset({WATCH, BUCKET, ITERATION})


class RecordError(ValueError):
    """An event payload that does not follow the bucket event schema."""


@dataclass(frozen=True)
class WatchInfo:
    """What ``ish.watch(ddp)`` reported about the DDP model on one rank."""

    rank: int
    fqns: list[str]  # trainable parameters, registration order
    shapes: list[tuple[int, ...]]
    dtypes: list[str]
    modules: list[str]  # owning module fqn per parameter ("" = root)
    module_types: list[str]
    bucket_cap_mb: float | None
    bucket_cap_mb_list: list[float] | None
    bucket_bytes_cap: int
    first_bucket_bytes: int
    find_unused_parameters: bool
    static_graph: bool
    world_size: int
    user_hook: str | None
    checksum: str

    def __post_init__(self) -> None:
        n = len(self.fqns)
        lengths = [len(x) for x in (self.shapes, self.dtypes, self.modules, self.module_types)]
        if any(length != n for length in lengths):
            raise RecordError(f"ddp_watch: {n} fqns but per-parameter lists of {lengths}")

    @property
    def module_of(self) -> dict[str, str]:
        return dict(zip(self.fqns, self.modules, strict=True))

    @property
    def cap_mb(self) -> float:
        """The cap in MiB that DDP used (its default when none was passed)."""
        return self.bucket_bytes_cap / 2**20


@dataclass(frozen=True)
class ObservedBucket:
    """One bucket as the comm hook saw it; lists in ``GradBucket.parameters()`` order."""

    index: int
    fqns: list[str]
    shapes: list[tuple[int, ...]]
    dtypes: list[str]
    nbytes: int
    ready_t: float  # comm hook entered (rank's monotonic clock, seconds)
    start_t: float  # reduction launched
    end_t: float | None  # reduction's future completed; None: not known (still running)
    is_last: bool = False


@dataclass(frozen=True)
class IterationRecord:
    """The end-of-backward summary of one DDP iteration on one rank."""

    backward_start: float | None  # None: no gradient became ready at all
    backward_end: float | None
    ready_order: list[str]
    ready_t: list[float]
    unready: list[str]
    checksums: dict[str, float] = field(default_factory=dict)
    repeated: list[str] = field(default_factory=list)  # reached twice (reentrant checkpoint)


# -- parsing ---------------------------------------------------------------------------------
def _get(payload: Mapping[str, Any], kind: str, key: str, types: Any) -> Any:
    if key not in payload:
        raise RecordError(f"{kind} event without {key!r}")
    value = payload[key]
    if not isinstance(value, types) or (isinstance(value, bool) and bool not in _tuple(types)):
        raise RecordError(f"{kind} event: {key}={value!r:.60} is not {_names(types)}")
    return value


def _tuple(types: Any) -> tuple[type, ...]:
    return types if isinstance(types, tuple) else (types,)


def _names(types: Any) -> str:
    return " or ".join(t.__name__ for t in _tuple(types))


def _str_list(payload: Mapping[str, Any], kind: str, key: str) -> list[str]:
    value = _get(payload, kind, key, list)
    if not all(isinstance(v, str) for v in value):
        raise RecordError(f"{kind} event: {key} must be a list of strings")
    return list(value)


def _shapes(payload: Mapping[str, Any], kind: str) -> list[tuple[int, ...]]:
    value = _get(payload, kind, "shapes", list)
    try:
        return [tuple(int(d) for d in shape) for shape in value]
    except (TypeError, ValueError) as e:
        raise RecordError(f"{kind} event: shapes must be lists of ints ({e})") from None


def _time(payload: Mapping[str, Any], kind: str, key: str) -> float:
    value = float(_get(payload, kind, key, (int, float)))
    if not math.isfinite(value):
        raise RecordError(f"{kind} event: {key}={value} is not a finite time")
    return value


def _iteration(payload: Mapping[str, Any], kind: str) -> int:
    value = _get(payload, kind, "iteration", int)
    if value < 1:
        raise RecordError(f"{kind} event: iteration={value}; iterations count from 1")
    return int(value)


def _optional_float(value: Any, key: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise RecordError(f"ddp_watch event: {key}={value!r:.60} is not a number or null")
    return float(value)


def parse_watch(rank: int, p: Mapping[str, Any]) -> WatchInfo:
    caps = p.get("bucket_cap_mb_list")
    if caps is not None and not isinstance(caps, list):
        raise RecordError(f"ddp_watch event: bucket_cap_mb_list={caps!r:.60} is not a list")
    hook = p.get("user_hook")
    return WatchInfo(
        rank=rank,
        fqns=_str_list(p, WATCH, "fqns"),
        shapes=_shapes(p, WATCH),
        dtypes=_str_list(p, WATCH, "dtypes"),
        modules=_str_list(p, WATCH, "modules"),
        module_types=_str_list(p, WATCH, "module_types"),
        bucket_cap_mb=_optional_float(p.get("bucket_cap_mb"), "bucket_cap_mb"),
        bucket_cap_mb_list=None
        if caps is None
        else [_optional_float(c, "bucket_cap_mb_list") or 0.0 for c in caps],
        bucket_bytes_cap=int(_get(p, WATCH, "bucket_bytes_cap", int)),
        first_bucket_bytes=int(_get(p, WATCH, "first_bucket_bytes", int)),
        find_unused_parameters=bool(_get(p, WATCH, "find_unused_parameters", bool)),
        static_graph=bool(_get(p, WATCH, "static_graph", bool)),
        world_size=int(_get(p, WATCH, "world_size", int)),
        user_hook=hook if isinstance(hook, str) else None,
        checksum=str(p.get("checksum", "off")),
    )


def parse_bucket(p: Mapping[str, Any]) -> tuple[int, ObservedBucket]:
    fqns = _str_list(p, BUCKET, "fqns")
    shapes = _shapes(p, BUCKET)
    dtypes = _str_list(p, BUCKET, "dtypes")
    if not (len(fqns) == len(shapes) == len(dtypes)):
        raise RecordError(f"bucket event: {len(fqns)} fqns, {len(shapes)} shapes, {len(dtypes)}")
    bucket = ObservedBucket(
        index=int(_get(p, BUCKET, "index", int)),
        fqns=fqns,
        shapes=shapes,
        dtypes=dtypes,
        nbytes=int(_get(p, BUCKET, "nbytes", int)),
        ready_t=_time(p, BUCKET, "ready_t"),
        start_t=_time(p, BUCKET, "start_t"),
        end_t=None if p.get("end_t", 0.0) is None else _time(p, BUCKET, "end_t"),
        is_last=bool(p.get("is_last", False)),
    )
    return _iteration(p, BUCKET), bucket


def parse_iteration(p: Mapping[str, Any]) -> tuple[int, IterationRecord]:
    order = _str_list(p, ITERATION, "ready_order")
    times = _get(p, ITERATION, "ready_t", list)
    if len(times) != len(order) or not all(isinstance(t, (int, float)) for t in times):
        raise RecordError("ddp_iteration event: ready_t must be one number per ready_order entry")
    sums = p.get("checksums") or {}
    if not isinstance(sums, dict):
        raise RecordError("ddp_iteration event: checksums must be a dict of fqn -> number")
    checksums = {
        str(k): float(v)
        for k, v in sums.items()
        if isinstance(v, (int, float)) and not isinstance(v, bool)
    }
    record = IterationRecord(
        backward_start=None
        if p.get("backward_start") is None
        else _time(p, ITERATION, "backward_start"),
        backward_end=None if p.get("backward_end") is None else _time(p, ITERATION, "backward_end"),
        ready_order=order,
        ready_t=[float(t) for t in times],
        unready=_str_list(p, ITERATION, "unready") if "unready" in p else [],
        checksums=checksums,
        repeated=_str_list(p, ITERATION, "repeated") if "repeated" in p else [],
    )
    return _iteration(p, ITERATION), record
