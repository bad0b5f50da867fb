"""The cluster inside a real Jupyter kernel: interrupt, labelled output, background runs."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from jupyter_client.blocking.client import BlockingKernelClient
from jupyter_client.manager import KernelManager, start_new_kernel


@pytest.fixture(scope="module")
def kernel() -> Iterator[tuple[KernelManager, BlockingKernelClient]]:
    km, kc = start_new_kernel(kernel_name="python3")
    try:
        yield km, kc
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


def execute(kc: BlockingKernelClient, code: str, timeout: float = 60) -> tuple[dict, list[dict]]:
    outputs: list[dict[str, Any]] = []
    reply = kc.execute_interactive(
        code, timeout=timeout, output_hook=lambda msg: outputs.append(msg)
    )
    return reply["content"], outputs


def stdout(outputs: list[dict]) -> str:
    return "".join(
        m["content"]["text"]
        for m in outputs
        if m["msg_type"] == "stream" and m["content"]["name"] == "stdout"
    )


def test_rank_output_reaches_the_cell_labelled(kernel) -> None:
    _, kc = kernel
    reply, _ = execute(kc, "import interactive_shard as ish\nc = ish.Cluster(2, timeout=20)")
    assert reply["status"] == "ok"
    reply, outputs = execute(kc, "r = c.run(lambda ctx: print('hello', ctx.rank))")
    assert reply["status"] == "ok"
    assert "[rank 0] hello 0" in stdout(outputs) and "[rank 1] hello 1" in stdout(outputs)


def test_kernel_interrupt_stops_the_ranks(kernel) -> None:
    km, kc = kernel
    execute(kc, "import time\ndef busy(ctx):\n    while True: time.sleep(0.01)")
    timer = threading.Timer(1.0, km.interrupt_kernel)
    timer.start()
    start = time.monotonic()
    reply, _ = execute(kc, "c.run(busy)")
    assert reply["status"] == "error" and reply["ename"] == "KeyboardInterrupt"
    assert time.monotonic() - start < 1.0 + 5
    reply, outputs = execute(kc, "print(c.run(lambda ctx: ctx.rank).results)")
    assert "[0, 1]" in stdout(outputs)


def test_background_run_finishes_while_the_kernel_is_idle(kernel) -> None:
    _, kc = kernel
    reply, _ = execute(kc, "run = c.run(lambda ctx: time.sleep(0.3) or ctx.rank, wait=False)")
    assert reply["status"] == "ok"
    time.sleep(2.0)  # no cell runs: the kernel's event loop polls the run
    _, outputs = execute(kc, "print(run._finished, run.results)")
    assert "True [0, 1]" in stdout(outputs)
