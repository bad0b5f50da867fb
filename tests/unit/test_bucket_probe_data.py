"""The probe's pure helpers, on the ``(param index, time)`` lists a real backward gives."""

from __future__ import annotations

from interactive_shard.buckets._probe_data import ready_at


def test_ready_at_takes_the_arrival_before_the_launch() -> None:
    # Checkpoint-twice order: head (1, 0) in the user's backward, the layer (3, 2) in the
    # first nested backward, DDP launches at 2.5, then the layer again in the second one.
    ready = [(1, 0.0), (0, 0.1), (3, 2.0), (2, 2.1), (3, 5.0), (2, 5.1)]
    at = ready_at(ready)
    assert [at(i, 2.5) for i in range(4)] == [0.1, 0.0, 2.1, 2.0]
    assert at(2, 9.0) == 5.1 and at(2, 1.0) == 1.0  # none before: the launch itself
    assert at(7, 2.5) == 2.5  # never ready (marked by DDP itself): the launch


def test_ready_at_without_repeats_is_the_only_arrival() -> None:
    at = ready_at([(1, 0.0), (0, 0.1)])
    assert (at(0, 0.5), at(1, 0.5), at(2, 0.5)) == (0.1, 0.0, 0.5)
