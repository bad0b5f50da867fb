"""A numpy column that grows by doubling: what the store keeps per event (kind, rank,
step) and per scalar (name, value, time), and the monitor per scalar series."""

from __future__ import annotations

from typing import Any

import numpy as np


class Column:
    """Appended to under the store's lock, read as views. A view stays valid after the
    column grows (its array is not changed, the column moves to a larger copy) and
    what it covers never changes (append-only)."""

    __slots__ = ("_data", "_n")

    def __init__(self, dtype: type[np.generic], capacity: int = 1024) -> None:
        self._data: np.ndarray = np.empty(capacity, dtype=dtype)
        self._n = 0

    def extend(self, values: Any, count: int) -> None:
        """Append ``values`` (``count`` of them: a list or an array), or ``count`` times
        the one number."""
        n = self._n
        if n + count > len(self._data):  # np.resize would also fill the new part: not needed
            grown = np.empty(max(2 * len(self._data), n + count), self._data.dtype)
            grown[:n] = self._data[:n]
            self._data = grown
        try:
            self._data[n : n + count] = values
        except (OverflowError, TypeError, ValueError):
            # Only events made in Python get here (the wire format checks ranks and
            # steps): what does not fit is filed as -1, a rank no run has and a step
            # no iteration has (models skip and count those events when they read them).
            info = np.iinfo(self._data.dtype)
            assert isinstance(values, list)
            fit = [v if type(v) is int and info.min <= v <= info.max else -1 for v in values]
            self._data[n : n + count] = fit
        self._n = n + count

    def replace(self, values: np.ndarray) -> None:
        """Hold ``values`` instead (a re-sorted index; views taken before keep the old:
        it moves to a new array)."""
        self._data = np.empty(max(len(self._data), len(values)), self._data.dtype)
        self._n = 0
        self.extend(values, len(values))

    def view(self, start: int = 0, end: int | None = None) -> np.ndarray:
        """The values from ``start`` to ``end`` (by default, all so far)."""
        return self._data[start : self._n if end is None else end]

    def __len__(self) -> int:
        return self._n
