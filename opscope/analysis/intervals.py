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
_CHUNK = 1 << 20  # intervals summed at a time by ``total``


def union(starts: np.ndarray, ends: np.ndarray) -> Intervals:
    """The sorted, disjoint intervals covering every ``[start, end)`` (``starts``
    itself, when sorted and disjoint already).

    >>> [a.tolist() for a in union(np.array([4, 0]), np.array([6, 4]))]
    [[0], [6]]
    """
    starts = np.asarray(starts, dtype=np.int64)
    ends = np.asarray(ends, dtype=np.int64)
    if len(starts) == 0:
        return starts[:0], ends[:0]
    if bool((starts[1:] >= starts[:-1]).all()):  # a session's rows: sorted already
        if bool((starts[1:] > ends[:-1]).all()):  # and disjoint (one op after another)
            return starts, ends
        s, e = starts, np.maximum.accumulate(ends)
    else:
        order = np.argsort(starts, kind="stable")
        s, e = starts[order], np.maximum.accumulate(ends[order])
    # a new interval begins where a start lies past every end before it
    begins = np.concatenate(([True], s[1:] > e[:-1]))
    if bool(begins.all()):  # disjoint already (a thread's top-level ops): no copies
        return s, e
    first = np.flatnonzero(begins)
    last = np.append(first[1:] - 1, len(s) - 1)
    return s[first], e[last]


def total(intervals: Intervals) -> int:
    """Length covered by a union.

    >>> total((np.array([0, 10]), np.array([5, 12])))
    7
    """
    starts, ends = intervals
    if len(starts) <= _CHUNK:
        return int((ends - starts).sum())
    out, lengths = 0, np.empty(_CHUNK, dtype=np.int64)  # 10M intervals: no 80 MB array
    for lo in range(0, len(starts), _CHUNK):
        part = lengths[:min(_CHUNK, len(starts) - lo)]
        np.subtract(ends[lo:lo + _CHUNK], starts[lo:lo + _CHUNK], out=part)
        out += int(part.sum())
    return out


def intersection(a: Intervals, b: Intervals) -> Intervals:
    """The intervals covered by both unions ``a`` and ``b``.

    Each interval of the shorter union is looked up in the longer one (the
    intervals it overlaps form one run there), so memory follows the result,
    not the sum of both: 10M intervals against none cost nothing.

    >>> [x.tolist() for x in intersection((np.array([0]), np.array([10])),
    ...                                   (np.array([2, 8]), np.array([4, 12])))]
    [[2, 8], [4, 10]]
    >>> [x.tolist() for x in intersection((np.array([0, 5]), np.array([3, 9])),
    ...                                   (np.array([2]), np.array([6])))]
    [[2, 5], [3, 6]]
    """
    if len(a[0]) == 0 or len(b[0]) == 0:
        empty = np.zeros(0, dtype=np.int64)
        return empty, empty.copy()
    if len(a[0]) < len(b[0]):
        a, b = b, a
    first = np.searchsorted(a[1], b[0], side="right")  # a's first interval ending after
    count = np.maximum(np.searchsorted(a[0], b[1], side="left") - first, 0)
    which = np.repeat(np.arange(len(b[0])), count)  # each overlapping pair: b's interval,
    run = np.arange(len(which)) - np.repeat(np.cumsum(count) - count, count)
    inside = np.repeat(first, count) + run  # and a's
    starts = np.maximum(a[0][inside], b[0][which])
    ends = np.minimum(a[1][inside], b[1][which])
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
