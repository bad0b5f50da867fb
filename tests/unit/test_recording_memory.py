"""Loading a hostile recording costs memory in proportion to its real content.

The files are loaded in a child process whose address space is capped at 1 GiB beyond
what the interpreter (with torch) already maps, so a loader that allocates from what a
file claims (a world size, one giant line) fails with MemoryError instead of taking the
machine; the child also reports its peak RSS growth.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

HEADER: dict[str, Any] = {
    "format": "interactive_shard.recording",
    "schema_version": 1,
    "world_size": 2,
    "backend": "gloo",
    "device_types": ["cpu"],
}
EVENT = b'["scalar",0,1,0.5,{"name":"loss","value":1.0}]\n'
MIB = 1024 * 1024
PEAK_GROWTH_MIB = 300  # the worst line within the limit (4 MiB of [] items) takes ~110

CHILD = """
import json, resource, sys, warnings
import interactive_shard as ish

page = resource.getpagesize()
with open("/proc/self/statm") as f:
    mapped = int(f.read().split()[0]) * page
resource.setrlimit(resource.RLIMIT_AS, (mapped + (1 << 30), resource.RLIM_INFINITY))
warnings.simplefilter("ignore")
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
for path in sys.argv[1:]:
    run = None
    try:
        run = ish.load(path)
        run.monitor  # per-rank state, sized by the header's world size
        outcome = f"loaded {len(run.store)}"
    except ish.RecordingError:
        outcome = "refused"
    except MemoryError:
        outcome = "MemoryError"
    except RecursionError:
        outcome = "RecursionError"
    del run
    grown = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base) // 1024
    print(json.dumps({"file": path, "outcome": outcome, "peak_growth_mib": grown}))
"""


def _header(**fields: Any) -> bytes:
    return json.dumps({**HEADER, **fields}).encode() + b"\n"


def _hostile_files(folder: Path) -> dict[str, str]:
    """name -> the outcome a bounded loader gives (the peak is checked for all)."""
    (folder / "world_1e9.jsonl").write_bytes(_header(world_size=10**9) + EVENT)
    (folder / "world_1e7.jsonl").write_bytes(_header(world_size=10**7) + EVENT)
    (folder / "world_max.jsonl").write_bytes(
        _header(world_size=65_536, results=[None] * 65_536) + EVENT
    )
    with (folder / "line_57mib.jsonl").open("wb") as f:  # one line of 19M empty lists
        f.write(_header() + EVENT + b'["k",0,0,0.0,{"a":[')
        for _ in range(57):
            f.write(b"[]," * (MIB // 3))
        f.write(b"[]]}]\n" + EVENT)
    body = b'["k",0,0,0.0,{"a":['
    items = (4 * MIB - len(body) - 8) // 3  # the worst line that fits the limit
    (folder / "line_at_limit.jsonl").write_bytes(
        _header() + body + b"[]," * items + b"[]]}]\n" + EVENT
    )
    deep = b'["k",0,0,0.0,{"a":' + b"[" * 1_000_000 + b"]" * 1_000_000 + b"}]\n"
    (folder / "deep.jsonl").write_bytes(_header() + EVENT + deep + EVENT)
    (folder / "tiny_events.jsonl").write_bytes(_header() + EVENT * 100_000)  # real content
    return {
        "world_1e9.jsonl": "refused",
        "world_1e7.jsonl": "refused",
        "world_max.jsonl": "loaded 1",
        "line_57mib.jsonl": "loaded 1",
        "line_at_limit.jsonl": "loaded 2",
        "deep.jsonl": "loaded 1",
        "tiny_events.jsonl": "loaded 100000",
    }


@pytest.mark.skipif(not Path("/proc/self/statm").exists(), reason="needs Linux /proc")
def test_hostile_recordings_load_in_bounded_memory(tmp_path: Path) -> None:
    expected = _hostile_files(tmp_path)
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, *(str(tmp_path / name) for name in expected)],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    reports = [json.loads(line) for line in proc.stdout.splitlines()]
    outcomes = {Path(r["file"]).name: r["outcome"] for r in reports}
    assert outcomes == expected, reports
    assert reports[-1]["peak_growth_mib"] < PEAK_GROWTH_MIB, reports
