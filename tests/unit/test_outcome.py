"""When a run is over: ``cluster.outcome.Outcome`` with a fake clock (Note [Run outcome])."""

from __future__ import annotations

import threading

import pytest

from interactive_shard.cluster.outcome import FAILURE_GRACE_S, STREAM_GRACE_S, Outcome, Reply


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock() -> Clock:
    return Clock()


def test_all_done_with_streams_closed_is_decided_at_once(clock: Clock) -> None:
    outcome = Outcome(2, clock=clock)
    outcome.reply(0, Reply.DONE)
    outcome.stream_closed(0)
    assert not outcome.decided() and outcome.pending == [1]
    outcome.reply(1, Reply.DONE)
    assert not outcome.decided()  # rank 1's events may still be in flight
    outcome.stream_closed(1)
    assert outcome.decided()
    verdict = outcome.verdict()
    assert (verdict.stuck, verdict.failed, verdict.restart) == ([], [], False)


def test_a_stream_closed_before_the_reply_counts(clock: Clock) -> None:
    outcome = Outcome(1, clock=clock)
    outcome.stream_closed(0)  # the final batch can overtake the pipe's reply
    outcome.reply(0, Reply.DONE)
    assert outcome.decided()


def test_a_long_run_without_failure_is_never_decided(clock: Clock) -> None:
    outcome = Outcome(2, clock=clock)
    outcome.reply(0, Reply.DONE)
    clock.advance(3600)
    assert not outcome.decided() and outcome.pending == [1]


def test_one_failure_with_the_others_stuck(clock: Clock) -> None:
    outcome = Outcome(3, clock=clock)
    outcome.reply(1, Reply.ERROR)
    clock.advance(FAILURE_GRACE_S / 2)
    assert not outcome.decided()  # the others get time to report
    outcome.reply(2, Reply.ERROR)
    clock.advance(FAILURE_GRACE_S / 2)
    assert outcome.decided()  # the grace counts from the first failure
    verdict = outcome.verdict()
    assert verdict.stuck == [0] and verdict.failed == [1, 2]
    assert verdict.restart  # a stuck rank sits in a collective: the group is gone


def test_errors_that_leave_the_group_usable_need_no_restart(clock: Clock) -> None:
    outcome = Outcome(2, clock=clock)
    outcome.reply(0, Reply.ERROR)
    outcome.reply(1, Reply.ERROR)
    for rank in (0, 1):
        outcome.stream_closed(rank)
    assert outcome.decided()
    assert outcome.verdict().restart is False


def test_a_broken_group_needs_a_restart(clock: Clock) -> None:
    outcome = Outcome(2, clock=clock)
    outcome.reply(0, Reply.ERROR)
    outcome.reply(1, Reply.BROKEN)
    outcome.stream_closed(0)
    outcome.stream_closed(1)
    assert outcome.decided() and outcome.verdict().restart


def test_a_kill_9_decides_without_waiting_for_the_dead_ranks_stream(clock: Clock) -> None:
    outcome = Outcome(2, clock=clock)
    outcome.reply(0, Reply.DIED)  # its final batch will never come
    clock.advance(FAILURE_GRACE_S)
    outcome.reply(1, Reply.ERROR)  # the other rank lost its peer
    outcome.stream_closed(1)
    assert outcome.decided()
    verdict = outcome.verdict()
    assert verdict.failed == [0, 1] and verdict.stuck == [] and verdict.restart


def test_a_stream_that_never_closes_is_given_up_after_the_grace(clock: Clock) -> None:
    outcome = Outcome(2, clock=clock)
    outcome.reply(0, Reply.DONE)
    outcome.reply(1, Reply.DONE)
    outcome.stream_closed(0)
    clock.advance(STREAM_GRACE_S - 0.01)
    assert not outcome.decided()
    clock.advance(0.01)
    assert outcome.decided()
    assert outcome.verdict().restart is False


def test_only_the_first_reply_of_a_rank_counts(clock: Clock) -> None:
    outcome = Outcome(1, clock=clock)
    assert outcome.reply(0, Reply.ERROR)
    assert not outcome.reply(0, Reply.DIED)  # the process exits after reporting
    assert outcome.replies == {0: Reply.ERROR}


def test_a_report_wakes_a_waiter() -> None:
    outcome = Outcome(1)
    woke = threading.Event()

    def wait() -> None:
        outcome.wait_for_change(10)
        woke.set()

    waiter = threading.Thread(target=wait)
    waiter.start()
    while not woke.is_set():
        outcome.stream_closed(0)
        woke.wait(0.01)
    waiter.join(1)
    assert woke.is_set()


def test_events_still_arriving_hold_the_decision_past_the_grace(clock: Clock) -> None:
    outcome = Outcome(2, clock=clock)
    outcome.reply(0, Reply.DONE, sent=600_000)
    outcome.reply(1, Reply.DONE, sent=10)
    outcome.received(1, 10)
    outcome.stream_closed(1)
    for _ in range(10):  # rank 0's events keep coming, 20 s after the replies
        clock.advance(STREAM_GRACE_S / 2)
        outcome.received(0, 50_000)
        assert not outcome.decided()
    clock.advance(STREAM_GRACE_S)  # then nothing for the grace: given up, and counted
    assert outcome.decided()
    assert outcome.missing() == {0: 100_000}


def test_a_closed_stream_misses_nothing(clock: Clock) -> None:
    outcome = Outcome(1, clock=clock)
    outcome.received(0, 7)
    outcome.stream_closed(0)
    outcome.reply(0, Reply.DONE, sent=7)
    assert outcome.decided() and outcome.missing() == {}
