"""Reference planner: which gradient bucket DDP puts each parameter in, and when.

Note [DDP buckets]
~~~~~~~~~~~~~~~~~~

Background: DDP does not all-reduce gradients one by one. Its C++ ``Reducer`` copies
them into flat *buckets* and launches one all-reduce per bucket as soon as every
gradient in it is ready, so communication overlaps the rest of the backward pass.
Buckets are reduced strictly in index order (bucket 1 waits for bucket 0), so a good
layout puts the gradients that are ready first in bucket 0. DDP does not know that
order when it is constructed; it learns it during the first backward and then
*rebuilds* the buckets once.

Algorithm (torch 2.13, ``DistributedDataParallel._ddp_init_helper`` and
``Reducer::rebuild_buckets``; each step checked against real DDP in
``tests/integration/test_bucket_plan_vs_ddp.py``):

1. Parameters: ``named_modules()`` x ``named_parameters(recurse=False)`` with
   ``requires_grad``, shared ones once, minus ``_ddp_params_and_buffers_to_ignore``.
   A parameter's place in this list is its *reducer index* (registration order).
2. Caps: ``bucket_cap_mb`` (default 25) -> ``int(mb * 2**20)`` bytes. The *first* bucket
   of a rebuild gets ``dist._DEFAULT_FIRST_BUCKET_BYTES`` (1 MiB) only when neither
   ``bucket_cap_mb`` nor ``bucket_cap_mb_list`` is given; otherwise the same cap.
   ``bucket_cap_mb_list=[a, b, ...]`` gives bucket i the i-th cap (the last repeats),
   at construction and at the rebuild alike.
3. Greedy assignment (``_assign.assign_by_size``): per ``(dtype, device)``, tensors join
   the open bucket until its bytes reach the cap; the tensor that crosses the cap is
   inside. A parameter with sparse gradients gets a bucket of its own, placed where it
   is met; buckets still open at the end follow all closed ones.
4. Iteration 1 (construction): registration order, with limits ``[sys.maxsize]`` when
   ``find_unused_parameters=False`` or ``static_graph=True`` -- so ONE bucket per
   dtype/device (and one per sparse-gradient parameter) -- otherwise ``[first, cap]`` (or the list).
   Buckets are sorted by lowest reducer index and then *reversed*: bucket 0 holds the
   last-registered parameters. Inside a bucket, parameters stay in registration order.
5. Rebuild: DDP records the order in which gradient hooks fire (rank 0's order is
   broadcast) and assigns again in that order with limits ``[first, cap]`` (or the
   list). Buckets keep that order, and so do the parameters inside them: bucket 0
   starts with the first gradient ready. The rebuild happens in the forward of
   iteration 2 (iteration 3 with ``static_graph``: iteration 1 delays all reductions
   and iteration 2 records the order). With ``find_unused_parameters=True`` and no
   ``static_graph`` DDP never rebuilds: the step-4 buckets stay for good.
6. Delayed parameters (``delay_all_reduce_named_params=[(name, param), ...]`` with
   ``param_to_hook_all_reduce=p``; DDP takes both or neither): each *name* joins
   ``ddp.parameters_to_ignore``, so step 1 leaves it out, at iteration 1 and at the
   rebuild alike (the Reducer never sees its gradient); each *param* joins
   ``ddp._delay_all_reduce_params``. Their ``.grad`` are views of one flat
   ``torch.zeros(total numel)`` (default dtype, on ``device_ids[0]`` or the CPU), set
   after every forward; a *tensor* hook on ``p`` (it runs when ``p``'s gradient is
   computed, before it is accumulated) divides that buffer by the world size and
   launches ONE ``all_reduce(async_op=True)`` on DDP's group, never waited for. Names
   are DDP keys: a root parameter given as ``"pos"`` stays in the buckets (its key is
   ``".pos"``) and is delayed too (``DelayedParams.in_buckets``); DDP ignores an
   unknown name silently, the planner refuses it. With every trainable parameter
   delayed DDP builds no Reducer at all. ``_delayed.py`` resolves the names.

Caveats:

- With several dtypes/devices, the buckets still open at the end of a rebuild come in
  the order of a C++ ``std::unordered_map``; the planner asks torch for that order
  (``_assign._open_bucket_order``) and falls back to reverse first appearance.
- The ready order is a prediction: ``example_inputs`` runs one local backward, and
  control flow, different inputs per rank or ``no_sync`` can change what DDP records.
  Give ``ready_order`` when you know better. Unused parameters go last under
  ``static_graph`` (as DDP does); without it DDP cannot rebuild and raises.
- Delayed parameters are all-reduced correctly only when ``p``'s gradient comes after
  every delayed one: seen on 2 gloo ranks, a hook on an earlier gradient left the sum,
  not the mean (the all-reduce read a buffer still filling). The planner does not check.
- Not modelled: ``DDP_SET_LAST_BUCKET_CAP=1``, ``gradient_as_bucket_view`` (it
  changes memory, not the layout) and DDPOptimizer (``torch.compile``), which
  bucketizes its graph by its own rules.

Debugging: ``ddp._get_ddp_logging_data()`` has ``bucket_sizes`` and
``rebuilt_per_bucket_param_indices``; a comm hook sees ``bucket.parameters()`` in
exactly the order ``Bucket.fqns`` predicts, and buckets in index order. One quirk:
in the first ``static_graph`` iteration all buckets are reduced at the end of backward
and every one reports ``bucket.index() == 0``.
"""

