"""interactive_shard: watch PyTorch DDP, FSDP2 and torch.compile on real ranks, live.

```python
import interactive_shard as ish
cluster = ish.Cluster(nprocs=2)
run = cluster.run(train)        # train(ctx) runs on every rank
run.results, run.save("run.jsonl"), run.to_html("run.html")
```
"""

from __future__ import annotations

__version__ = "0.2.0.dev0"

from interactive_shard.buckets.plan import plan_buckets
from interactive_shard.cluster import (
    Cluster,
    ClusterClosedError,
    Listener,
    RankContext,
    RankError,
    Run,
    launch,
    listen,
    load,
)
from interactive_shard.example_inputs import Inputs
from interactive_shard.precision.plan import plan_precision
from interactive_shard.splits.plan import plan_splits
from interactive_shard.telemetry import RecordingError, RecordingWarning
from interactive_shard.watching import watch

__all__ = [
    "Cluster",
    "ClusterClosedError",
    "Inputs",
    "Listener",
    "RankContext",
    "RankError",
    "RecordingError",
    "RecordingWarning",
    "Run",
    "__version__",
    "launch",
    "listen",
    "load",
    "plan_buckets",
    "plan_precision",
    "plan_splits",
    "watch",
]
