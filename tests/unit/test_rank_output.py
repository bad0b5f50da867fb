"""Rank output in the kernel is bounded (Note [Bounded rank output], cluster/output.py)."""

from __future__ import annotations

from interactive_shard.cluster.output import (
    ECHO_LINES,
    RUN_HEAD_LINES,
    RUN_TAIL_LINES,
    LineBuffer,
    LineRing,
    RunOutput,
    cut,
    cut_lines,
)


def test_lines_split_across_reads_and_crlf() -> None:
    buffer = LineBuffer()
    assert buffer.feed(b"one\ntw") == ["one"]
    assert buffer.feed(b"o\r") == []
    assert buffer.feed(b"\nthree") == ["two"]  # \r\n split between reads
    assert buffer.close() == ["three"]
    assert buffer.close() == []


def test_a_progress_bar_is_its_last_state() -> None:
    buffer = LineBuffer()
    data = b"".join(b"\rstep %d/1000" % i for i in range(1, 1001))
    assert buffer.feed(data[:4000]) == []
    assert buffer.feed(data[4000:] + b"\n") == ["step 1000/1000"]
    assert buffer.feed(b"50%\r") == [] and buffer.feed(b"100%\rdone\n") == ["done"]


def test_a_long_line_keeps_its_head_and_counts_the_rest() -> None:
    buffer = LineBuffer(limit=10)
    for _ in range(1000):
        assert buffer.feed(b"x" * 1000) == []
        assert len(buffer._line) == 10  # bounded while the line goes on
    (line,) = buffer.feed(b"\n")
    assert line == "x" * 10 + " … [999,990 more bytes cut]"


def test_cut_keeps_short_text_and_cuts_long_lines() -> None:
    assert cut("short", 10) == "short"
    assert cut("y" * 25, 10) == "y" * 10 + " … [15 more characters cut]"
    assert cut_lines("a\n" + "b" * 30, 10) == "a\n" + "b" * 10 + " … [20 more characters cut]"


def test_the_ring_keeps_the_latest_lines_and_counts_the_rest() -> None:
    ring = LineRing(max_lines=3, max_chars=100)
    for i in range(10):
        ring.add(f"l{i}")
    assert ring.lines() == ["l7", "l8", "l9"] and ring.dropped == 7 and ring.total == 10
    assert ring.since(8) == ["l8", "l9"] and ring.since(10) == [] and ring.since(0) == ring.lines()
    ring.add("z" * 200)  # over max_chars: only the newest line stays
    assert ring.lines() == ["z" * 200] and ring.dropped == 10


def test_a_run_keeps_head_marker_and_tail() -> None:
    out = RunOutput(2)
    n = RUN_HEAD_LINES + RUN_TAIL_LINES + 500
    kept = [out.add(0, "stdout", f"line {i}") for i in range(n)]
    assert kept == [True] * RUN_HEAD_LINES + [False] * (n - RUN_HEAD_LINES)
    assert out.tail(1) == []
    pending = out.tail(0)
    assert "500 line(s) of rank 0's output not kept" in pending[0]
    assert pending[1:] == [f"line {i}" for i in range(n - RUN_TAIL_LINES, n)]
    finished = out.finish()
    assert [line[1] for rank, line in finished] == pending
    assert out.add(0, "stdout", "late") is False and out.not_kept(0) == 501


def test_echo_holds_a_bounded_queue_and_counts_what_it_skipped() -> None:
    out = RunOutput(1)
    for i in range(ECHO_LINES + 25):
        out.add(0, "stderr", f"e{i}")
    lines, skipped = out.take_echo()
    assert (
        skipped == 25
        and len(lines) == ECHO_LINES
        and lines[-1] == (0, "stderr", f"e{ECHO_LINES + 24}")
    )
    assert out.take_echo() == ([], 0)