from __future__ import annotations

import contextlib
import difflib
import functools
import gc
import itertools
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from interactive_shard.buckets._assign import BucketCaps
from interactive_shard.buckets._columns import ParamColumns
from interactive_shard.buckets._delayed import DelayedParams, delay_names, split_delayed
from interactive_shard.buckets._params import ParamSpec, ReadyOrderSource, resolve_ready_order

__all__ = [
    "Bucket",
    "BucketCaps",
    "BucketPlan",
    "DelayedParams",
    "ParamSpec",
    "ReadyOrderSource",
    "plan_buckets",
]


@dataclass(frozen=True)
class Bucket:
    """One gradient bucket; lists are per parameter, in ``GradBucket.parameters()`` order."""

    index: int
    fqns: list[str]
    shapes: list[tuple[int, ...]]
    dtypes: list[str]  # e.g. "torch.float32"; one dtype per bucket
    numels: list[int]
    nbytes: int
    cap_bytes: int  # limit in force when the bucket closed (sys.maxsize: none; 0: sparse)
    device: str = "cpu"
    sparse: bool = False

    def __post_init__(self) -> None:
        n = len(self.fqns)
        lengths = (len(self.shapes), len(self.dtypes), len(self.numels))
        if n == 0 or any(length != n for length in lengths):
            raise ValueError(f"bucket {self.index}: {n} fqns but per-parameter lists {lengths}")
        if len(set(self.dtypes)) != 1:
            raise ValueError(f"bucket {self.index} mixes dtypes {sorted(set(self.dtypes))}")

    @classmethod
    def _trusted(cls, fields: dict[str, Any]) -> Bucket:
        """A bucket the planner built (valid by construction), without ``__init__``'s
        checks: a frozen dataclass's ``__init__`` and ``__post_init__`` were a third of
        planning 10,000 parameters into 1,500 buckets."""
        bucket = cls.__new__(cls)
        bucket.__dict__.update(fields)
        return bucket

    @property
    def dtype(self) -> str:
        return self.dtypes[0]

    @property
    def numel(self) -> int:
        return sum(self.numels)


