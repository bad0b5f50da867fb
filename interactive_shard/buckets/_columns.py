"""The planner's parameters as columns, and the buckets of one assignment built from them.

``ParamColumns`` holds one list per field (fqns, shapes, dtypes, devices, numels, byte
counts, sparse flags) rather than one tuple per parameter: at 10,000 parameters the
planner's cost is Python steps per parameter, and columns let the reading of the
tensors, the assignment and each bucket's lists run as C-level ``map``/slices.

``ParamColumns.plan`` is ``_assign.assign_columns`` (torch's
``_compute_bucket_assignment_by_size``) turned into buckets: per ``(dtype, device)``
every bucket is a slice of that key's walk, so each bucket's lists are slices of the
key's columns put in walk order once. See Note [DDP buckets] in ``plan.py``.
"""

from __future__ import annotations

import collections
import functools
import itertools
import math
import operator
from collections.abc import Iterable, Sequence
from typing import Any, TypeVar

import torch
from torch import nn

from interactive_shard.buckets._assign import SPARSE_LIMIT, Key, _open_bucket_order, spans
from interactive_shard.buckets._params import ParamInfo, ParamSpec, collect_params

T = TypeVar("T")

# The instance fields of ``plan.Bucket``, in its order (``_fill`` sets them directly).
BUCKET_FIELDS = (
    "index",
    "fqns",
    "shapes",
    "dtypes",
    "numels",
    "nbytes",
    "cap_bytes",
    "device",
    "sparse",
)
_TENSOR = torch.Tensor
_REQUIRES_GRAD, _IS_SPARSE = operator.attrgetter("requires_grad"), operator.attrgetter("is_sparse")
_SHAPE, _DTYPE, _DEVICE = (operator.attrgetter(a) for a in ("shape", "dtype", "device"))
_SPEC_FIELDS = operator.attrgetter("shape", "dtype", "device", "sparse_grad")
_PLAIN_TENSORS = frozenset({torch.Tensor, nn.Parameter})
_ITEMSIZE: dict[torch.dtype, int] = {}  # dtype.itemsize is a Python property: 0.4 us a call


