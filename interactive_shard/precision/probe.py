"""Probe on a real FSDP2, FSDP1 or mixed-precision DDP model: the dtypes every unit shows.

Note [Precision probe]
~~~~~~~~~~~~~~~~~~~~~~

Background: a mixed-precision policy acts at a few places inside the engine, none of
which a module hook sees directly. FSDP2 (``fully_shard``) casts a unit's floating
inputs in ``FSDPState._cast_forward_inputs`` from its forward pre-hook (before the
all-gather), computes with unsharded parameters in ``param_dtype``, casts outputs to
``output_dtype`` in its forward hook, all-gathers and reduce-scatters through the comm
objects of each ``FSDPParamGroup`` and keeps sharded parameters and gradients in the
original dtype. FSDP1 casts inside ``FullyShardedDataParallel.forward`` (the root with
``cast_root_forward_inputs``, every unit with ``cast_forward_inputs``), after the
all-gather. DDP native mixed precision casts inputs in ``DDP._pre_forward``, swaps
``param.data`` to a low-precision copy in a pre-hook of the module and reduces each
bucket from its own comm hook, which then swaps the parameters back. The probe reads
dtypes and sizes at those places; it never reads tensor data or changes a value.
Events: ``events.py`` (``docs/events.md``).

Algorithm (``attach``):

1. Describe the units (``precision_watch``): FSDP2 every module with an ``FSDPState``
   under the root (grouped ``fully_shard([a, b])``: one unit, named by its first
   module), FSDP1 every wrapper, DDP the model; each with its policy (``_policy``).
2. Iteration: a forward pre-hook on the root, prepended (before the engine's own), counts
   forwards not recomputed in backward; everything after is reported under that count.
3. ``input``, per floating input: FSDP2 wraps the instance attribute
   ``state._cast_forward_inputs`` (FSDP looks it up at call time) and compares what went
   in with what came out; FSDP1 and DDP compare the wrapper's pre-hook arguments with
   the wrapped module's. ``cast`` is False exactly when the very same tensor object went
   on (``_cast_fp_tensor`` returns its argument when the dtype already matches). A
   later hook cannot tell: FSDP2 passes grad-requiring inputs through
   ``RegisterPostBackwardFunction``, which returns a view of the same data. Where
   FSDP2 casts inline in ``_pre_forward`` (torch before 2.13: no ``_cast_forward_inputs``
   to wrap), a pre-hook prepended after ``fully_shard`` sees the inputs before it and an
   appended one after; cast then means another dtype or other data (``data_ptr``), so a
   tensor FSDP moves to the GPU in the same dtype also reads as cast.
4. ``param``: FSDP2 from a forward hook prepended before FSDP's ``_post_forward``
   (parameters still unsharded) and after ``FSDPParamGroup.pre_backward``; FSDP1 from
   the wrapped module's pre-hook and after ``FlatParamHandle.unshard`` in backward;
   DDP from the module's pre-hook (after DDP's ``_root_copy_hook``) and each bucket.
   ``output``: FSDP2 before (prepended hook) and after ``output_dtype`` (appended hook),
   FSDP1 and DDP (no output cast) the wrapper's forward hook.
5. ``grad``, the unsharded gradient: FSDP2 at ``FSDPParamGroup.post_backward`` entry,
   FSDP1 at ``_runtime_utils._post_backward_hook`` entry (FSDP binds that module global
   into a partial at every forward: patched while a probe is attached), DDP from a
   post-accumulate-grad hook per parameter.
6. Collectives (the buffer this rank sends): FSDP2 wraps each
   group's ``_all_gather_comm`` / ``_reduce_scatter_comm`` in a delegating comm (exact
   per unit, whichever torch function the comm calls), and HSDP's ``dist.all_reduce``
   through a stand-in for ``_fsdp_collectives.dist``. FSDP1 replaces the ``dist`` global
   of ``_flat_param`` and ``_runtime_utils`` by a stand-in whose collectives note what
   they send while ``handle.unshard`` or the post-backward hook of a watched unit runs
   (``SCOPE``; on CPU FSDP1 all-gathers with the list API). DDP: ``ddp.reducer`` is
   replaced by a proxy whose ``_run_allreduce_hook`` notes each bucket (DDP's
   mixed-precision comm hook reads ``ddp_weakref().reducer`` at every call); the bucket
   is seen after its cast to ``reduce_dtype``.
7. ``sharded_param`` / ``sharded_grad``: a global optimizer step pre-hook
   (``torch.optim.optimizer.register_optimizer_step_pre_hook``) reads the dtypes of the
   watched model's parameters the optimizer is about to step, and of their ``.grad``.
   Chosen over reading after backward: it is what the optimizer really sees (FSDP1
   ``keep_low_precision_grads``, DDP's swap back), and it costs nothing in backward.
8. A failed forward: the root's forward hook is ``always_call``; on the exception path
   it walks the traceback's ``Module._call_impl`` frames: the innermost module is the
   consumer, the innermost unit holding it the unit (``precision_failure``); what was
   seen before the failure goes out first.

A phase is recorded once per unit and iteration, and again only when it shows a new
dtype (the record then lists all seen so far; ``input``/``output``: the first call).
Per unit and iteration that is at most: input, param, output, grad, sharded_param,
sharded_grad, plus one record per collective (FSDP2: an all-gather in forward, one in
backward for non-root units, a reduce-scatter). Records are held and sent as one
``precision_batch`` when the iteration ends (the optimizer step pre-hook, or the next
forward), before a failure, at an explicit flush (``ctx.flush()``, the run's end:
``telemetry.rank.before_flush``) and at detach. One event instead of one per record
(92 per step on the 11-unit benchmark): the kernel's cost is per event, and on a
machine whose cores the ranks use it is taken from their step
(``benchmarks/bench_precision_probe.py``). A rank killed mid-iteration loses that
iteration's records.

Caveats:

* Observes, never changes numerics: the wrappers return exactly what the engine's code
  returns, and ``tests/integration/test_precision_probe.py`` trains bit-identically
  with and without the probe. A bug in the probe's reading is logged once, not raised.
* Patches: FSDP1's module globals and the optimizer hook are process-wide while any
  probe is attached (other FSDP1 models run through them unrecorded); FSDP2's and
  DDP's are per instance. ``detach()`` undoes them all; a probe never detached undoes
  them when its model is collected (an FSDP1 model whose forward failed is not: its
  hooks stay registered with autograd).
* FSDP2: ``set_custom_all_gather`` / ``set_custom_reduce_scatter`` after ``ish.watch``
  replace the spying comms (those collectives go unrecorded), and the probe's comms make
  ``set_symm_mem_for_comm`` / ``set_allocate_memory_from_process_group_for_comm`` refuse
  (they accept only FSDP's own comm classes): call those before ``ish.watch``.
* FSDP1 with a user comm hook: the hook's collectives are not seen.
* Inputs inside objects FSDP does not walk (a custom class, a ``PackedSequence`` is walked
  for its data) are not listed; sets are not walked (a cast reorders them).
* After a failed FSDP2 forward the root stays in its forward state; call
  ``model.reset_iter_state()`` before the next forward. DDP native mixed precision on
  CPU fails in its first forward ("cpu backend doesn't support events", it records a
  ``torch.Event``): the probe reports that as the failure.
* A unit called twice per iteration reports its first call's inputs and outputs.
"""

