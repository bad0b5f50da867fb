"""The split planner on hand-built graphs: DDPOptimizer's bucket walk and split_module's
region copies and partition order, case by case (no torch; the same planner against
the real DDPOptimizer is tests/integration/test_splits_plan_vs_ddpo.py)."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import pytest

from interactive_shard.splits.events import (
    ENTER_AUTOCAST,
    EXIT_AUTOCAST,
    SET_GRAD,
    Call,
    GraphNode,
    ParamUse,
    Region,
    State,
)
from interactive_shard.splits.plan import (
    DEFAULT_FIRST_BUCKET_BYTES,
    MIB,
    SplitPlanError,
    buckets,
    caps,
    plan_graph,
    regions_of,
    skipped_reason,
)

LINEAR = "torch._C._nn.linear"


# -- building graphs -------------------------------------------------------------------------
@dataclass
class N:
    """A node to build: its inputs by name, the parameters it counts as (fqn, bytes)."""

    name: str
    inputs: tuple[str, ...] = ()
    params: tuple[tuple[str, int], ...] = ()
    target: str = LINEAR
    state: State | None = None
    op: str = "call_function"
    module: str | None = None
    module_params: tuple[tuple[str, int], ...] = ()


def graph(*nodes: N, outputs: tuple[str, ...] | None = None) -> list[GraphNode]:
    """GraphNode records with users worked out; the last node feeds the output by default."""
    users: dict[str, list[str]] = defaultdict(list)
    for n in nodes:
        for i in n.inputs:
            users[i].append(n.name)
    for o in outputs if outputs is not None else (nodes[-1].name,):
        users[o].append("output")
    return [
        GraphNode(
            name=n.name,
            op=n.op,  # type: ignore[arg-type]
            target=n.target,
            inputs=list(n.inputs),
            users=users[n.name],
            module=n.module,
            module_params=[ParamUse(f"L_{f}_", f, b) for f, b in n.module_params],
            arg_params=[ParamUse(f"L_{f}_", f, b) for f, b in n.params],
            state=n.state,
        )
        for n in nodes
    ]


def chain(*sizes: int, first_input: str = "x") -> list[N]:
    """``l0 -> l1 -> ...``, layer ``i`` holding ``w{i}`` of ``sizes[i]`` bytes."""
    out = []
    prev = first_input
    for i, size in enumerate(sizes):
        out.append(N(f"l{i}", (prev,), ((f"w{i}", size),)))
        prev = f"l{i}"
    return out


ENTER = State(call="enter_autocast", device_type="cpu", dtype="torch.bfloat16", enabled=True)


def enter(name: str = "enter") -> N:
    return N(name, target=ENTER_AUTOCAST, state=ENTER)


def exit_(of: str = "enter", name: str = "exit") -> N:
    return N(name, (of,), target=EXIT_AUTOCAST, state=State(call="exit_autocast", enter=of))


def set_grad(name: str, flag: bool) -> N:
    return N(name, target=SET_GRAD, state=State(call="set_grad", enabled=flag))


def fqns(nodes: list[GraphNode], cap: int, first: int) -> list[list[str]]:
    return [p.fqns for p in plan_graph(nodes, cap, first).partitions]


# -- step 1-2: caps --------------------------------------------------------------------------
def test_a_bucket_holding_exactly_the_cap_is_full() -> None:
    nodes = graph(*chain(100, 100, 100))
    assert fqns(nodes, 100, 100) == [["w0"], ["w1"], ["w2"]]
    assert fqns(nodes, 101, 101) == [["w0"], ["w2", "w1"]]
    assert fqns(nodes, 300, 300) == [["w2", "w1", "w0"]]


def test_the_first_bucket_is_the_end_of_forward_under_its_own_cap() -> None:
    nodes = graph(*chain(100, 100, 100))
    plan = plan_graph(nodes, 300, 100)
    assert [p.fqns for p in plan.partitions] == [["w1", "w0"], ["w2"]]
    assert [p.nbytes for p in plan.partitions] == [200, 100]
    assert [p.name for p in plan.partitions] == ["submod_0", "submod_1"]
    # Only the first bucket: later ones fill to the cap.
    assert fqns(graph(*chain(100, 100, 100, 100)), 200, 100) == [["w0"], ["w2", "w1"], ["w3"]]


def test_one_bucket_compiles_whole() -> None:
    nodes = graph(*chain(100, 100, 100))
    (whole,) = plan_graph(nodes, 1000, 1000).partitions
    assert (whole.name, whole.index, whole.nbytes) == ("graph", 0, 300)
    assert whole.fqns == ["w2", "w1", "w0"]  # counted in reverse: gradient-ready order
    assert whole.param_bytes == [100, 100, 100]
    assert whole.targets == [LINEAR] * 3


def test_a_shared_parameter_counts_at_every_use_and_is_listed_once() -> None:
    nodes = graph(N("a", ("x",), (("w", 100),)), N("b", ("a",), (("w", 100),)))
    (whole,) = plan_graph(nodes, 1000, 1000).partitions
    assert whole.nbytes == 200 and whole.fqns == ["w"]
    # ... and the second use alone fills a 100-byte bucket.
    assert fqns(nodes, 100, 100) == [["w"], ["w"]]


def test_a_module_counts_its_parameters_once() -> None:
    lin = (("m.weight", 60), ("m.bias", 40))
    nodes = graph(
        N("a", ("x",), op="call_module", target="m", module="m", module_params=lin),
        N("b", ("a",), op="call_module", target="m", module="m", module_params=lin),
    )
    (whole,) = plan_graph(nodes, 1000, 1000).partitions
    assert whole.nbytes == 100 and whole.fqns == ["m.weight", "m.bias"]
    found = buckets(nodes, 1000, 1000)
    assert [n.name for n in found[0].nodes] == ["b", "a"]  # counted at b, the later use


def test_get_attr_parameters_count_but_are_not_calls() -> None:
    nodes = graph(N("p", op="get_attr", target="p", params=(("p", 50),)), N("a", ("x", "p")))
    (whole,) = plan_graph(nodes, 1000, 1000).partitions
    assert whole.nbytes == 50 and whole.fqns == ["p"]
    assert [c.name for c in whole.calls] == ["a"]


# -- step 3: preamble, extended buckets ------------------------------------------------------
def test_a_parameter_free_preamble_joins_the_first_partition() -> None:
    pre = [N("pre_a", ("x",), target="torch.tanh"), N("pre_b", ("pre_a",), target="mul")]
    nodes = graph(*pre, *chain(100, 100, first_input="pre_b"))
    found = buckets(nodes, 100, 100)
    assert [b.size for b in found] == [100, 100]
    first, second = plan_graph(nodes, 100, 100).partitions
    assert first.targets == ["torch.tanh", "mul", LINEAR] and first.fqns == ["w0"]
    assert second.targets == [LINEAR]


def test_a_model_without_parameters_is_one_empty_partition() -> None:
    nodes = graph(N("a", ("x",), target="torch.tanh"), N("b", ("a",), target="torch.relu"))
    (whole,) = plan_graph(nodes, 100, 100).partitions
    assert (whole.name, whole.nbytes, whole.fqns) == ("graph", 0, [])


def test_a_full_bucket_without_external_output_is_extended() -> None:
    # lp -> l0 -> output; l0 -> probe -> copy_ (no users): the reverse walk starts with
    # copy_ and probe, a full bucket no value of which leaves it.
    nodes = graph(
        N("lp", ("x",), (("wp", 100),)),
        N("l0", ("lp",), (("w0", 100),)),
        N("probe", ("l0",), (("probe.w", 100),)),
        N("copy_", ("buf", "probe"), target="copy_", op="call_method"),
        outputs=("l0",),
    )
    found = buckets(nodes, 100, 100)
    assert [b.extended for b in found] == [0, 1]
    first, last = plan_graph(nodes, 100, 100).partitions
    assert first.fqns == ["wp"] and first.extended == 0
    assert last.fqns == ["probe.w", "w0"] and last.extended == 1 and last.nbytes == 200
    assert last.targets == [LINEAR, LINEAR, "copy_"]


def test_extending_stops_once_the_bucket_has_an_output() -> None:
    nodes = graph(
        *chain(100, 100, 100),
        N("probe", ("l2",), (("probe.w", 100),)),
        N("copy_", ("buf", "probe"), target="copy_", op="call_method"),
        outputs=("l2",),
    )
    assert fqns(nodes, 100, 100) == [["w0"], ["w1"], ["probe.w", "w2"]]
    assert [p.extended for p in plan_graph(nodes, 100, 100).partitions] == [0, 0, 1]


# -- step 4: split_module's region copies ------------------------------------------------------
def _state_calls(p: list[Call]) -> list[tuple[str, str]]:
    return [(c.target.rpartition(".")[2], c.name) for c in p if c.state is not None]


def test_autocast_over_three_partitions_is_entered_and_left_in_each() -> None:
    nodes = graph(enter(), *chain(100, 100, 100), exit_(), outputs=("l2",))
    plan = plan_graph(nodes, 100, 100)
    a, b, c = plan.partitions
    # The original enter (folded into partition 0 with the preamble) and exit stay
    # where they were; copies enter at the start of later partitions and exit at the
    # end of earlier ones.
    assert a.targets == [ENTER_AUTOCAST, LINEAR, EXIT_AUTOCAST]
    assert b.targets == [ENTER_AUTOCAST, LINEAR, EXIT_AUTOCAST]
    assert c.targets == [ENTER_AUTOCAST, LINEAR, EXIT_AUTOCAST]
    assert [c.name for c in a.calls] == ["enter", "l0", "exit"]
    region = Region(
        kind="autocast",
        enters=True,
        exits=True,
        device_type="cpu",
        dtype="torch.bfloat16",
        enabled=True,
    )
    assert a.regions == b.regions == c.regions == [region]


def test_autocast_over_part_of_the_graph_is_copied_only_where_it_is_active() -> None:
    nodes = graph(
        N("l0", ("x",), (("w0", 100),)),
        enter(),
        N("l1", ("l0",), (("w1", 100),)),
        exit_(),
        N("l2", ("l1",), (("w2", 100),)),
        N("l3", ("l2",), (("w3", 100),)),
    )
    a, b, c, d = plan_graph(nodes, 100, 100).partitions
    assert a.targets == [LINEAR, ENTER_AUTOCAST, EXIT_AUTOCAST]  # enter, exit copy
    assert [r.enters for r in a.regions] == [True] and a.regions[0].exits
    assert b.targets == [ENTER_AUTOCAST, LINEAR, EXIT_AUTOCAST]  # enter copy, original exit
    assert c.targets == [LINEAR] and c.regions == []
    assert d.regions == []


def test_nested_autocast_copies_enter_in_order_and_exit_in_reverse() -> None:
    off = State(call="enter_autocast", device_type="cpu", dtype=None, enabled=False)
    nodes = graph(
        enter("outer"),
        *chain(100),
        N("inner", target=ENTER_AUTOCAST, state=off),
        N("l1", ("l0",), (("w1", 100),)),
        exit_("inner", "exit_inner"),
        N("l2", ("l1",), (("w2", 100),)),
        exit_("outer", "exit_outer"),
        outputs=("l2",),
    )
    a, b, c = plan_graph(nodes, 100, 100).partitions
    assert _state_calls(b.calls) == [
        ("_enter_autocast", "outer"),
        ("_enter_autocast", "inner"),
        ("_exit_autocast", "exit_inner"),
        ("_exit_autocast", "exit_outer"),
    ]
    assert [(r.dtype, r.enabled) for r in b.regions] == [("torch.bfloat16", True), (None, False)]
    assert all(r.enters and r.exits for p in (a, b) for r in p.regions)
    assert [r.enabled for r in c.regions] == [True]  # only the outer one is left
    assert b.regions[1].describe() == "autocast(cpu, None) disabled [enters, exits]"


def test_no_grad_is_set_at_the_start_of_every_later_partition() -> None:
    nodes = graph(
        set_grad("off", False), *chain(100, 100, 100), set_grad("on", True), outputs=("l2",)
    )
    a, b, c = plan_graph(nodes, 100, 100).partitions
    assert a.targets == [SET_GRAD, LINEAR]
    assert b.targets == [SET_GRAD, LINEAR]
    assert c.targets == [SET_GRAD, LINEAR, SET_GRAD]  # the restore stays in the last one
    assert [(r.enabled, r.enters, r.exits) for r in a.regions] == [(False, True, False)]
    assert [(r.enabled, r.exits) for r in c.regions] == [(False, True), (True, False)]


def test_grad_toggled_mid_graph_reaches_only_the_partitions_after_it() -> None:
    nodes = graph(
        *chain(100),
        set_grad("off", False),
        N("l1", ("l0",), (("w1", 100),)),
        set_grad("on", True),
        N("l2", ("l1",), (("w2", 100),)),
        N("l3", ("l2",), (("w3", 100),)),
    )
    a, b, c, d = plan_graph(nodes, 100, 100).partitions
    assert a.targets == [LINEAR, SET_GRAD]
    assert b.targets == [SET_GRAD, LINEAR, SET_GRAD]
    # Grad back on: that region, too, is set at the start of every later partition.
    assert c.targets == [SET_GRAD, LINEAR] and c.regions[0].enabled is True
    assert d.targets == [SET_GRAD, LINEAR]


def test_autocast_and_grad_copies_come_autocast_first() -> None:
    nodes = graph(
        set_grad("off", False),
        enter(),
        *chain(100, 100),
        exit_(),
        set_grad("on", True),
        outputs=("l1",),
    )
    a, b = plan_graph(nodes, 100, 100).partitions
    assert [c.target for c in b.calls] == [
        ENTER_AUTOCAST,
        SET_GRAD,
        LINEAR,
        EXIT_AUTOCAST,
        SET_GRAD,
    ]
    assert [r.kind for r in b.regions] == ["autocast", "grad", "grad"]
    assert a.targets == [SET_GRAD, ENTER_AUTOCAST, LINEAR, EXIT_AUTOCAST]


# -- step 4: split_module's partition order ------------------------------------------------
def test_independent_partitions_run_in_split_modules_stack_order() -> None:
    # x -> a0 -> a1 ─┐
    # x -> b0 -> b1 ─┴ add -> h
    nodes = graph(
        N("a0", ("x",), (("a0", 100),)),
        N("a1", ("a0",), (("a1", 100),)),
        N("b0", ("x",), (("b0", 100),)),
        N("b1", ("b0",), (("b1", 100),)),
        N("add", ("a1", "b1"), target="_operator.add"),
        N("h", ("add",), (("h", 100),)),
    )
    plan = plan_graph(nodes, 100, 100)
    # Roots submod_0 and submod_2 (no pending inputs); the stack pops submod_2 first.
    assert [p.name for p in plan.partitions] == [
        "submod_2",
        "submod_0",
        "submod_1",
        "submod_3",
        "submod_4",
    ]
    assert [p.index for p in plan.partitions] == [0, 1, 2, 3, 4]
    assert [p.fqns for p in plan.partitions] == [["b0"], ["a0"], ["a1"], ["b1"], ["h"]]


def test_global_state_nodes_carry_no_dependency() -> None:
    # The exit in partition 1 reads the enter of partition 0: not a dependency, so
    # partition 1 (whose other inputs are x and its own nodes) is a root too and, popped
    # off the stack first, runs first.
    nodes = graph(
        enter(),
        N("a", ("x",), (("a", 100),)),
        N("b", ("x",), (("b", 100),)),
        exit_(),
        N("c", ("b",), target="torch.relu"),
        outputs=("a", "c"),
    )
    plan = plan_graph(nodes, 100, 100)
    assert [p.name for p in plan.partitions] == ["submod_1", "submod_0"]


# -- regions_of on a partition's calls -------------------------------------------------------
def test_regions_of_an_exit_without_its_enter() -> None:
    calls = [
        Call(name="l", op="call_function", target=LINEAR),
        Call(
            name="exit",
            op="call_function",
            target=EXIT_AUTOCAST,
            state=State(call="exit_autocast", enter="elsewhere"),
        ),
    ]
    assert regions_of(calls) == [Region(kind="autocast", enters=False, exits=True)]
    assert regions_of(calls[:1]) == []


def test_regions_of_two_set_grads_closes_the_first() -> None:
    calls = [
        Call(name=n, op="call_function", target=SET_GRAD, state=State(call="set_grad", enabled=f))
        for n, f in (("a", False), ("b", True), ("c", False))
    ]
    assert [(r.enabled, r.enters, r.exits) for r in regions_of(calls)] == [
        (False, True, True),
        (True, True, True),
        (False, True, False),
    ]


# -- caps and what compiles nothing ---------------------------------------------------------
def test_caps_in_bytes() -> None:
    assert caps(25, None) == (25 * MIB, DEFAULT_FIRST_BUCKET_BYTES)
    assert caps(1, None) == (MIB, MIB)
    assert caps(0.5, 0.25) == (MIB // 2, MIB // 4)


@pytest.mark.parametrize("cap", [0.5, 0.999])
def test_caps_below_the_first_bucket_name_the_value_and_the_fix(cap: float) -> None:
    with pytest.raises(SplitPlanError) as err:
        caps(cap, None)
    text = str(err.value)
    assert f"bucket_cap_mb={cap}" in text
    assert "bucket_cap_mb >= 1" in text and "first_bucket_cap_mb" in text
    assert "First bucket should be smaller/equal" in text  # what torch.compile would say


@pytest.mark.parametrize("cap", [0, -1, float("nan")])
def test_non_positive_caps_are_refused(cap: float) -> None:
    with pytest.raises(SplitPlanError, match="give a positive size in MiB"):
        caps(cap, None)


def test_first_cap_above_the_cap_is_refused() -> None:
    with pytest.raises(SplitPlanError, match="first_bucket_cap_mb"):
        caps(2, 4)


def test_skipped_reason() -> None:
    reason = skipped_reason("torch.nn.modules.container", "Sequential")
    assert reason is not None and "Sequential.forward" in reason and "torch.nn" in reason
    assert skipped_reason("my_project.models", "Net") is None
