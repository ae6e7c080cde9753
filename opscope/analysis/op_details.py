"""Per operator row: which inputs, callers and call sites its time came from.

The Operators view shows, for each ``key_averages`` row, the most frequent
input shapes, the ranges and ops it was called from and its Python call sites.
Each is the same computation: label every event (its input signature, its
caller's name, its stack), then per row keep the labels with the most time.

Example::

    >>> import numpy as np
    >>> top_groups(np.array([0, 0, 1]), np.array([5, 5, 7]), np.array([1.0, 2.0, 4.0]), 2, 8)
    [[(5, 2, 3.0)], [(7, 1, 4.0)]]
"""

from __future__ import annotations

from typing import List, Tuple

import numpy as np

from opscope.analysis.aggregate import display_names
from opscope.model.events import EventTable
from opscope.model.records import SCOPE_USER


def key_rows(table: EventTable) -> np.ndarray:
    """Per event, the index of its ``key_averages`` row (default grouping).

    One row per (display name, user range or not), rows ordered by each key's
    first event, as ``key_averages`` orders them.
    """
    if len(table) == 0:
        return np.zeros(0, dtype=np.int64)
    row_key = display_names(table)[0] * 2 + (table.scope == SCOPE_USER).astype(np.int64)
    _, first, group = np.unique(row_key, return_index=True, return_inverse=True)
    rank = np.empty(len(first), dtype=np.int64)
    rank[np.argsort(first, kind="stable")] = np.arange(len(first))
    return rank[group.reshape(-1)]


def caller_names(table: EventTable) -> Tuple[np.ndarray, List[str]]:
    """Per event, the display-name id of its parent (-1 for a root), and the names."""
    ids, names = display_names(table)
    if len(table) == 0:
        return np.zeros(0, dtype=np.int64), names
    parent = table.parent
    return np.where(parent >= 0, ids[np.maximum(parent, 0)], -1), names


def top_groups(event_row: np.ndarray, label: np.ndarray, weights: np.ndarray, n_rows: int,
               limit: int) -> List[List[tuple]]:
    """Per row, up to ``limit`` (label, count, weight sum) by weight, largest first.

    Events with a label below 0 count for no group.
    """
    out: List[List[tuple]] = [[] for _ in range(n_rows)]
    valid = label >= 0
    if not valid.any():
        return out
    span = int(label[valid].max()) + 1
    pair = event_row[valid] * span + label[valid]
    uniq, inverse, counts = np.unique(pair, return_inverse=True, return_counts=True)
    sums = np.bincount(inverse, weights=weights[valid])
    rank = np.lexsort((-sums, uniq // span))
    for g in rank.tolist():
        r = int(uniq[g] // span)
        if len(out[r]) < limit:
            out[r].append((int(uniq[g] % span), int(counts[g]), float(sums[g])))
    return out
