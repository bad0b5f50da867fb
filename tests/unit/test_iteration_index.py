"""The shared per-(rank, iteration) index (telemetry/iteration_index.py) against a plain
dict of lists, for any order of filing (Hypothesis)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from interactive_shard.telemetry.iteration_index import IterationIndex, RankIterations, by_rank

# Batches of (rank, iteration) events, filed one batch at a time; a restart between batches.
batches = st.lists(
    st.tuples(
        st.lists(st.tuples(st.integers(0, 3), st.integers(1, 12)), max_size=20),
        st.booleans(),
    ),
    max_size=8,
)


@settings(max_examples=300, deadline=None)
@given(batches)
def test_index_matches_a_dict_of_lists(filing: list[tuple[list[tuple[int, int]], bool]]) -> None:
    index = IterationIndex(RankIterations)
    expected: dict[int, dict[int, list[int]]] = {}
    position = 0
    for events, restart in filing:
        if restart and events:
            index.restart(events[0][0])
            expected[events[0][0]] = {}
        ranks = np.array([r for r, _ in events], dtype=np.int64)
        its = np.array([i for _, i in events], dtype=np.int64)
        positions = np.arange(position, position + len(events), dtype=np.int64)
        position += len(events)
        for rank, picked in by_rank(ranks):
            before = set(index.of(rank).iterations())
            view = index.of(rank).array()  # a view taken before stays as it was
            kept = view.copy()
            index.file(rank, its[picked], positions[picked])
            assert set(index.of(rank).iterations()) - before == set(its[picked].tolist()) - before
            assert np.array_equal(view, kept)
        for (r, it), at in zip(events, positions.tolist(), strict=True):
            expected.setdefault(r, {}).setdefault(it, []).append(at)
    every = sorted({it for per in expected.values() for it in per})
    assert index.iterations() == every
    for rank, per in expected.items():
        here = index.of(rank)
        assert here.iterations() == sorted(per)
        assert here.array().tolist() == sorted(per)
        assert here.newest() == (max(per) if per else 0)
        for it in range(0, 14):
            assert index.positions(rank, it) == per.get(it, [])
            assert here.has(it) == (it in per)
            assert here.stamp(it) == (here.generation, len(per.get(it, [])))
        assert len(here) == sum(map(len, per.values()))


def test_restart_forgets_a_rank_and_changes_its_stamps() -> None:
    index = IterationIndex(RankIterations)
    index.file(0, np.array([1, 2, 2]), np.array([10, 11, 12]))
    index.file(1, np.array([1]), np.array([13]))
    stamp = index.of(0).stamp(2)
    assert index.positions(0, 2) == [11, 12] and index.ranks_with(1) == [0, 1]
    index.restart(0)
    assert index.positions(0, 2) == [] and index.iterations() == [1]
    index.file(0, np.array([2]), np.array([14]))
    assert index.of(0).stamp(2) != stamp and index.iterations() == [1, 2]


def test_by_rank_groups_many_ranks_in_filing_order() -> None:
    ranks = np.array([9, 0, 30, 9, 0, 30, 5])
    groups = {r: picked.tolist() for r, picked in by_rank(ranks)}
    assert groups == {0: [1, 4], 5: [6], 9: [0, 3], 30: [2, 5]}
    assert dict(by_rank(np.array([2, 1, 2]))).keys() == {1, 2}
    assert list(by_rank(np.empty(0, np.int64))) == []
