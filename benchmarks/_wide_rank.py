"""One worker process of ``bench_wide``: hosts some ranks of a simulated wide run and
replays their events through real Emitters, without torch.

    python benchmarks/_wide_rank.py PLAN.msgpack RESULT.json READY GO

PLAN (msgpack, written by ``_wide.write_plans``): ``{"address", "token", "ranks",
"events"}``, ``events`` a list of ``[kind, rank, step, payload]`` in the order to emit
them (iteration order, the hosted ranks interleaved). One ``Emitter`` per hosted rank
connects; the worker writes the file READY and waits for the file GO (so that every
worker starts at once, start-up excluded), then emits its events as fast as it can;
then every rank flushes its stream final and closes. RESULT (JSON): monotonic times of
the first and last emit and of the last close, events emitted and dropped per rank,
and whether torch was imported (it must not be: a rank of a wide run need not be a
torch process, and torch's import would dominate the start-up).
"""

from __future__ import annotations

import json
import sys
import time
import types
from pathlib import Path
from typing import Any

import msgspec

PACKAGE = Path(__file__).resolve().parents[1] / "interactive_shard"


def _emitter_class() -> Any:
    """``interactive_shard.telemetry.emitter.Emitter`` without the package's ``__init__``:
    that imports the planners (``ish.plan_buckets`` and friends), which import torch.
    The telemetry subpackage imports nothing outside itself, so an empty parent
    package whose path is the real one loads it alone."""
    if "interactive_shard" not in sys.modules:
        parent = types.ModuleType("interactive_shard")
        parent.__path__ = [str(PACKAGE)]
        sys.modules["interactive_shard"] = parent
    from interactive_shard.telemetry.emitter import Emitter

    return Emitter


def _no_torch(where: str) -> None:
    if "torch" in sys.modules:
        sys.exit(f"_wide_rank: torch was imported ({where}); a simulated rank must not need it")


def main(plan_path: str, result_path: str, ready: str, go: str) -> int:
    emitter_class = _emitter_class()
    _no_torch("after importing the emitter")
    plan = msgspec.msgpack.decode(Path(plan_path).read_bytes())
    emitters = {r: emitter_class(plan["address"], plan["token"], r) for r in plan["ranks"]}
    sent = dict.fromkeys(emitters, 0)
    Path(ready).touch()
    while not Path(go).exists():
        time.sleep(0.001)
    first = time.monotonic()
    for kind, rank, step, payload in plan["events"]:
        emitters[rank].emit(kind, payload, step)
        sent[rank] += 1
    last = time.monotonic()
    for emitter in emitters.values():
        emitter.flush(final=True)
    for emitter in emitters.values():
        emitter.close()
    closed = time.monotonic()
    _no_torch("at the end")
    result = {
        "ranks": list(emitters),
        "first_emit": first,
        "last_emit": last,
        "closed": closed,
        "sent": {str(r): n for r, n in sent.items()},
        "dropped": {str(r): e.dropped for r, e in emitters.items()},
        "torch": "torch" in sys.modules,
    }
    Path(result_path).write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:5]))
