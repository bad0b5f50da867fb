"""``regions_undone()``: split_module without PR 113374's autocast copies, for real.

In this process with a DDPOptimizer built by hand (TORCH_NOTES: ``backend=ddpo.compile_fn``
compiles a plain module as a DDP model would), and on 2 gloo ranks through ``ish.watch``,
where the capture shows the missing regions and ``compare`` reports them.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch
import torch.fx.passes.split_module as split_module_pass
from torch import fx, nn
from torch._dynamo.backends.distributed import DDPOptimizer
from torch._dynamo.backends.registry import lookup_backend
from torch.nn.parallel import DistributedDataParallel as DDP

import interactive_shard as ish
from interactive_shard.splits.whatif import regions_undone

MIB = 2**20
WIDTH = 512  # Linear(512, 512): 1 MiB of parameters, one partition each at a 1 MiB cap
ENTER, EXIT = torch.amp._enter_autocast, torch.amp._exit_autocast


class AmpNet(nn.Module):
    """A residual MLP whose forward runs under CPU autocast.

    The stream ``x`` stays float32 (float32 + bfloat16 promotes), so the values at the
    cuts are float32 and a partition without its region runs (in float32) instead of
    failing on a bfloat16 input."""

    def __init__(self, depth: int = 3) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(WIDTH, WIDTH) for _ in range(depth))
        self.head = nn.Linear(WIDTH, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.autocast("cpu", torch.bfloat16):
            for layer in self.layers:
                x = x + torch.relu(layer(x))
            return self.head(x)


def _model() -> AmpNet:
    torch.manual_seed(0)
    return AmpNet()


def _batch(seed: int = 0) -> torch.Tensor:
    return torch.randn(4, WIDTH, generator=torch.Generator().manual_seed(seed))


def _targets(gm: fx.GraphModule) -> list[Any]:
    return [n.target for n in gm.graph.nodes if n.target in (ENTER, EXIT)]


def _compile_by_hand(undo: bool) -> tuple[torch.Tensor, list[fx.GraphModule], Any]:
    """torch.compile through a DDPOptimizer of our own (1 MiB caps), aot_eager."""
    received: list[fx.GraphModule] = []
    aot_eager = lookup_backend("aot_eager")

    def backend(gm: fx.GraphModule, example_inputs: Any) -> Any:
        received.append(gm)
        return aot_eager(gm, example_inputs)

    torch._dynamo.reset()
    ddpo = DDPOptimizer(bucket_bytes_cap=MIB, backend_compile_fn=backend)
    compiled = torch.compile(_model(), backend=ddpo.compile_fn)
    undone = None
    if undo:
        with regions_undone() as undone:
            out = compiled(_batch())
    else:
        out = compiled(_batch())
    return out, received, undone


@pytest.fixture(scope="module")
def by_hand() -> Iterator[dict[bool, tuple[torch.Tensor, list[fx.GraphModule], Any]]]:
    yield {undo: _compile_by_hand(undo) for undo in (False, True)}
    torch._dynamo.reset()


def test_split_module_copies_regions_into_every_partition(by_hand: Any) -> None:
    out, received, _ = by_hand[False]
    assert len(received) == 3  # one partition per 1 MiB layer, the head with the last
    assert all(_targets(gm) == [ENTER, EXIT] for gm in received)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out, _model()(_batch()), rtol=0, atol=0)


def test_regions_undone_drops_the_copies_after_the_first_partition(by_hand: Any) -> None:
    out, received, undone = by_hand[True]
    assert len(received) == 3
    assert _targets(received[0]) == [ENTER, EXIT]  # the original enter, its exit copy
    assert [_targets(gm) for gm in received[1:]] == [[], []]
    assert undone.splits == 1
    assert undone.removed == [
        "submod_1: _enter_autocast, _exit_autocast",
        "submod_2: _enter_autocast, _exit_autocast",
    ]
    # The later partitions computed outside autocast: the output is float32 ...
    assert out.dtype == torch.float32
    # ... and is what the same model computes with autocast around its first layer only.
    model = _model()
    with torch.no_grad():
        x = _batch()
        with torch.autocast("cpu", torch.bfloat16):
            x = x + torch.relu(model.layers[0](x))
        for layer in model.layers[1:]:
            x = x + torch.relu(layer(x))
        torch.testing.assert_close(out.detach(), model.head(x))


def test_regions_undone_restores_split_module() -> None:
    original = split_module_pass.split_module
    with pytest.raises(RuntimeError, match="boom"), regions_undone():
        assert split_module_pass.split_module is not original
        raise RuntimeError("boom")
    assert split_module_pass.split_module is original


# -- on 2 ranks, through ish.watch --------------------------------------------------------
def _compiled_step(ctx: Any, undo: bool) -> str:
    torch._dynamo.reset()  # a fresh compile every run (the ranks live between runs)
    ddp = DDP(_model(), bucket_cap_mb=1)
    compiled = torch.compile(ddp, backend="aot_eager")
    ish.watch(compiled)
    if undo:
        with regions_undone():
            out = compiled(_batch(ctx.rank))
    else:
        out = compiled(_batch(ctx.rank))
    out.float().sum().backward()
    return str(out.dtype)


@pytest.mark.slow
def test_capture_shows_the_missing_regions(cluster: ish.Cluster) -> None:
    plan = ish.plan_splits(_model(), (_batch(),), bucket_cap_mb=1)
    assert len(plan.partitions) == 3
    assert all(
        [(r.kind, r.enters, r.exits) for r in p.regions] == [("autocast", True, True)]
        for p in plan.partitions
    )

    right = cluster.run(_compiled_step, undo=False)
    assert right.results == ["torch.bfloat16", "torch.bfloat16"]
    assert right.splits.compare(plan).matches, right.splits.compare(plan)

    wrong = cluster.run(_compiled_step, undo=True)
    assert wrong.results == ["torch.float32", "torch.float32"]
    for rank in (0, 1):
        (comp,) = wrong.splits.compilations(rank)
        regions = [[(r.kind, r.enters, r.exits) for r in p.regions] for p in comp.partitions]
        assert regions == [[("autocast", True, True)], [], []]
        assert "_enter_autocast" not in comp.partitions[1].code
    comparison = wrong.splits.compare(plan)
    assert not comparison.matches
    regions = [d for d in comparison.differences if "regions planned" in d]
    assert len(regions) == 4, comparison.differences  # partitions 1 and 2 on both ranks
    assert all("captured []" in d for d in regions)
    assert any("rank 1" in d and "partition 2" in d for d in regions)
    # The calls differ too: the planned enter copy is missing at the start.
    assert any("calls differ from call 0" in d for d in comparison.differences)
