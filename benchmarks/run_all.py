"""Run every ``benchmarks/bench_*.py`` in turn (``make bench``), streaming its output.

Each script runs in its own interpreter (a benchmark may change process-wide state,
e.g. modules loaded in the kernel), with this interpreter and the repository root as
working directory. Extra arguments are passed to every script (e.g. ``--repeats 3``).
At the end, one line per script: its exit status, wall time and JSON summary (the
script's last output line, when it is JSON). Exit status: 1 if any script failed.

    python benchmarks/run_all.py [-k NAME] [script args...]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


def run_one(script: Path, extra: list[str]) -> tuple[int, float, Any]:
    """Run ``script``, echoing its output line by line; (exit code, seconds, summary)."""
    print(f"=== {script.name} ===", flush=True)
    t0 = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-u", str(script), *extra],
        cwd=HERE.parent,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        bufsize=1,
    )
    assert proc.stdout is not None
    last = ""
    for line in proc.stdout:
        sys.stdout.write(line)
        sys.stdout.flush()
        if line.strip():
            last = line.strip()
    code = proc.wait()
    try:
        summary = json.loads(last)
    except json.JSONDecodeError:
        summary = None
    return code, time.monotonic() - t0, summary


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-k", default="", help="only scripts whose name contains this")
    args, extra = parser.parse_known_args()
    scripts = sorted(p for p in HERE.glob("bench_*.py") if args.k in p.name)
    scripts += [p for p in [HERE / "soak.py"] if args.k in p.name]  # last: minutes
    if not scripts:
        print(f"no benchmarks/bench_*.py matching {args.k!r}")
        return 1
    outcomes = [(s, *run_one(s, extra)) for s in scripts]
    print("=== summary ===")
    for script, code, seconds, summary in outcomes:
        status = "ok" if code == 0 else f"FAILED (exit {code})"
        print(f"{script.name:<28} {status:<18} {seconds:6.1f} s  {json.dumps(summary)}")
    return 0 if all(code == 0 for _, code, _, _ in outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
