"""Walks over the event tree, vectorised by depth level.

``parent`` is ``EventTable.parent`` (-1 for a root; parents come before their
children in table order). Each function loops over depth levels, never over
events, so a million events take a few numpy passes.

Example::

    >>> import numpy as np
    >>> parent = np.array([-1, 0, 1, 0])
    >>> event_depth(parent).tolist()
    [0, 1, 2, 1]
    >>> inherit_down(parent, np.array([-1, 5, -1, -1])).tolist()
    [-1, 5, 5, -1]
"""

from __future__ import annotations

from typing import List

import numpy as np


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


def inherit_down(parent: np.ndarray, own: np.ndarray) -> np.ndarray:
    """Each event's label: its own where ``own >= 0``, else its nearest labelled ancestor's.

    Events with no labelled ancestor get -1.
    """
    out = own.astype(np.int64, copy=True)
    for rows in levels(parent)[1:]:
        unlabelled = rows[out[rows] < 0]
        out[unlabelled] = out[parent[unlabelled]]
    return out


def outermost_down(parent: np.ndarray, own: np.ndarray) -> np.ndarray:
    """Each event's label from its *outermost* labelled ancestor (itself included).

    >>> outermost_down(np.array([-1, 0, 1]), np.array([-1, 3, 4])).tolist()
    [-1, 3, 3]
    """
    out = own.astype(np.int64, copy=True)
    for rows in levels(parent)[1:]:
        from_above = out[parent[rows]]
        out[rows] = np.where(from_above >= 0, from_above, out[rows])
    return out