@dataclass(frozen=True)
class BucketPlan:
    """DDP's bucket layout at iteration 1 and after the rebuild, plus the inputs used."""

    first_iteration: list[Bucket]
    rebuilt: list[Bucket]
    param_order: list[str]  # reducer (registration) order
    ready_order: list[str]  # gradient-ready order the rebuild used
    ready_order_source: ReadyOrderSource
    caps: BucketCaps
    find_unused_parameters: bool = False
    static_graph: bool = False
    unused: list[str] = field(default_factory=list)  # seen unused with example_inputs
    delayed: DelayedParams | None = None  # delay_all_reduce_named_params: in no bucket

    def __post_init__(self) -> None:
        if self.delayed is not None:
            left = set(self.delayed.fqns) - set(self.delayed.in_buckets)
            if left & set(self.param_order):
                raise ValueError(
                    f"delayed parameters in buckets: {sorted(left & set(self.param_order))}"
                )
        expected = set(self.param_order)
        unique = len(expected) == len(self.param_order)
        for name, buckets in (("first_iteration", self.first_iteration), ("rebuilt", self.rebuilt)):
            if [b.index for b in buckets] != list(range(len(buckets))):
                raise ValueError(f"{name}: bucket indices must be 0..{len(buckets) - 1}")
            held = list(itertools.chain.from_iterable(b.fqns for b in buckets))
            # Sets, not Counters, when the names are unique (they are, from the planner):
            # the same check, a tenth of the cost at 10,000 parameters.
            once = len(held) == len(self.param_order) and set(held) == expected
            if not (once if unique else Counter(held) == Counter(self.param_order)):
                raise ValueError(f"{name}: every parameter must be in exactly one bucket")
        if not self.rebuilds and self.rebuilt != self.first_iteration:
            raise ValueError("DDP never rebuilds here: rebuilt must equal first_iteration")

    @classmethod
    def _trusted(cls, lazy: dict[str, Any], **fields: Any) -> BucketPlan:
        """A plan the planner built, without ``__post_init__``'s checks. ``lazy``: the
        bucket lists, each a value, a callable that builds it on first access, or the
        name of the field it is (``rebuilt`` is ``first_iteration`` without a rebuild)."""
        plan = cls.__new__(cls)
        plan.__dict__.update(fields)
        ready = {name: value for name, value in lazy.items() if isinstance(value, list)}
        plan.__dict__.update(ready, _pending={k: v for k, v in lazy.items() if k not in ready})
        return plan

    if not TYPE_CHECKING:  # for mypy every attribute is declared: no catch-all here

        def __getattr__(self, name: str) -> Any:
            # Only a field not yet in the instance's dict gets here: a pending one.
            pending = self.__dict__.get("_pending")
            if not pending or name not in pending:
                raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
            make = pending[name]
            value = getattr(self, make) if isinstance(make, str) else make()
            # setdefault: a second thread building the same list keeps the first one's,
            # so that ``rebuilt is first_iteration`` holds where it should.
            return self.__dict__.setdefault(name, value)

    @property
    def rebuilds(self) -> bool:
        """False when ``find_unused_parameters=True`` without ``static_graph``."""
        return self.static_graph or not self.find_unused_parameters

    @property
    def rebuilt_from_iteration(self) -> int | None:
        """First iteration that uses ``rebuilt`` (2; 3 with ``static_graph``; None: never)."""
        return None if not self.rebuilds else 3 if self.static_graph else 2

    def iteration(self, n: int) -> list[Bucket]:
        """Buckets in use at training iteration ``n`` (1-based, synchronised backwards)."""
        if not isinstance(n, int) or n < 1:
            raise ValueError(f"iteration numbers start at 1, got {n!r}")
        start = self.rebuilt_from_iteration
        return self.rebuilt if start is not None and n >= start else self.first_iteration

    def bucket_of(self, fqn: str, iteration: int | None = None) -> Bucket:
        """The bucket holding ``fqn`` at ``iteration`` (default: after the rebuild)."""
        rebuilt = iteration is None or self.iteration(iteration) is self.rebuilt
        found = (self._rebuilt_index if rebuilt else self._first_index).get(fqn)
        if found is not None:
            return found
        close = difflib.get_close_matches(fqn, self.param_order, n=3)
        raise KeyError(
            f"{fqn!r} is not a planned parameter" + (f"; did you mean {close}?" if close else "")
        )

    @functools.cached_property
    def _first_index(self) -> dict[str, Bucket]:
        return {fqn: b for b in self.first_iteration for fqn in b.fqns}

    @functools.cached_property
    def _rebuilt_index(self) -> dict[str, Bucket]:
        return {fqn: b for b in self.rebuilt for fqn in b.fqns}

    @property
    def bucket_cap_bytes(self) -> int:
        return self.caps.bucket_cap_bytes

    @property
    def first_bucket_cap_bytes(self) -> int:
        return self.caps.first_bucket_cap_bytes