class ParamColumns:
    """The parameters in the reducer's order, one list per field."""

    def __init__(
        self,
        fqns: list[str],
        shapes: list[tuple[int, ...]],
        dtypes: list[torch.dtype],
        devices: list[torch.device],
        numels: list[int],
        sparse: list[bool] | None = None,
    ) -> None:
        self.fqns = fqns
        self.shapes = shapes
        self.dtypes = dtypes
        self.devices = devices
        self.numels = numels
        self.sparse: list[bool] = sparse if sparse is not None else [False] * len(fqns)

    # What only the assignment needs is derived on first use (the buckets are built
    # lazily, and the columns are a snapshot: nothing here reads a tensor).
    @functools.cached_property
    def nbytes(self) -> list[int]:
        kinds = set(self.dtypes)
        for dtype in kinds - _ITEMSIZE.keys():
            _ITEMSIZE[dtype] = dtype.itemsize
        if len(kinds) == 1:
            size = itertools.repeat(_ITEMSIZE[self.dtypes[0]])
            return list(map(operator.mul, self.numels, size))
        return list(map(operator.mul, self.numels, map(_ITEMSIZE.__getitem__, self.dtypes)))

    @functools.cached_property
    def names(self) -> dict[Key, tuple[str, str]]:
        """Each ``(dtype, device)`` key present, with the strings a bucket shows."""
        if len(set(self.dtypes)) == len(set(self.devices)) == 1:
            keys = {(self.dtypes[0], self.devices[0])}
        else:
            keys = set(zip(self.dtypes, self.devices, strict=True))
        return {key: (str(key[0]), str(key[1])) for key in keys}

    @property
    def one_key(self) -> bool:
        """One ``(dtype, device)`` and no sparse gradient: every bucket a slice of the walk."""
        return len(self.names) == 1 and not any(self.sparse)

    def __len__(self) -> int:
        return len(self.fqns)

    @classmethod
    def of(cls, source: nn.Module | list[tuple[str, Any]]) -> ParamColumns:
        """``collect_params(source)`` as columns (the same checks and errors)."""
        if not isinstance(source, nn.Module):
            fast = _common_pairs(source)
            if fast is not None:
                return fast
        return cls.from_rows(collect_params(source))

    @classmethod
    def from_rows(cls, params: Iterable[ParamInfo]) -> ParamColumns:
        rows = list(params)
        if not rows:
            return cls([], [], [], [], [], [])
        fqns, shapes, dtypes, devices, numels, _, sparse = map(list, zip(*rows, strict=True))
        return cls(fqns, shapes, dtypes, devices, numels, sparse)

    def rows(self) -> list[ParamInfo]:
        """One ``ParamInfo`` per parameter (for the delayed-parameter path)."""
        columns = (self.fqns, self.tuples, self.dtypes, self.devices, self.numels, self.nbytes)
        return list(map(ParamInfo._make, zip(*columns, self.sparse, strict=True)))

    @functools.cached_property
    def tuples(self) -> list[tuple[int, ...]]:
        """The shapes as plain tuples (a tensor's are ``torch.Size``), made once."""
        return list(map(tuple, self.shapes))

    def plan(
        self,
        cls: type[T],
        walk: Sequence[int],
        limits: list[int],
        *,
        ready_order: bool,
        reverse: bool = False,
    ) -> list[T]:
        """The buckets (instances of ``cls``, ``plan.Bucket``) of one assignment, walking
        the parameters in ``walk`` order (``reverse``: numbered from the last one, as
        DDP's construction does)."""
        if self.one_key:
            ((dtype, device),) = self.names.values()
            groups = [self._group(walk, None, limits, dtype, device, len(walk), ready_order)]
        else:
            groups = self._groups(walk, limits, ready_order)
        # Concatenate the groups' buckets, then order them as the C++ appends them.
        parts = [list(itertools.chain.from_iterable(g[i] for g in groups)) for i in range(9)]
        keys = parts.pop()
        # One key in the ready order: the spans are in walk order already, the open one last.
        if not (ready_order and len(groups) == 1) and not _ascending(keys):
            order = sorted(range(len(keys)), key=keys.__getitem__)
            parts = [list(map(part.__getitem__, order)) for part in parts]
        if reverse:
            parts = [part[::-1] for part in parts]
        return _fill(cls, parts)

    def _groups(self, walk: Sequence[int], limits: list[int], ready_order: bool) -> list[_Group]:
        """One group per ``(dtype, device)`` key (first appearance in the walk), then the
        sparse-gradient parameters, each a bucket of its own."""
        keys = list(zip(self.dtypes, self.devices, strict=True))
        members: dict[Key, list[int]] = {}
        sparse_positions: list[int] = []
        sparse = self.sparse
        for position, i in enumerate(walk):
            if sparse[i]:
                sparse_positions.append(position)
            else:
                members.setdefault(keys[i], []).append(position)
        # Step 3: the buckets still open at the end follow every closed one, in the
        # reducer's hash-map order.
        after = {key: len(walk) + r for r, key in enumerate(_open_bucket_order(tuple(members)))}
        groups = [
            self._group(walk, positions, limits, *self.names[key], after[key], ready_order)
            for key, positions in members.items()
        ]
        if sparse_positions:
            groups.append(self._sparse_group(walk, sparse_positions, ready_order))
        return groups

    def _group(
        self,
        walk: Sequence[int],
        positions: list[int] | None,
        limits: list[int],
        dtype: str,
        device: str,
        open_place: int,
        ready_order: bool,
    ) -> _Group:
        """The buckets of one key: its parameters (at ``positions`` of the walk; None:
        all) in walk order, cut by ``spans``. Per bucket: the eight ``Bucket`` fields
        after ``index`` and its sort key: with ``ready_order`` where it closed in the
        walk (the crossing tensor's position; an open bucket: ``open_place``), else
        the smallest reducer index it holds (step 4)."""
        indices = list(walk) if positions is None else list(map(walk.__getitem__, positions))
        fqns = list(map(self.fqns.__getitem__, indices))
        shapes = list(map(self.tuples.__getitem__, indices))
        numels = list(map(self.numels.__getitem__, indices))
        nbytes = list(map(self.nbytes.__getitem__, indices))
        cuts = spans(nbytes, limits)
        starts, stops, caps = (list(c) for c in zip(*cuts, strict=True))
        cut = list(map(slice, starts, stops))
        total = list(itertools.accumulate(nbytes, initial=0))
        sizes = list(
            map(operator.sub, map(total.__getitem__, stops), map(total.__getitem__, starts))
        )
        if ready_order:
            # A closed bucket's place is its crossing tensor's; only the last can be open.
            where = positions if positions is not None else range(len(indices))
            keys = list(map(where.__getitem__, map(operator.sub, stops, itertools.repeat(1))))
            if sizes[-1] < caps[-1]:
                keys[-1] = open_place
        elif _ascending(indices):  # the construction walks registration order
            keys = list(map(indices.__getitem__, starts))
        else:
            keys = list(map(min, map(indices.__getitem__, cut)))
        return [
            list(map(fqns.__getitem__, cut)),
            list(map(shapes.__getitem__, cut)),
            list(map(operator.mul, itertools.repeat([dtype]), map(operator.sub, stops, starts))),
            list(map(numels.__getitem__, cut)),
            sizes,
            caps,
            [device] * len(cuts),
            [False] * len(cuts),
            keys,
        ]

    def _sparse_group(self, walk: Sequence[int], positions: list[int], ready_order: bool) -> _Group:
        """Step 1: each sparse-gradient parameter is a bucket of its own, where it is met."""
        indices = list(map(walk.__getitem__, positions))
        names = [self.names[(self.dtypes[i], self.devices[i])] for i in indices]
        return [
            [[self.fqns[i]] for i in indices],
            [[self.tuples[i]] for i in indices],
            [[dtype] for dtype, _ in names],
            [[self.numels[i]] for i in indices],
            list(map(self.nbytes.__getitem__, indices)),
            [SPARSE_LIMIT] * len(indices),
            [device for _, device in names],
            [True] * len(indices),
            list(positions) if ready_order else indices,
        ]


