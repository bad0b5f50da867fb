"""One worker process of ``bench_wide``: hosts some ranks of a simulated wide run and
replays their events through real Emitters, without torch.

    python benchmarks/_wide_rank.py PLAN.msgpack RESULT.json READY GO

PLAN (msgpack, written by ``_wide.write_plans``): ``{"address", "token", "ranks",
"events", "record"}``, ``events`` a list of ``[kind, rank, step, payload]`` in the
order to emit them (iteration order, the hosted ranks interleaved). ``record`` is
``None`` to stream: one ``Emitter`` per hosted rank connects to ``address``; or
``{"folder", "world_size", "job"}`` to record: one ``FileEmitter`` per hosted rank
writes its own file into ``folder`` (``ISH_RECORD``'s path, no notebook). Every rank
says where it runs (``announce``: a ``RankInfo``, as ``rank.connect`` and
``rank.record`` do); the worker writes the file READY and waits for the file GO (so
that every worker starts at once, start-up excluded), then emits its events as fast
as it can; then every rank ends as ``rank._end`` ends a script: a flush, a ``state``
event ``finished``, its stream flushed final and closed. RESULT (JSON): monotonic
times of the first and last emit and of the last close, events emitted and dropped
per rank, and whether torch was imported (it must not be: a rank of a wide run need
not be a torch process, and torch's import would dominate the start-up).
"""

from __future__ import annotations

import json
import re
import sys
import time
import types
from pathlib import Path
from typing import Any

import msgspec

PACKAGE = Path(__file__).resolve().parents[1] / "interactive_shard"


def _emitter_classes() -> tuple[Any, Any]:
    """``Emitter`` and ``FileEmitter`` (``interactive_shard.telemetry``) without the
    package's ``__init__``: that imports the planners (``ish.plan_buckets`` and friends),
    which import torch. The telemetry subpackage imports nothing outside itself, so an
    empty parent package whose path is the real one loads it alone; it carries the
    package's ``__version__`` (a rank file's header names it)."""
    if "interactive_shard" not in sys.modules:
        parent = types.ModuleType("interactive_shard")
        parent.__path__ = [str(PACKAGE)]
        init = (PACKAGE / "__init__.py").read_text()
        found = re.search(r"^__version__ = \"([^\"]+)\"", init, re.M)
        parent.__version__ = found.group(1) if found else "0+unknown"  # type: ignore[attr-defined]
        sys.modules["interactive_shard"] = parent
    from interactive_shard.telemetry.emitter import Emitter
    from interactive_shard.telemetry.rank_file import FileEmitter

    return Emitter, FileEmitter


def _no_torch(where: str) -> None:
    if "torch" in sys.modules:
        sys.exit(f"_wide_rank: torch was imported ({where}); a simulated rank must not need it")


def main(plan_path: str, result_path: str, ready: str, go: str) -> int:
    emitter_class, file_emitter_class = _emitter_classes()
    _no_torch("after importing the emitters")
    plan = msgspec.msgpack.decode(Path(plan_path).read_bytes())
    record = plan.get("record")
    if record is None:
        emitters = {r: emitter_class(plan["address"], plan["token"], r) for r in plan["ranks"]}
    else:
        emitters = {
            r: file_emitter_class(record["folder"], r, record["world_size"], job=record["job"])
            for r in plan["ranks"]
        }
    for emitter in emitters.values():
        emitter.announce()  # a RankInfo first, as rank.connect / rank.record send
    sent = dict.fromkeys(emitters, 0)
    last_step = dict.fromkeys(emitters, 0)
    Path(ready).touch()
    while not Path(go).exists():
        time.sleep(0.001)
    first = time.monotonic()
    for kind, rank, step, payload in plan["events"]:
        emitters[rank].emit(kind, payload, step)
        sent[rank] += 1
        last_step[rank] = step
    last = time.monotonic()
    for rank, emitter in emitters.items():  # rank._end: flush, say finished, flush final
        emitter.flush()
        emitter.emit("state", {"state": "finished"}, step=last_step[rank])
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
