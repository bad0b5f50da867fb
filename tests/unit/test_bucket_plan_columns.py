"""The planner's columns and lazily built buckets against torch's own assignment.

``plan_buckets`` reads the parameters into columns (``buckets/_columns.py``) and builds
each phase's ``Bucket`` objects on first access; these tests check that whatever the
layout (dtypes, devices, sparse gradients, frozen tensors, caps, phases, ready order)
the buckets are exactly the ones torch's ``_compute_bucket_assignment_by_size``
computes, and that the lazy plan behaves as a plain frozen dataclass.
"""

from __future__ import annotations

import copy
import dataclasses
import pickle
import sys
from typing import Any

import pytest
import torch
import torch.distributed as dist
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from interactive_shard.buckets import Bucket, BucketPlan, ParamSpec, _assign, plan_buckets
from interactive_shard.buckets._assign import BucketCaps, spans

torch_assign = getattr(dist, "_compute_bucket_assignment_by_size", None)
pytestmark = pytest.mark.skipif(torch_assign is None, reason="torch lacks the function")

DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.float64, torch.int8]
SHAPES = [(0,), (1,), (3,), (8, 8), (64,), (300,), (16, 64), (1024,)]


def torch_plan(
    tensors: list[torch.Tensor],
    sparse: list[bool],
    ready: list[int],
    caps: BucketCaps,
    *,
    find_unused: bool,
    static_graph: bool,
) -> tuple[list[list[int]], list[list[int]], list[int], list[int]]:
    """Reducer indices per bucket and each bucket's limit, as DDP asks torch for them:
    the construction (sorted, then reversed) and the rebuild in ``ready`` order."""
    assert torch_assign is not None
    first_limits = caps.first_iteration_limits(find_unused=find_unused, static_graph=static_graph)
    first, first_caps = torch_assign(tensors, first_limits, sparse)
    first, first_caps = first[::-1], first_caps[::-1]
    if find_unused and not static_graph:
        return first, first, first_caps, first_caps
    walk = [tensors[i] for i in ready]
    # The sparse flags stay in reducer order: the C++ reads them by tensor index.
    rebuilt, rebuilt_caps = torch_assign(walk, caps.rebuild_limits(), sparse, ready)
    return first, rebuilt, first_caps, rebuilt_caps


def indices(plan: BucketPlan, buckets: list[Bucket]) -> list[list[int]]:
    index = {fqn: i for i, fqn in enumerate(plan.param_order)}
    return [[index[f] for f in b.fqns] for b in buckets]


layouts = st.lists(
    st.tuples(
        st.sampled_from(SHAPES),
        st.sampled_from(DTYPES),
        st.sampled_from(["meta", "cpu"]),
        st.booleans(),  # sparse gradient (ParamSpec only)
    ),
    min_size=1,
    max_size=40,
)
cap_choices: st.SearchStrategy[dict[str, Any]] = st.one_of(
    st.just({}),
    st.fixed_dictionaries({"bucket_cap_mb": st.sampled_from([0, 0.0005, 0.003, 0.02, 1])}),
    st.fixed_dictionaries(
        {
            "bucket_cap_mb_list": st.lists(
                st.sampled_from([0, 0.0005, 0.002, 0.01]), min_size=1, max_size=4
            )
        }
    ),
)


@given(
    layout=layouts,
    caps=cap_choices,
    find_unused=st.booleans(),
    static_graph=st.booleans(),
    specs=st.booleans(),
    data=st.data(),
)
@settings(max_examples=80, deadline=None)
def test_random_layouts_plan_as_torch_assigns(
    layout: list[tuple[tuple[int, ...], torch.dtype, str, bool]],
    caps: dict,
    find_unused: bool,
    static_graph: bool,
    specs: bool,
    data: st.DataObject,
) -> None:
    n = len(layout)
    tensors = [torch.empty(shape, dtype=dtype, device="meta") for shape, dtype, _, _ in layout]
    sparse = [specs and flag for *_, flag in layout]
    if specs:  # ParamSpec: devices and sparse gradients too
        params: list = [
            (f"p{i}", ParamSpec(shape, dtype, device, flag and specs))
            for i, (shape, dtype, device, flag) in enumerate(layout)
        ]
        keyed = [torch.empty(s, dtype=d, device=v) for s, d, v, _ in layout]
    else:
        params, keyed = [(f"p{i}", t) for i, t in enumerate(tensors)], tensors
    order = data.draw(st.one_of(st.none(), st.permutations(range(n))))
    ready = list(order) if order is not None else list(range(n - 1, -1, -1))
    plan = plan_buckets(
        params,
        ready_order=None if order is None else [f"p{i}" for i in order],
        find_unused_parameters=find_unused,
        static_graph=static_graph,
        **caps,
    )
    first, rebuilt, first_caps, rebuilt_caps = torch_plan(
        keyed, sparse, ready, plan.caps, find_unused=find_unused, static_graph=static_graph
    )
    assert indices(plan, plan.first_iteration) == first
    assert indices(plan, plan.rebuilt) == rebuilt
    assert [b.cap_bytes for b in plan.first_iteration] == first_caps
    assert [b.cap_bytes for b in plan.rebuilt] == rebuilt_caps
    for buckets in (plan.first_iteration, plan.rebuilt):
        assert [b.index for b in buckets] == list(range(len(buckets)))
        for b in buckets:  # every per-parameter field matches the parameters it holds
            members = [layout[int(f[1:])] for f in b.fqns]
            assert b.shapes == [shape for shape, *_ in members]
            assert all(type(shape) is tuple for shape in b.shapes)
            assert b.dtypes == [str(dtype) for _, dtype, *_ in members]
            assert b.numels == [t.numel() for t in (keyed[int(f[1:])] for f in b.fqns)]
            assert b.nbytes == sum(keyed[int(f[1:])].nbytes for f in b.fqns)
            assert b.sparse == (b.cap_bytes == 0 and sparse[int(b.fqns[0][1:])])
            assert b.device == str(keyed[int(b.fqns[0][1:])].device)
    # The planner skips BucketPlan's checks (valid by construction): they pass.
    fields = {f.name: getattr(plan, f.name) for f in dataclasses.fields(BucketPlan)}
    assert BucketPlan(**fields) == plan


