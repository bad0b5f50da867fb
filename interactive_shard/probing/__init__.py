"""What every probe's hooks share: never break the user's step, and tell backward apart.

Probes (``*/probe.py``) run inside the user's forward and backward; a bug in one must
cost a log line, not the training step. Rank-side parts several probes share live here
too: the process-group spy (``spy.py``), the ``torch.distributed`` wrappers
(``collectives.py``), the process-wide collective log (``collective_log.py``) and the
torch compatibility layer (``compat/``).

Note [Undefined gradients]
~~~~~~~~~~~~~~~~~~~~~~~~~~

Background: with ``find_unused_parameters=True`` (or ``static_graph``) DDP's ``_DDPSink``
sends an undefined gradient through every output the loss does not use (BertModel's
``pooler_output`` when the loss reads only ``last_hidden_state``). Autograd still runs
the pooler's ``AccumulateGrad`` node, so its ``register_post_accumulate_grad_hook``
fires, with ``param.grad`` still None (measured on torch 2.13).

Algorithm: a probe counts a parameter as ready only when its ``.grad`` is defined in
that hook; otherwise it is unused in that iteration, as for DDP's own
``find_unused_parameters`` search.

Caveats: a gradient kept from an earlier backward (``zero_grad(set_to_none=False)``,
accumulation under ``no_sync``) is defined, so such a parameter still counts as ready.
Advice that depends on it (``static_graph=True``, ``find_unused_parameters=False``) is
given only when no parameter was unused: both crash with "Expected to have finished
reduction" when one is (measured with BertModel's pooler).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch

from interactive_shard.probing.compat import autograd as compat_autograd
from interactive_shard.telemetry.meter import Meter

log = logging.getLogger(__name__)

_task_id = compat_autograd.graph_task_id  # -1 outside backward
_compiling = torch.compiler.is_compiling


def in_backward() -> bool:
    """Whether autograd is running a backward on this thread (a recomputed forward, a
    hook): the forwards probes count are the ones outside it."""
    return _task_id() != -1


def guarded(fn: Callable[..., Any], meter: Meter | None = None) -> Callable[..., Any]:
    """``fn`` as a hook that never breaks the user's step: a probe bug is logged once,
    not raised, and the hook returns None (the engine goes on as without it). With a
    ``meter`` its time counts to the probe's own cost (``Attachment.timed``), except
    while dynamo traces it: a clock read in a graph would be a constant."""

    def call(*args: Any, **kwargs: Any) -> Any:
        try:
            if meter is None or _compiling():
                return fn(*args, **kwargs)
            with meter:
                return fn(*args, **kwargs)
        except Exception:  # pragma: no cover - a bug in the probe, not in the user's model
            if not getattr(call, "_logged", False):
                call._logged = True  # type: ignore[attr-defined]
                log.exception("probe hook %s failed; it records less from now on", fn)
            return None

    call.__wrapped__ = fn  # type: ignore[attr-defined]
    return call
