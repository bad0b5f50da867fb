"""The store's scalars as rows of columns (Note [Columnar scalars] in ``schema``): a
row per scalar event, in log order, whether it arrived as columns or as an event."""

from __future__ import annotations

import itertools
import operator
from typing import Any, NamedTuple

import msgspec
import numpy as np

from interactive_shard.telemetry._columns import Column
from interactive_shard.telemetry.schema import SCALAR, Event, ScalarRun

_PAYLOAD = operator.attrgetter("payload")
_T = operator.attrgetter("t")
_VALUE = operator.itemgetter("value")
_NUMBERS = {int, float}


class ScalarColumns(NamedTuple):
    """Scalar events as aligned numpy columns (``RunStore.scalars``)."""

    at: np.ndarray  # their log positions
    ranks: np.ndarray
    steps: np.ndarray
    names: np.ndarray  # index into the store's scalar names; -1: the payload is no Scalar
    values: np.ndarray  # float64 (NaN where names is -1)


class ScalarRows:
    """Log position, name, value and time of every scalar; used under the store's lock."""

    def __init__(self) -> None:
        self.at = Column(np.int64)
        self._name = Column(np.int32)
        self._value = Column(np.float64)
        self._t = Column(np.float64)
        self.names: list[str] = []
        self._code: dict[str, int] = {}

    def __len__(self) -> int:
        return len(self.at)

    def add_events(self, at: int, events: list[Event]) -> None:
        """Rows for stored scalar events (log positions ``at`` on), read from payloads."""
        names, values = _scalar_fields(list(map(_PAYLOAD, events)))
        code = {name: -1 if name is None else self._code_of(name) for name in dict.fromkeys(names)}
        codes = list(map(code.__getitem__, names))
        self._add(np.arange(at, at + len(events)), codes, values, list(map(_T, events)))

    def add_run(self, at: int, run: ScalarRun) -> None:
        """Rows for a columnar run stored at log positions ``at`` on."""
        codes = np.array(list(map(self._code_of, run.names)), np.int32)[run.name_of]
        self._add(np.arange(at, at + run.size), codes, run.values, run.times)

    def read(
        self, start: int, ranks: np.ndarray, steps: np.ndarray
    ) -> tuple[ScalarColumns, list[str], int]:
        """Rows from ``start`` on, with their events' ``ranks`` and ``steps`` (the
        store's columns), the names, and the row to start from next time."""
        at = self.at.view(start)
        columns = ScalarColumns(
            at, ranks[at], steps[at], self._name.view(start), self._value.view(start)
        )
        return columns, list(self.names), start + len(at)

    def built(self, positions: np.ndarray, ranks: np.ndarray, steps: np.ndarray) -> list[Event]:
        """The columnar scalars at log ``positions`` as events."""
        rows = np.searchsorted(self.at.view(0), positions)
        names = self.names
        codes, values = self._name.view(0)[rows].tolist(), self._value.view(0)[rows].tolist()
        payloads = [{"name": names[c], "value": v} for c, v in zip(codes, values, strict=True)]
        return list(
            map(
                Event,
                itertools.repeat(SCALAR),
                ranks[positions].tolist(),
                steps[positions].tolist(),
                self._t.view(0)[rows].tolist(),
                payloads,
            )
        )

    def _add(self, at: np.ndarray, names: Any, values: Any, times: Any) -> None:
        n = len(at)
        for column, data in zip(
            (self.at, self._name, self._value, self._t), (at, names, values, times), strict=True
        ):
            column.extend(data, n)

    def _code_of(self, name: str) -> int:
        code = self._code.get(name)
        if code is None:
            code = self._code[name] = len(self.names)
            self.names.append(name)
        return code


class _Scalar(msgspec.Struct, kw_only=True, frozen=True):
    """The fields of ``run_events.Scalar`` (a test keeps the two alike)."""

    name: str = "value"
    value: float


def _scalar_fields(payloads: list[dict[str, Any]]) -> tuple[list[str | None], np.ndarray]:
    """Each scalar payload's name and value (None and NaN where ``msgspec.convert`` into
    ``Scalar`` refuses it): C loops for the common case, where every payload fits."""
    try:
        values = list(map(_VALUE, payloads))
        names = list(map(dict.get, payloads, itertools.repeat("name"), itertools.repeat("value")))
        if set(map(type, values)) <= _NUMBERS and set(map(type, names)) <= {str}:
            return names, np.array(values, np.float64)
    except (KeyError, OverflowError):
        pass
    out_names: list[str | None] = []
    out_values: list[float] = []
    for payload in payloads:
        try:
            scalar = msgspec.convert(payload, _Scalar)
        except msgspec.ValidationError:
            out_names.append(None)
            out_values.append(np.nan)
        else:
            out_names.append(scalar.name)
            out_values.append(scalar.value)
    return out_names, np.array(out_values, np.float64)
