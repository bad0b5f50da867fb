"""Reading a stuck rank's faulthandler dump out of its log lines (Note [Stuck rank stacks])."""

from __future__ import annotations

import pickle

from interactive_shard.cluster import stacks
from interactive_shard.cluster.errors import RankError

DUMP = [
    "some output the rank printed before",
    "Thread 0x00007f00000000aa (most recent call first):",
    '  File "emitter.py", line 220 in _flush_loop',
    "",
    "Current thread 0x00007f00000000bb (most recent call first):",
    '  File "distributed_c10d.py", line 3252 in all_reduce',
    '  File "<dynamic-code>", line 5 in train',
    '  File "worker.py", line 127 in _serve',
    '  File "worker.py", line 72 in main',
]


def test_the_user_thread_is_picked_and_the_workers_frames_dropped() -> None:
    assert stacks.has_dump(DUMP) and not stacks.has_dump(DUMP[:1])
    text = stacks.user_stack(DUMP)
    assert text.splitlines()[:3] == DUMP[4:7]
    assert "_serve" not in text and "_flush_loop" not in text
    assert "cluster.logs[rank]" in text


def test_without_the_worker_loop_every_thread_is_kept() -> None:
    text = stacks.user_stack(DUMP[:7])
    assert "_flush_loop" in text and "in train" in text
    assert stacks.user_stack(["no dump here"]) == ""


def test_rank_error_names_the_stuck_stack_and_pickles() -> None:
    err = RankError({1: "ValueError: x"}, note="n", stuck={0: "  File 'a', line 1 in f"})
    assert "--- rank 0, stuck: its stack when stopped ---" in str(err)
    back = pickle.loads(pickle.dumps(err))
    assert back.stuck == err.stuck and str(back) == str(err)
