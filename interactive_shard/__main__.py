"""Command line: ``python -m interactive_shard demo --out DIR`` and ``report``."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m interactive_shard")
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser(
        "demo", help="a 2-rank CPU tour (DDP, torch.compile, FSDP2 mixed precision), write a report"
    )
    demo.add_argument("--out", type=Path, default=Path("out/demo"), help="output folder")
    demo.add_argument("--steps", type=int, default=30, help="training steps")
    report = sub.add_parser(
        "report",
        help="turn a recording (run.jsonl) or a job's folder of rank files (ISH_RECORD) into "
        "an HTML report",
    )
    report.add_argument("recording", type=Path, help="run.jsonl, or the ISH_RECORD folder")
    report.add_argument("--out", type=Path, default=None, help="HTML path (default: beside)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)

    if args.command == "demo":
        from interactive_shard.demo import run_demo

        index = run_demo(args.out, args.steps)
        print(f"Report: {index.resolve()}")
        print(f"Recording: {(args.out / 'run.jsonl').resolve()}")
        return 0

    import interactive_shard as ish

    run = ish.load(args.recording)
    out = args.out or args.recording.with_suffix(".html")
    print(f"Report: {run.to_html(out).resolve()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
