"""Vectorised walks up the event tree (``EventTable.parent``).

Used by the module and FLOP analyses: "which module range encloses this op",
"is this op inside a backward node", "does this op have a counted child".

Example::

    >>> import numpy as np
    >>> parent = np.array([-1, 0, 1, 2, -1])
    >>> marked = np.array([True, False, True, False, False])
    >>> nearest_marked(parent, marked).tolist()
    [0, 0, 2, 2, -1]
    >>> has_marked_descendant(parent, np.array([False, False, False, True, False])).tolist()
    [True, True, True, False, False]
"""

from __future__ import annotations

import numpy as np


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
    frontier = np.unique(parent[np.asarray(marked, dtype=bool)])
    frontier = frontier[frontier >= 0]
    while len(frontier):
        frontier = frontier[~out[frontier]]
        out[frontier] = True
        frontier = np.unique(parent[frontier])
        frontier = frontier[frontier >= 0]
    return out