def plan_buckets(
    model_or_named_params: nn.Module | Iterable[tuple[str, torch.Tensor | ParamSpec]],
    *,
    bucket_cap_mb: float | None = None,
    bucket_cap_mb_list: list[float] | None = None,
    find_unused_parameters: bool = False,
    static_graph: bool = False,
    ready_order: list[str] | None = None,
    example_inputs: Any = None,
    loss_fn: Callable[[Any], torch.Tensor] | None = None,
    delay_all_reduce_named_params: list[str] | list[tuple[str, Any]] | None = None,
    param_to_hook_all_reduce: str | torch.Tensor | None = None,
) -> BucketPlan:
    """Predict DDP's buckets for a model (or ``(fqn, tensor | ParamSpec)`` pairs).

    Takes DDP's own bucket arguments. The rebuild follows ``ready_order`` (fqns, first
    gradient ready first), or the order seen in one local backward on a copy of the
    model with ``example_inputs`` (a tensor, a tuple of positional inputs or a dict of
    keyword inputs, as every planner takes them: ``example_inputs.py``), or else reverse
    registration order. That backward starts from ``loss_fn(outputs)`` (outputs -> a
    scalar, as your training loss), else from the sum of every output: give ``loss_fn``
    when the loss ignores an output (BERT's pooler), so its parameters count as unused. Meta tensors
    and ``ParamSpec`` plan without memory. ``delay_all_reduce_named_params`` (fqns or
    DDP's ``(name, param)`` pairs) leave every bucket and are listed in
    ``BucketPlan.delayed``; ``param_to_hook_all_reduce`` (optional here) only names the
    hook there. See Note [DDP buckets] above.
    """
    caps = BucketCaps.from_mb(bucket_cap_mb, bucket_cap_mb_list)
    if isinstance(model_or_named_params, torch.nn.parallel.DistributedDataParallel):
        model_or_named_params = model_or_named_params.module  # DDP's names are the module's
    if not isinstance(model_or_named_params, nn.Module):
        model_or_named_params = list(model_or_named_params)  # read twice when delaying
    names = delay_names(delay_all_reduce_named_params)
    delayed, ignore = None, frozenset[str]()
    with _gc_paused():
        columns = ParamColumns.of(model_or_named_params)
        if not len(columns):
            raise ValueError(
                "no trainable parameters (requires_grad=True) to plan; DDP would refuse "
                "this model too: unfreeze at least one parameter"
            )
        if names or param_to_hook_all_reduce is not None:
            params, delayed, ignore = split_delayed(
                model_or_named_params, columns.rows(), names, param_to_hook_all_reduce
            )
            columns = ParamColumns.from_rows(params)
    rebuilds = static_graph or not find_unused_parameters
    order, source, unused = resolve_ready_order(
        model_or_named_params,
        columns.fqns,
        ready_order,
        example_inputs,
        rebuilds,
        static_graph,
        ignore,
        loss_fn,
    )
    first_limits = caps.first_iteration_limits(
        find_unused=find_unused_parameters, static_graph=static_graph
    )
    # The buckets are built on first access (BucketPlan._trusted): the Bucket objects,
    # thousands at 10,000 parameters, cost more than reading the tensors, and a caller
    # that looks up a few parameters or the plan's summary needs none of them.
    limits = caps.rebuild_limits()
    given = None if source is ReadyOrderSource.ASSUMED else order
    first: list[Bucket] | functools.partial[list[Bucket]] = []  # all delayed: no Reducer
    if len(columns):  # registration order; sorted, then reversed (step 4)
        first = functools.partial(_buckets, columns, first_limits, None, ready_order=False)
    rebuilt: Any = "first_iteration"  # the same list when DDP never rebuilds
    if rebuilds and len(columns):
        rebuilt = functools.partial(_buckets, columns, limits, given, ready_order=True)
    # Valid by construction: __post_init__'s checks were a fifth of planning 10,000
    # parameters (tests/unit/test_bucket_plan.py runs them on planned layouts).
    return BucketPlan._trusted(
        {"first_iteration": first, "rebuilt": rebuilt},
        param_order=columns.fqns,
        ready_order=order,
        ready_order_source=source,
        caps=caps,
        find_unused_parameters=find_unused_parameters,
        static_graph=static_graph,
        unused=unused,
        delayed=delayed,
    )


def _buckets(
    columns: ParamColumns, limits: list[int], order: list[str] | None, *, ready_order: bool
) -> list[Bucket]:
    """One phase's buckets: the construction's (registration order, numbered from the
    last bucket) or, with ``ready_order``, the rebuild's in ``order`` (None: reverse
    registration, DDP's guess)."""
    with _gc_paused():
        count = len(columns)
        if not ready_order:
            return columns.plan(Bucket, range(count), limits, ready_order=False, reverse=True)
        walk: Sequence[int] = range(count - 1, -1, -1)
        if order is not None:
            index = {fqn: i for i, fqn in enumerate(columns.fqns)}
            walk = list(map(index.__getitem__, order))
        return columns.plan(Bucket, walk, limits, ready_order=True)


@contextlib.contextmanager
def _gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector (planning allocates no reference cycles).

    Planning makes a few small containers per parameter; with torch's large heap the
    collector's passes took half the time for 10,000 parameters.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
