"""interactive_shard: watch PyTorch DDP, FSDP2 and torch.compile on real ranks, live.

```python
import interactive_shard as ish
cluster = ish.Cluster(nprocs=2)
run = cluster.run(train)        # train(ctx) runs on every rank
run.results, run.save("run.jsonl"), run.to_html("run.html")
```
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

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
)
from interactive_shard.cluster import load as _load_recording
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
    "load_flight_recorder",
    "plan_buckets",
    "plan_precision",
    "plan_splits",
    "watch",
]


if os.environ.get("ISH_RECORD") or os.environ.get("ISH_TELEMETRY"):  # a rank of a job
    from interactive_shard.features import start_job_rank

    start_job_rank()


def load_flight_recorder(
    paths: str
    | os.PathLike[str]
    | Sequence[str | os.PathLike[str]]
    | Mapping[int, str | os.PathLike[str]],
) -> Run:
    """A run from torch's own Flight Recorder dumps of a job (torchrun, NCCL or gloo):
    ``run.collectives`` lines up what every rank issued, and names a divergence, the
    collectives pending and the ranks the others wait for.

    ``paths``: one file per rank, pickle (``TORCH_FR_DUMP_TEMP_FILE`` dumps,
    ``_dump_fr_trace()``) or JSON (``_dump_fr_trace_json()``); a list (the digits ending
    each name are its rank, as torch names them; else the list's order) or
    ``{rank: path}``. The files are read as untrusted: a pickle that would run code, a
    damaged or oversized file is a ``RecordingError`` saying what is wrong.
    """
    from interactive_shard.collectives.dumps import read_dumps  # the feature, on demand

    return Run(read_dumps(paths))


def load(
    path: str
    | os.PathLike[str]
    | Sequence[str | os.PathLike[str]]
    | Mapping[int, str | os.PathLike[str]],
) -> Run:
    """Rebuild a saved run (``run.save(path)``) without starting any process. A folder is
    a job's rank files (``ISH_RECORD=DIR``: each rank's file, merged into one run; what
    is missing or damaged is named in a ``RecordingWarning``); a list, tuple or
    ``{rank: path}`` of Flight Recorder dumps is ``load_flight_recorder``'s."""
    if isinstance(path, list | tuple | Mapping):
        return load_flight_recorder(path)
    if isinstance(path, str | os.PathLike):
        return _load_recording(path)
    raise TypeError(f"ish.load takes a path, or a list of Flight Recorder dumps; not {path!r}")
