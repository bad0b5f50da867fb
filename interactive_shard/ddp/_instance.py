"""What the lifecycle model holds per DDP instance: the records ``run.ddp`` returns
(``ObservedCollective``, ``Iteration``, ``Finding``), ``Instance`` (its watches, its
iterations as columns, ``Iteration`` objects built from them when read) and the
advice drawn from those columns. Re-exported by ``model.py``, their public home.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from interactive_shard.ddp._iteration_columns import PURPOSES, IterationTable, NamePool, Parts
from interactive_shard.ddp.events import Collective, LifecycleIteration, LifecycleWatch
from interactive_shard.telemetry.schema import Event

SETTINGS = (
    "static_graph",
    "find_unused_parameters",
    "forward_sync_buffers",
    "init_sync_buffers",
    "gradient_as_bucket_view",
    "delayed",
    "hook_param",
    "comm_hook",
    "mixed_precision",
    "optimizer_in_backward",
)
Details = Callable[[list[Event]], list[LifecycleIteration | None]]


@dataclass(frozen=True)
class ObservedCollective:
    """One collective of a rank, with what it was for."""

    op: str
    nbytes: int
    purpose: str  # gradients, buffers, construction, delayed, other
    dtype: str
    group: str
    start: float
    end: float | None
    rank: int
    ddp: int | None
    iteration: int  # 0: construction


@dataclass
class Iteration:
    """One backward cycle of one instance on one rank (parts merged)."""

    index: int
    forwards: int = 0
    dropped: int = 0
    backward: bool = False
    finished: bool | None = None
    waited_for: list[str] = field(default_factory=list)  # unready: no gradient came
    ready: list[str] = field(default_factory=list)
    collectives: list[ObservedCollective] = field(default_factory=list)
    walk_s: float | None = None
    steps_in_backward: int = 0
    delayed_names: list[str] = field(default_factory=list)

    @property
    def buffer_bytes(self) -> int:
        return sum(c.nbytes for c in self.collectives if c.purpose == "buffers")

    @property
    def delayed(self) -> list[str]:
        """The delayed parameters, when their all-reduce ran in this iteration."""
        ran = any(c.purpose == "delayed" for c in self.collectives)
        return list(self.delayed_names) if ran else []

    @property
    def delayed_bytes(self) -> int:
        return sum(c.nbytes for c in self.collectives if c.purpose == "delayed")


class Instance:
    """One DDP object on one rank, in creation order (``serial``).

    ``table`` holds its iterations as columns (what the figures read);
    ``iterations`` builds ``Iteration`` objects from it on first read (cached).
    """

    def __init__(
        self, serial: int, rank: int, watch: LifecycleWatch, names: NamePool, details: Details
    ) -> None:
        self.serial = serial
        self.rank = rank
        self.watches = [watch]  # every watch of it; the last is current
        self.table = IterationTable(names)
        self._details = details  # full records of raw parts (the model's, counting skips)
        self._built: list[Iteration] = []  # Iteration objects of the first rows
        # A new probe (ish.watch again after a detach) counts iterations from 1 again;
        # its indices are shifted past the history (``offset``), decided by the first
        # index seen after the watch: one not past ``rewatched`` (the last index then)
        # is a restart.
        self.offset = 0
        self.rewatched: int | None = None

    @property
    def watch(self) -> LifecycleWatch:
        return self.watches[-1]

    def rewatch(self, watch: LifecycleWatch) -> None:
        """Watched again in a later run: new settings and hooks, same history."""
        self.watches.append(watch)
        self.rewatched = int(self.table.col("index")[-1]) if len(self.table) else 0

    def shift(self, index: int) -> int:
        """``index`` as the probe sent it -> this instance's history index."""
        if self.rewatched is not None and index >= 1:
            if index <= self.rewatched:
                self.offset = self.rewatched
            self.rewatched = None
        return index + self.offset if index >= 1 else index

    def add(self, parts: Parts) -> None:
        """This instance's parts of a batch (in arrival order, indices as sent)."""
        index = parts.cols["index"]
        index[:] = self.shift(int(index[0])) - int(index[0]) + index
        parts.cols["watch"][:] = len(self.watches) - 1
        self._built[self.table.add(parts) :] = []

    @property
    def settings(self) -> dict[str, Any]:
        return {name: getattr(self.watch, name) for name in SETTINGS}

    @property
    def hooks(self) -> dict[str, int]:
        """fqn -> live DDP hooks on it (Reducer hooks plus the delayed all-reduce's)."""
        return {h.fqn: len(h.reducer) + len(h.delayed) for h in self.watch.hooks}

    @property
    def construction(self) -> list[ObservedCollective]:
        return [observed(c, self.rank, 0) for c in self.watch.construction]

    @property
    def iteration_count(self) -> int:
        """len(iterations), without building them."""
        return len(self.table)

    @property
    def iterations(self) -> list[Iteration]:
        """Every iteration, in index order (built from the columns when first read)."""
        if len(self._built) < len(self.table):
            self._built += self._build(len(self._built), len(self.table))
        return list(self._built)

    def iteration(self, index: int) -> Iteration | None:
        row = self.table.row(index)
        if row is None:
            return None
        return self._built[row] if row < len(self._built) else self._build(row, row + 1)[0]

    def _build(self, start: int, stop: int) -> list[Iteration]:
        """``Iteration`` objects of rows ``start:stop``, their collectives decoded from
        the raw events (the columns hold only their bytes)."""
        t = self.table
        index = t.col("index")
        low, high = int(index[start]), int(index[stop - 1])
        indices, parts = t.raw_between(low, high)
        by_index: dict[int, list[ObservedCollective]] = {}
        for i, record in zip(indices, self._details(parts), strict=True):
            if record is not None:
                by_index.setdefault(i, []).extend(
                    observed(c, self.rank, i) for c in record.collectives
                )
        names = t.names.tuples
        cols = {k: t.col(k)[start:stop].tolist() for k in _BUILT}
        out = []
        for k, i in enumerate(cols["index"]):
            finished, walk = cols["finished"][k], cols["walk"][k]
            out.append(
                Iteration(
                    index=i,
                    forwards=cols["forwards"][k],
                    dropped=cols["dropped"][k],
                    backward=cols["backward"][k],
                    finished=None if finished != finished else bool(finished),  # nan: None
                    waited_for=list(names[cols["unready"][k]]),
                    ready=list(names[cols["ready"][k]]),
                    collectives=by_index.get(i, []),
                    walk_s=None if walk != walk else walk,
                    steps_in_backward=cols["steps"][k],
                    delayed_names=list(self.watches[cols["watch"][k]].delayed),
                )
            )
        return out


