"""``benchmarks/gpu_check.py`` without CUDA: one SKIP line per case, exit status 0.

Run as a child process with no CUDA device visible (``CUDA_VISIBLE_DEVICES=""``), so it
takes the no-GPU path on a GPU machine too; it imports torch and nothing else.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_check.py"
CASES = [
    "gloo-shared-gpu-buckets",
    "gloo-shared-gpu-splits-inductor",
    "gloo-shared-gpu-precision-fsdp2",
    "gloo-shared-gpu-precision-ddp",
    "gloo-shared-gpu-timeline-fsdp2",
    "gloo-shared-gpu-optimizer-in-backward",
    "nccl-gpu-per-rank",
]


def test_gpu_check_skips_every_case_without_cuda() -> None:
    proc = subprocess.run(
        [sys.executable, str(SCRIPT)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**os.environ, "CUDA_VISIBLE_DEVICES": ""},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert [line.partition(":")[0] for line in lines] == [f"SKIP {case}" for case in CASES]
    assert all("CUDA is not available" in line for line in lines), lines
