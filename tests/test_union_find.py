"""The union-find that groups pairs: against scipy's connected components (the same sets,
numbered alike), a pair at a time and many at once."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.sparse import coo_matrix
from scipy.sparse.csgraph import connected_components

from radharmony_pipeline.processing.corpus.union_find import UnionFind


def _scipy_labels(left: np.ndarray, right: np.ndarray, count: int) -> np.ndarray:
    graph = coo_matrix((np.ones(len(left), dtype=np.int8), (left, right)), shape=(count, count))
    return connected_components(graph, directed=False)[1]


def _random_edges(seed: int, count: int, edges: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.integers(0, count, edges), rng.integers(0, count, edges)


@pytest.mark.parametrize(("count", "edges"), [(1, 0), (50, 10), (300, 250), (2_000, 1_900)])
def test_labels_equal_connected_components(count, edges):
    for seed in range(5):
        left, right = _random_edges(seed, count, edges)
        expected = _scipy_labels(left, right, count)
        at_once = UnionFind(count)
        at_once.union_pairs(left, right)
        one_by_one = UnionFind(count)
        for a, b in zip(left.tolist(), right.tolist(), strict=True):
            one_by_one.union(a, b)
        assert np.array_equal(at_once.labels(), expected)
        assert np.array_equal(one_by_one.labels(), expected)
    assert len(np.unique(expected)) < count or edges == 0  # some sets were joined


def test_long_chains_in_any_order():
    count = 5_000
    order = np.random.default_rng(3).permutation(count)
    for left, right in ((order[:-1], order[1:]), (order[1:], order[:-1])):
        found = UnionFind(count)
        found.union_pairs(left, right)
        assert (found.labels() == 0).all()
        assert (found.roots() == found.roots()[0]).all()


def test_pairs_at_once_after_pairs_one_by_one():
    left, right = _random_edges(11, 400, 300)
    joined = UnionFind(400)
    for a, b in zip(left[:150].tolist(), right[:150].tolist(), strict=True):
        joined.union(a, b)
    joined.union_pairs(left[150:], right[150:])
    assert np.array_equal(joined.labels(), _scipy_labels(left, right, 400))


def test_union_says_whether_it_joined():
    sets = UnionFind(4)
    assert sets.union(0, 1) and sets.union(2, 1)
    assert not sets.union(0, 2) and sets.connected(2, 0)
    assert not sets.connected(3, 0)
    assert sets.root(0) == sets.root(2) == 1  # the first's root points to the second's
    assert sets.labels().tolist() == [0, 0, 0, 1]
    assert len(UnionFind(0).labels()) == 0
