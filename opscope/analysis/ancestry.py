"""Vectorised walks over the event tree (``EventTable.parent``: -1 for a root,
parents before their children in table order).

Used by the module, FLOP, memory and stack analyses and by the report: "which
module range encloses this op", "is this op inside a backward node", "does this
op have a counted child", "what did this op and everything under it allocate".

Example::

    >>> import numpy as np
    >>> parent = np.array([-1, 0, 1, 2, -1])
    >>> marked = np.array([True, False, True, False, False])
    >>> nearest_marked(parent, marked).tolist()
    [0, 0, 2, 2, -1]
    >>> has_marked_descendant(parent, np.array([False, False, False, True, False])).tolist()
    [True, True, True, False, False]
    >>> event_depth(parent).tolist(), subtree_sum(parent, np.array([1, 2, 4, 8, 16])).tolist()
    ([0, 1, 2, 3, 0], [15, 14, 12, 8, 16])
"""

from __future__ import annotations

from typing import List

import numpy as np

from opscope.model.arrays import distinct


def event_depth(parent: np.ndarray) -> np.ndarray:
    """Nesting depth of each event: 0 for a root, 1 for its children, ...

    >>> event_depth(np.array([-1, -1])).tolist()
    [0, 0]
    """
    depth = np.zeros(len(parent), dtype=np.int64)
    current = parent.astype(np.int64, copy=True)
    while True:
        alive = current >= 0
        if not alive.any():
            return depth
        depth += alive
        current = np.where(alive, parent[np.maximum(current, 0)], -1)


def levels(parent: np.ndarray) -> List[np.ndarray]:
    """Event indices per depth, roots first.

    >>> [lv.tolist() for lv in levels(np.array([-1, 0, -1]))]
    [[0, 2], [1]]
    """
    depth = event_depth(parent)
    if len(depth) == 0:
        return []
    order = np.argsort(depth, kind="stable")
    bounds = np.searchsorted(depth[order], np.arange(int(depth.max()) + 2))
    return [order[bounds[d]:bounds[d + 1]] for d in range(len(bounds) - 1)]


def subtree_sum(parent: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Each event's value plus its descendants' values, deepest level first."""
    total = values.astype(np.int64).copy()
    for rows in reversed(levels(parent)[1:]):
        np.add.at(total, parent[rows], total[rows])
    return total


def nearest_marked(parent: np.ndarray, marked: np.ndarray) -> np.ndarray:
    """Per event, the nearest event at or above it (itself first) that is marked; -1 if none.

    Pointer jumping: each round halves the remaining distance, so the number
    of numpy passes grows with the log of the tree depth.
    """
    n = len(parent)
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    marked = np.asarray(marked, dtype=bool)
    ptr = np.where(marked, np.arange(n, dtype=np.int64), parent.astype(np.int64))
    while True:
        live = ptr >= 0
        live[live] = ~marked[ptr[live]]
        if not live.any():
            return ptr
        ptr[live] = ptr[ptr[live]]


def nearest_marked_ancestor(parent: np.ndarray, marked: np.ndarray) -> np.ndarray:
    """Like :func:`nearest_marked` but never the event itself.

    >>> nearest_marked_ancestor(np.array([-1, 0]), np.array([True, True])).tolist()
    [-1, 0]
    """
    found = nearest_marked(parent, marked)
    p = parent.astype(np.int64)
    return np.where(p >= 0, found[np.maximum(p, 0)], -1)


def has_marked_descendant(parent: np.ndarray, marked: np.ndarray) -> np.ndarray:
    """True for every event with a marked event somewhere below it."""
    n = len(parent)
    out = np.zeros(n, dtype=bool)
    frontier = distinct(parent[np.asarray(marked, dtype=bool)])
    frontier = frontier[frontier >= 0]
    while len(frontier):
        frontier = frontier[~out[frontier]]
        out[frontier] = True
        frontier = distinct(parent[frontier])
        frontier = frontier[frontier >= 0]
    return out
