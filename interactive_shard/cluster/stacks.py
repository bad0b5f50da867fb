"""Where a stuck rank was: its Python stack, dumped just before the cluster stops it.

Note [Stuck rank stacks]
~~~~~~~~~~~~~~~~~~~~~~~~
Background: when one rank fails, the others are usually stuck in a collective with it
and are killed after ``FAILURE_GRACE_S``; their stack is what tells a wrong collective
order from a deadlock, and a kill leaves none. A stuck rank often sits in C++ holding
the GIL (a blocking collective), so a Python thread cannot report it.

Mechanism: each rank registers ``faulthandler`` for ``DUMP_SIGNAL``. Its handler is C
code that writes every thread's Python stack to fd 2 without the GIL; fd 2 is the rank's
stderr pipe, so the lines reach the kernel as the rank's log. Before the kill the
cluster sends the signal, waits until each stuck rank's dump arrived and went quiet
(at most ``WAIT_S``), and puts the thread that runs the user's function (the one inside
the worker's ``_serve``) into the ``RankError``; every thread stays in ``cluster.logs[rank]``.
"""

from __future__ import annotations

import faulthandler
import signal
from typing import TextIO

DUMP_SIGNAL = signal.SIGUSR1
WAIT_S = 1.0  # the handler writes at once; this bounds a rank that does not answer
QUIET_S = 0.05  # no new line for this long: the dump is complete (it is written at once)
_HEADERS = ("Thread 0x", "Current thread 0x")
_WORKER_LOOP = "in _serve"


def enable(stderr: TextIO) -> None:
    """In the rank: dump every thread's stack to ``stderr`` on ``DUMP_SIGNAL``."""
    faulthandler.register(DUMP_SIGNAL, file=stderr, all_threads=True, chain=False)


def has_dump(lines: list[str]) -> bool:
    return any(line.startswith(_HEADERS) for line in lines)


def user_stack(lines: list[str]) -> str:
    """The dumped stack of the thread running the user's function (else every thread's
    dump), from a rank's log lines that follow the signal."""
    blocks: list[list[str]] = []
    for line in lines:
        if line.startswith(_HEADERS):
            blocks.append([line])
        elif blocks and line.startswith("  "):
            blocks[-1].append(line)
    for block in blocks:
        loop = next((i for i, line in enumerate(block) if _WORKER_LOOP in line), None)
        if loop is not None:  # most recent call first: the worker's own frames follow
            return "\n".join([*block[:loop], "  (every thread: cluster.logs[rank])"])
    return "\n\n".join("\n".join(b) for b in blocks)