def by_definition(nbytes: list[int], limits: list[int]) -> list[tuple[int, int, int]]:
    """A tensor joins the open bucket, which closes once its bytes reach the limit;
    then the next limit applies (the last one repeats)."""
    out, start, total, level = [], 0, 0, 0
    for i, size in enumerate(nbytes):
        total += size
        if total >= limits[level]:
            out.append((start, i + 1, limits[level]))
            start, total, level = i + 1, 0, min(level + 1, len(limits) - 1)
    if start < len(nbytes):
        out.append((start, len(nbytes), limits[level]))
    return out


@given(
    nbytes=st.lists(st.integers(0, 5000), min_size=1, max_size=60),
    limits=st.lists(st.sampled_from([0, 1, 100, 999, 4096, 70000, sys.maxsize]), min_size=1),
    repeat=st.sampled_from([1, 20]),  # 20: past _NUMPY_FROM, the vectorised search
)
def test_spans_close_where_the_running_total_reaches_the_limit(
    nbytes: list[int], limits: list[int], repeat: int
) -> None:
    nbytes = nbytes * repeat
    expected = by_definition(nbytes, limits)
    assert spans(nbytes, limits) == expected
    assert _assign._spans_numpy(nbytes, limits) == expected


def test_spans_beyond_int64_search_in_python_ints() -> None:
    huge = [2**62, 2**62, 1, 2**70]  # ParamSpec shapes are unbounded
    assert _assign._spans_numpy(huge * 200, [2**62]) is None
    assert spans(huge * 200, [2**62])[:3] == [(0, 1, 2**62), (1, 2, 2**62), (2, 4, 2**62)]


def test_frozen_tensors_in_pairs() -> None:
    # Frozen Parameters (and tensors marked _is_param) leave, as DDP skips them; a plain
    # tensor without requires_grad stays (a meta layout), as collect_params decides.
    marked = torch.empty(4, device="meta")
    marked._is_param = True
    pairs = [
        ("kept", torch.empty(3, device="meta")),
        ("frozen", nn.Parameter(torch.empty(5), requires_grad=False)),
        ("trained", nn.Parameter(torch.empty(6))),
        ("marked", marked),
    ]
    assert plan_buckets(pairs).param_order == ["kept", "trained"]
    assert plan_buckets(pairs[:1] + pairs[3:]).param_order == ["kept"]
    assert plan_buckets([pairs[0]]).param_order == ["kept"]
    with pytest.raises(ValueError, match="no trainable parameters"):
        plan_buckets([pairs[1]])


def test_lazy_buckets_behave_as_fields() -> None:
    params = [(f"w{i}", torch.empty(64, 64, device="meta")) for i in range(50)]
    plan = plan_buckets(params, bucket_cap_mb=0.05)
    assert plan == pickle.loads(pickle.dumps(plan)) == copy.deepcopy(plan)
    assert "rebuilt=[Bucket(index=0" in repr(plan)
    assert plan.bucket_of("w49") is plan.rebuilt[0]
    assert dataclasses.replace(plan) == plan
    assert not hasattr(plan, "no_such_field")
    never = plan_buckets(params, find_unused_parameters=True, bucket_cap_mb=0.05)
    assert never.rebuilt is never.first_iteration
    assert never.iteration(5) is never.rebuilt
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.rebuilt = []  # type: ignore[misc]