from __future__ import annotations

from torch import nn

from interactive_shard.precision import _probe_ddp, _probe_fsdp1

try:
    from interactive_shard.precision import _probe_fsdp2
except ImportError:  # pragma: no cover - a torch without FSDP2's public API (< 2.6)
    _probe_fsdp2 = None  # type: ignore[assignment]
from interactive_shard.precision._probe_common import PrecisionRecorder

__all__ = ["OPTIONS", "WATCHES", "attach", "fits"]

WATCHES = (
    "FSDP2 roots (the outermost fully_shard'ed module), FSDP1 roots "
    "(FullyShardedDataParallel) and DDP models with mixed_precision="
)
OPTIONS: frozenset[str] = frozenset()


def fits(obj: object) -> bool:
    return (
        _probe_fsdp2.is_root(obj)
        or _probe_fsdp1.is_root(obj)
        or _probe_ddp.has_mixed_precision(obj)
    )


def attach(model: nn.Module) -> PrecisionRecorder:
    """Record the dtypes of every unit of ``model`` on this rank; Note [Precision probe].

    ``ish.watch(model)`` calls this on every rank, after wrapping, before the first
    forward to record: an FSDP2 root (``fully_shard(model)``, after its children), an
    FSDP1 root or a ``DistributedDataParallel(..., mixed_precision=...)``. Events:
    ``precision_watch`` now, then a ``precision_batch`` per iteration and, when a
    forward fails, ``precision_failure``.
    """
    earlier = getattr(model, "_ish_precision_probe", None)
    if earlier is not None and earlier.attached:
        raise RuntimeError(
            "ish.watch was already called on this model: keep the handle it returned "
            "(or detach() it first)"
        )
    recorder: PrecisionRecorder
    if _probe_fsdp2 is not None and _probe_fsdp2.is_root(model):
        recorder = _probe_fsdp2.Fsdp2Recorder(model)
    elif _probe_fsdp1.is_root(model):
        recorder = _probe_fsdp1.Fsdp1Recorder(model)  # type: ignore[arg-type]
    elif _probe_ddp.has_mixed_precision(model):
        recorder = _probe_ddp.DdpRecorder(model)  # type: ignore[arg-type]
    else:
        raise TypeError(f"the precision probe watches {WATCHES}; got a {type(model).__qualname__}")
    model.__dict__["_ish_precision_probe"] = recorder
    return recorder