# The columns an Iteration is built from (ready, unready: ids into the NamePool).
_BUILT = "index forwards dropped backward finished walk steps watch ready unready".split()


@dataclass(frozen=True)
class Finding:
    """A check that fired (merged over ranks) or advice from what was observed."""

    kind: str  # unfinished, forward_without_backward, double_hooks, static_graph_safe, ...
    iteration: int | None
    ranks: list[int]
    fqns: list[str]
    message: str
    level: str = "error"  # error: a check fired; info: advice
    ddp: int | None = None


def observed(c: Collective, rank: int, iteration: int) -> ObservedCollective:
    return ObservedCollective(
        op=c.op,
        nbytes=c.nbytes,
        purpose=PURPOSES.get(c.caller, "other"),
        dtype=c.dtype,
        group=c.group,
        start=c.start,
        end=c.end,
        rank=rank,
        ddp=c.ddp,
        iteration=iteration,
    )


def advice(inst: Instance) -> list[Finding]:
    """Advice from the iterations seen (2 or more, each with a finished backward), read
    from the columns (numpy over the whole history: microseconds per thousand)."""
    t = inst.table
    done = np.flatnonzero(t.col("backward"))
    out: list[Finding] = []
    if len(done) < 2:
        return out
    index, names = t.col("index"), t.names.tuples
    ready = t.col("ready")[done[1:]]  # the first iteration's order may differ
    first = names[int(ready[0])]
    single = bool(np.all(t.col("forwards")[done] == 1))
    # Note [Undefined gradients]: with a parameter unused, static_graph=True crashes.
    seen = np.unique(t.col("unready")[done]).tolist()
    unused = sorted({f for i in seen for f in names[i]})
    same = bool(np.all(ready == ready[0]))
    if not inst.watch.static_graph and same and first and single and not unused:
        out.append(
            Finding(
                "static_graph_safe",
                None,
                [inst.rank],
                [],
                f"DDP instance {inst.serial}: the same {len(first)} parameters became ready "
                f"in the same order in iterations {index[done[1]]}..{index[done[-1]]}, one "
                "forward each: static_graph=True would be safe (DDP then skips its per-"
                "iteration bookkeeping).",
                "info",
                inst.serial,
            )
        )
    walks = t.col("walk")[done]
    walks = walks[~np.isnan(walks)]
    if inst.watch.find_unused_parameters and len(walks):
        ms = float(np.median(walks)) * 1e3
        if unused:
            text = f"parameters {unused} were unused, so it is needed"
        else:
            text = "no parameter was ever unused: find_unused_parameters=False saves that"
        out.append(
            Finding(
                "find_unused_cost",
                None,
                [inst.rank],
                unused,
                f"DDP instance {inst.serial}: find_unused_parameters=True walks the autograd "
                f"graph after every forward, {ms:.3g} ms per iteration here; {text}.",
                "info",
                inst.serial,
            )
        )
    return out
