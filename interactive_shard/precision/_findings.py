"""The precision model's findings, merged over the (rank, iteration)s read.

An iteration's drafts (``analysis.Draft``) are kept with the version they were made for
(the batches and failures it had); a newer version takes the old drafts back, so an
update costs the iterations that changed, not the run. Drafts are also kept by what
an iteration's records say (``_batches.Iteration.key``, without the iteration number):
a long run's iterations repeat one another, and each distinct one is analysed once.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable

from interactive_shard.precision.analysis import ERROR, NOTE, WARNING, Draft, Finding

Key = tuple[int, int]  # (rank, iteration)
MEMO = 4096  # distinct contents kept per rank


class Findings:
    def __init__(self) -> None:
        self._where: dict[Draft, set[Key]] = {}
        self._of: dict[Key, tuple[Hashable, list[Draft]]] = {}
        self._memo: dict[int, dict[Hashable, list[Draft]]] = {}
        self._merged: list[Finding] | None = None

    def __len__(self) -> int:
        """How many (rank, iteration)s the findings were read from."""
        return len(self._of)

    def current(self, key: Key, version: Hashable) -> bool:
        found = self._of.get(key)
        return found is not None and found[0] == version

    def known(self, rank: int, content: Hashable) -> bool:
        """Whether an iteration of ``rank`` with this content was analysed already."""
        return content in self._memo.get(rank, ())

    def put(
        self,
        key: Key,
        version: Hashable,
        content: Hashable,
        drafts: Callable[[], list[Draft]],
    ) -> None:
        """The drafts of ``key`` at ``version`` (made by ``drafts`` unless an iteration of
        the same rank with the same ``content`` had them already)."""
        if self.current(key, version):
            return
        memo = self._memo.setdefault(key[0], {})
        found = memo.get(content)
        if found is None:
            found = list(dict.fromkeys(drafts()))
            if len(memo) >= MEMO:
                memo.clear()
            memo[content] = found
        self._take_back(key)
        self._of[key] = (version, found)
        for d in found:
            self._where.setdefault(d, set()).add(key)
        self._merged = None

    def forget(self, rank: int) -> None:
        for key in [k for k in self._of if k[0] == rank]:
            self._take_back(key)
        self._memo.pop(rank, None)
        self._merged = None

    def merged(self) -> list[Finding]:
        """Every finding, once, errors first, then by where it was first seen."""
        if self._merged is None:
            order = {ERROR: 0, WARNING: 1, NOTE: 2}
            self._merged = sorted(
                (
                    Finding(
                        d.kind,
                        d.level,
                        d.unit,
                        d.message,
                        d.fix,
                        d.consumer,
                        tuple(sorted({r for r, _ in where})),
                        tuple(sorted({i for _, i in where})),
                    )
                    for d, where in self._where.items()
                ),
                key=lambda f: (order.get(f.level, 3), min(f.iterations), f.unit, f.kind),
            )
        return list(self._merged)

    def _take_back(self, key: Key) -> None:
        old = self._of.pop(key, None)
        for d in old[1] if old is not None else ():
            where = self._where.get(d)
            if where is not None:
                where.discard(key)
                if not where:
                    del self._where[d]
