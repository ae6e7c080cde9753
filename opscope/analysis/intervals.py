"""Time intervals as numpy pairs: union, difference, overlap, without a loop per interval.

A set of intervals is a ``(starts, ends)`` pair of int64 arrays. ``union``
returns it sorted and disjoint; the other functions take such unions.

Example::

    >>> u = union(np.array([0, 5, 2]), np.array([3, 9, 4]))
    >>> u[0].tolist(), u[1].tolist(), total(u)
    ([0, 5], [4, 9], 8)
"""

from __future__ import annotations

from typing import Tuple

import numpy as np

Intervals = Tuple[np.ndarray, np.ndarray]


def union(starts: np.ndarray, ends: np.ndarray) -> Intervals:
    """The sorted, disjoint intervals covering every ``[start, end)``.

    >>> [a.tolist() for a in union(np.array([4, 0]), np.array([6, 4]))]
    [[0], [6]]
    """
    starts = np.asarray(starts, dtype=np.int64)
    ends = np.asarray(ends, dtype=np.int64)
    if len(starts) == 0:
        return starts[:0], ends[:0]
    order = np.argsort(starts, kind="stable")
    s, e = starts[order], np.maximum.accumulate(ends[order])
    # a new interval begins where a start lies past every end before it
    begins = np.concatenate(([True], s[1:] > e[:-1]))
    first = np.flatnonzero(begins)
    last = np.append(first[1:] - 1, len(s) - 1)
    return s[first], e[last]


def total(intervals: Intervals) -> int:
    """Length covered by a union.

    >>> total((np.array([0, 10]), np.array([5, 12])))
    7
    """
    return int((intervals[1] - intervals[0]).sum())


def intersection(a: Intervals, b: Intervals) -> Intervals:
    """The intervals covered by both unions ``a`` and ``b``.

    >>> [x.tolist() for x in intersection((np.array([0]), np.array([10])),
    ...                                   (np.array([2, 8]), np.array([4, 12])))]
    [[2, 8], [4, 10]]
    """
    edges = np.concatenate((a[0], a[1], b[0], b[1]))
    delta = np.concatenate((np.ones(len(a[0])), -np.ones(len(a[1])),
                            np.ones(len(b[0])), -np.ones(len(b[1])))).astype(np.int64)
    order = np.lexsort((delta, edges))  # at equal times, ends before starts
    edges, depth = edges[order], np.cumsum(delta[order])
    inside = depth == 2
    starts = edges[:-1][inside[:-1]]
    ends = edges[1:][inside[:-1]]
    keep = ends > starts
    return starts[keep], ends[keep]


def difference(a: Intervals, b: Intervals) -> Intervals:
    """The parts of union ``a`` not covered by union ``b``.

    >>> [x.tolist() for x in difference((np.array([0]), np.array([10])),
    ...                                 (np.array([2]), np.array([4])))]
    [[0, 4], [2, 10]]
    """
    if len(b[0]) == 0 or len(a[0]) == 0:
        return a
    # complement of b, then intersect
    lo = min(int(a[0].min()), int(b[0].min()))
    hi = max(int(a[1].max()), int(b[1].max()))
    comp_s = np.concatenate(([lo], b[1]))
    comp_e = np.concatenate((b[0], [hi]))
    keep = comp_e > comp_s
    return intersection(a, (comp_s[keep], comp_e[keep]))
