"""The text of the lifecycle checks: what happened and how to fix it."""

from __future__ import annotations


def _names(fqns: list[str], most: int = 8) -> str:
    shown = ", ".join(fqns[:most])
    return shown + (f" and {len(fqns) - most} more" if len(fqns) > most else "")


def unfinished(iteration: int, fqns: list[str]) -> str:
    return (
        f"Iteration {iteration}: DDP's reduction did not finish after the backward: "
        f"{_names(fqns) or 'some parameters'} got no gradient, so their bucket was never "
        "all-reduced. The next forward raises 'Expected to have finished reduction', or "
        "a rank waits for an all-reduce the others never start. Fix: use every "
        "parameter in the loss each iteration, pass find_unused_parameters=True, or "
        "static_graph=True if the same parameters are unused every iteration."
    )


def forward_without_backward(iteration: int) -> str:
    return (
        f"Iteration {iteration}: a DDP forward's output was freed without a backward. "
        "DDP prepared its Reducer for a backward that never came; torch does not notice "
        "(_check_reducer_finalized() passes), but another rank that did run the "
        "backward now waits in its bucket all-reduces. Fix: run the forward under "
        "torch.no_grad() (evaluation) or with ddp.no_sync(), or call backward on it."
    )


def double_hooks(fqns: list[str], mine: int, others: list[int]) -> str:
    who = ", ".join(f"#{s}" for s in others)
    return (
        f"{_names(fqns)} carry the autograd hooks of DDP instance #{mine} and of {who}: "
        "every backward runs each instance's Reducer hook, and an instance that was "
        "forwarded reduces the gradient again (extra all-reduces, a hang if ranks differ). "
        "Usually the model was wrapped twice (a re-run notebook cell). Fix: call "
        "old._remove_autograd_hooks() on the old instance (or delete it), or wrap the "
        "model once."
    )
