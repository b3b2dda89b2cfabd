"""Disjoint sets over nodes 0..n−1: the one grouping of pairs of the project (images with the
same file or pixels, films confirmed as one, both in processing/corpus/duplicates.py)."""

from __future__ import annotations

import numpy as np


class UnionFind:
    """Sets of nodes joined a pair at a time (`union`, with path halving) or many pairs at
    once (`union_pairs`, vectorized); `labels` numbers the sets by their smallest node."""

    def __init__(self, count: int) -> None:
        self.parent = np.arange(count, dtype=np.int64)

    def __len__(self) -> int:
        return len(self.parent)

    def root(self, node: int) -> int:
        """The node standing for `node`'s set."""
        parent = self.parent
        while parent[node] != node:
            parent[node] = parent[parent[node]]
            node = parent[node]
        return int(node)

    def connected(self, a: int, b: int) -> bool:
        return self.root(a) == self.root(b)

    def union(self, a: int, b: int) -> bool:
        """Join the sets of `a` and `b` (`a`'s root then points to `b`'s); False when they
        were one set already."""
        first, second = self.root(a), self.root(b)
        if first == second:
            return False
        self.parent[first] = second
        return True

    def union_pairs(self, left: np.ndarray, right: np.ndarray) -> None:
        """Join every pair (left[k], right[k]) at once: each round hooks the larger root of
        every pair still apart onto the smallest root it is paired with, then points every
        node at its root; a round leaves fewer roots, so the rounds end."""
        left = np.asarray(left, dtype=np.int64)
        right = np.asarray(right, dtype=np.int64)
        parent = self.roots()
        while True:
            first, second = parent[left], parent[right]
            apart = first != second
            if not apart.any():
                break
            left, right = left[apart], right[apart]
            first, second = first[apart], second[apart]
            np.minimum.at(parent, np.maximum(first, second), np.minimum(first, second))
            parent = _compressed(parent)
        self.parent = parent

    def roots(self) -> np.ndarray:
        """Every node's root (and every node made to point at it)."""
        self.parent = _compressed(self.parent)
        return self.parent.copy()

    def labels(self) -> np.ndarray:
        """Every node's set as 0..sets−1, numbered in the order of their smallest node (as
        scipy's connected_components numbers them)."""
        _, first, inverse = np.unique(self.roots(), return_index=True, return_inverse=True)
        rank = np.empty(len(first), dtype=np.int64)
        rank[np.argsort(first)] = np.arange(len(first))
        return rank[inverse.reshape(-1)]


def _compressed(parent: np.ndarray) -> np.ndarray:
    """`parent` with every node pointing at its root (pointer jumping)."""
    while True:
        jumped = parent[parent]
        if np.array_equal(jumped, parent):
            return parent
        parent = jumped