# Per bucket of a group: fqns, shapes, dtypes, numels, nbytes, cap_bytes, device, sparse,
# and its sort key (ParamColumns._group).
_Group = list[list[Any]]


def _ascending(values: list[int]) -> bool:
    return all(map(operator.le, values, itertools.islice(values, 1, None)))


def _fill(cls: type[T], parts: list[list[Any]]) -> list[T]:
    """Instances of ``cls`` (a plain class with an instance ``__dict__``: ``plan.Bucket``)
    from the field columns, without ``__init__``: C-level maps that build each
    instance's dict, where a frozen dataclass's ``__init__`` is a Python call per bucket
    (valid by construction: the planner made them)."""
    count = len(parts[0])
    values = zip(range(count), *parts, strict=True)
    dicts = map(dict, map(zip, itertools.repeat(BUCKET_FIELDS), values))
    out = list(map(object.__new__, itertools.repeat(cls, count)))
    collections.deque(map(dict.update, map(vars, out), dicts), maxlen=0)
    return out


def _common_pairs(pairs: list[Any]) -> ParamColumns | None:
    """``collect_params`` of the common input as columns: ``(str, Tensor)`` pairs or
    ``(str, ParamSpec)`` pairs, none sparse, each tensor once, each name once. Each
    attribute is one C-level ``map`` over the tensors, the flags only ``all``/``any``
    (torch attributes are the cost: one ``attrgetter`` of all five was slower than five
    maps, a comprehension slower still). None when any of that does not hold:
    ``collect_params``'s loop then says which pair is wrong."""
    if not pairs or set(map(type, pairs)) != {tuple} or set(map(len, pairs)) != {2}:
        return None
    names: Sequence[str]
    values: Sequence[Any]
    names, values = zip(*pairs, strict=True)
    kinds = set(map(type, values))
    if set(map(type, names)) != {str} or len(set(names)) != len(names):
        return None
    if kinds == {ParamSpec}:
        shapes, dtypes, devices, sparse = map(list, zip(*map(_SPEC_FIELDS, values), strict=True))
        numels = list(map(math.prod, shapes))
        return ParamColumns(list(names), shapes, dtypes, devices, numels, sparse)
    if not kinds <= _PLAIN_TENSORS or len(set(map(id, values))) != len(values):
        return None
    if not all(map(_REQUIRES_GRAD, values)):  # frozen Parameters leave: DDP skips them
        values, names = _without_frozen(values, names, kinds)
        if not values:
            return ParamColumns([], [], [], [], [], [])
    if any(map(_IS_SPARSE, values)):
        return None
    return ParamColumns(
        list(names),
        list(map(_SHAPE, values)),  # torch.Size: tuples, made plain ones where a bucket shows them
        list(map(_DTYPE, values)),
        list(map(_DEVICE, values)),
        list(map(_TENSOR.numel, values)),
    )


def _without_frozen(
    values: Sequence[torch.Tensor], names: Sequence[str], kinds: set[type]
) -> tuple[Sequence[torch.Tensor], Sequence[str]]:
    """The pairs without frozen parameters: a tensor with ``requires_grad=False`` that is
    an ``nn.Parameter`` or marked ``_is_param`` (``_params._is_parameter``); a plain
    frozen tensor stays, as in ``collect_params``. Plain tensors without any instance
    attribute (the common case: meta tensors) cannot be marked, so they all stay."""
    if nn.Parameter not in kinds and not any(map(len, map(vars, values))):
        return values, names
    parameter = nn.Parameter
    keep = [
        t.requires_grad or not (type(t) is parameter or getattr(t, "_is_param", False))
        for t in values
    ]
    return list(itertools.compress(values, keep)), list(itertools.compress(names, keep))
