"""Small models that show hook order at work (notebook 05, tests, the benchmark).

``FlatViewBlocks`` reproduces the failure PyTorch PR 89330 fixed, for real, on any
device: FSDP1 kept every unit's weights as views of one flat parameter and reduced a
unit's gradient from a hook on its views. Autograd runs ready nodes newest first (by
``Node._sequence_nr()``), so a hook runs right after its block's backward only when its
view was created just before the block's forward. Dynamo had baked the views it saw
while tracing into the graph: all of them created before any compiled forward ran, so
every hook ran after every compiled backward and no reduction overlapped backward.
``up_front=True`` creates the views that way; ``False`` creates each in its block's
forward, as FSDP does (and as dynamo does since parameters are graph inputs).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn


class Block(nn.Module):
    """``relu(x @ weight.T + bias)``, with the weight passed in (a view of a flat one)."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.bias = nn.Parameter(torch.zeros(width))

    def forward(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return torch.relu(x @ weight.t() + self.bias)


class FlatViewBlocks(nn.Module):
    """``blocks`` blocks whose weights are views of one flat parameter; each view's
    gradient is all-reduced asynchronously from a hook on the view (a miniature FSDP1:
    the data-parallel reduction is real, the averaged gradient lands in ``flat.grad``).

    ``compile``: each block compiled with ``block.compile(backend=compile)``;
    ``up_front``: every view created before the first block runs (the PR 89330 failure).
    Biases are not reduced: the example times the weights' reductions only.
    """

    def __init__(
        self,
        blocks: int = 4,
        width: int = 256,
        *,
        up_front: bool = False,
        compile: str | None = "aot_eager",
    ) -> None:
        super().__init__()
        self.width, self.numel, self.up_front = width, width * width, up_front
        self.flat = nn.Parameter(torch.randn(blocks * self.numel) / width**0.5)
        self.blocks = nn.ModuleList(Block(width) for _ in range(blocks))
        if compile:
            for block in self.blocks:
                block.compile(backend=compile)
        self._pending: list[tuple[int, torch.Tensor, Any]] = []

    def view(self, i: int) -> torch.Tensor:
        return self.flat[i * self.numel : (i + 1) * self.numel].view(self.width, self.width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        views = [self.view(i) for i in range(len(self.blocks))] if self.up_front else []
        for i, block in enumerate(self.blocks):
            weight = views[i] if self.up_front else self.view(i)
            if weight.requires_grad:
                weight.register_hook(self._reducer(i))
            x = block(x, weight)
        return x

    def _reducer(self, i: int) -> Any:
        def reduce(grad: torch.Tensor) -> None:
            if not self._pending:  # the first hook of this backward: finish after it
                torch.autograd.Variable._execution_engine.queue_callback(self._finish)
            sent = grad.detach().clone()
            work = dist.all_reduce(sent, async_op=True) if dist.is_initialized() else None
            self._pending.append((i, sent, work))

        return reduce

    def _finish(self) -> None:
        world = dist.get_world_size() if dist.is_initialized() else 1
        pending, self._pending = self._pending, []
        grad = self.flat.grad
        for i, sent, work in pending:
            if work is not None:
                work.wait()
            if grad is not None:
                grad[i * self.numel : (i + 1) * self.numel].copy_(sent.flatten() / world)


class MLPBlock(nn.Module):
    """Linear + ReLU as a user's class: dynamo compiles it (it skips torch.nn's own
    modules such as ``nn.Sequential``, which ``block.compile()`` would leave eager)."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.linear = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.linear(x))


class Stack(nn.Module):
    """``blocks`` MLP blocks for FSDP2 (a unit per block) and DDP."""

    def __init__(self, blocks: int = 3, width: int = 128) -> None:
        super().__init__()
        self.layers = nn.ModuleList(MLPBlock(width) for _ in range(blocks))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x
