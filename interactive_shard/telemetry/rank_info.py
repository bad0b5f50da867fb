"""Where each rank of a run runs: its ``RankInfo`` events, read once per store.

Views label a rank with its node when a run spans several (``label``), the monitor
lists hosts, and a recording's loader puts hosts on one clock. One reader per store
(``of``), so every view of a run shares it.
"""

from __future__ import annotations

import weakref
from typing import Any

from interactive_shard.telemetry.consume import Cursor
from interactive_shard.telemetry.run_events import RankInfo
from interactive_shard.telemetry.store import RunStore

__all__ = ["RankInfo", "Ranks", "of"]


class Ranks:
    """The latest ``RankInfo`` of each rank of ``store`` (``update`` reads what is new)."""

    def __init__(self, store: RunStore) -> None:
        # The store through a weak proxy: this reader is its value in ``_READERS``, keyed
        # weakly by the store, and a value that held its key would keep every run's
        # store (all its events) alive for the kernel's life.
        self._cursor = Cursor(weakref.proxy(store), {RankInfo.KIND: RankInfo})
        self.info: dict[int, RankInfo] = {}
        self._by = ""  # what labels name: "node", "host" or nothing (one place)

    def update(self) -> bool:
        events, records = self._cursor.take_records()
        for event, record in zip(events, records, strict=True):
            if record is not None:
                self.info[event.rank] = record
        if events:  # views label every rank 10 times a second: decide once per arrival
            nodes = {i.node for i in self.info.values()}
            hosts = {i.host for i in self.info.values()}
            self._by = "node" if len(nodes) > 1 else "host" if len(hosts) > 1 else ""
        return bool(events)

    def nodes(self) -> dict[int, list[int]]:
        """Node -> its ranks (those that said where they run)."""
        return self._grouped("node")

    def hosts(self) -> dict[str, list[int]]:
        """Host name -> its ranks."""
        return self._grouped("host")

    def _grouped(self, field: str) -> dict[Any, list[int]]:
        self.update()
        found: dict[Any, list[int]] = {}
        for rank, info in sorted(self.info.items()):
            found.setdefault(getattr(info, field), []).append(rank)
        return found

    def label(self, rank: int) -> str:
        """``"2"``, or ``"2 · node 1"`` when the run spans several nodes or hosts."""
        self.update()
        info = self.info.get(rank)
        if info is None or not self._by:
            return str(rank)
        return f"{rank} · node {info.node}" if self._by == "node" else f"{rank} · {info.host}"


_READERS: weakref.WeakKeyDictionary[RunStore, Ranks] = weakref.WeakKeyDictionary()


def of(store: RunStore) -> Ranks:
    """The one ``Ranks`` reader of ``store``."""
    found = _READERS.get(store)
    if found is None:
        found = _READERS[store] = Ranks(store)
    return found
