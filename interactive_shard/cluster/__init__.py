"""Start ranks from a notebook, run functions on them, stream output, shut down cleanly."""

from __future__ import annotations

from typing import Any

from interactive_shard.cluster.cluster import Cluster, ClusterClosedError
from interactive_shard.cluster.context import RankContext
from interactive_shard.cluster.errors import RankError
from interactive_shard.cluster.listen import Listener, listen
from interactive_shard.cluster.run import Run, load


def launch(fn: Any, *args: Any, nprocs: int = 2, wait: bool = True, **kwargs: Any) -> Run:
    """One shot: start ``nprocs`` ranks, run ``fn(ctx, *args)`` on them, close them.

    Keyword arguments that ``Cluster`` takes (backend, device, start_method, timeout,
    threads, echo) configure the cluster; the others go to ``fn``. ``wait=False``
    returns the live run at once; its ranks close when it ends.
    """
    cluster_keys = {"backend", "device", "start_method", "timeout", "threads", "echo"}
    cluster_kwargs = {k: kwargs.pop(k) for k in list(kwargs) if k in cluster_keys}
    cluster = Cluster(nprocs, restart_on_failure=False, **cluster_kwargs)
    try:
        run = cluster.run(fn, *args, wait=wait, **kwargs)
    except BaseException:
        cluster.close()
        raise
    run.when_done(cluster.close)
    return run


__all__ = [
    "Cluster",
    "ClusterClosedError",
    "Listener",
    "RankContext",
    "RankError",
    "Run",
    "launch",
    "listen",
    "load",
]
