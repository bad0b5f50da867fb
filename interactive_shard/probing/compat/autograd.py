"""The autograd engine's private entry points the probes use (unchanged 2.11 to 2.15).

- ``graph_task_id()``: the running backward's id on this thread, -1 outside backward;
- ``current_node()``: the autograd node running now (None outside backward);
- ``engine``: the engine, whose ``queue_callback`` runs a function when the current
  backward ends (DDP's own ``finalize_backward`` goes there);
- ``tree_flatten`` / ``tree_leaves``: torch's pytree, which walks what a model returns
  (dicts, dataclasses, Hugging Face ``ModelOutput``s) as torch itself does.
"""

from __future__ import annotations

import torch
from torch.utils._pytree import tree_flatten, tree_leaves

__all__ = ["current_node", "engine", "graph_task_id", "tree_flatten", "tree_leaves"]

graph_task_id = torch._C._current_graph_task_id
current_node = torch._C._current_autograd_node
engine = torch.autograd.Variable._execution_engine
