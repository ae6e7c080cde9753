"""Label propagation down the event tree, vectorised by depth level.

Depths and levels come from ``opscope.analysis.ancestry``. The step breakdown's
categories (``opscope.analysis.categories``) are labels propagated this way.

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

import numpy as np

from opscope.analysis.ancestry import event_depth, levels  # noqa: F401 (doctest)


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
