"""Interval sets (``opscope.analysis.intervals``) against their definition: covered points.

Random unions on a small integer grid; union, intersection and difference must cover
exactly the points their definitions say, as sorted, disjoint, non-empty intervals.
"""

from __future__ import annotations

import numpy as np

from opscope.analysis.intervals import difference, intersection, total, union


def _points(intervals) -> set:
    return {p for s, e in zip(*(x.tolist() for x in intervals)) for p in range(s, e)}


def _well_formed(intervals) -> bool:
    s, e = (x.tolist() for x in intervals)
    return all(a < b for a, b in zip(s, e)) and all(e[i] <= s[i + 1] for i in range(len(s) - 1))


def test_set_operations_cover_the_points_their_definitions_say():
    rng = np.random.default_rng(32)
    for _ in range(800):
        n, m = rng.integers(0, 25, 2)
        s1, s2 = rng.integers(0, 90, n), rng.integers(0, 90, m)
        a = union(s1, s1 + rng.integers(1, 15, n))
        b = union(s2, s2 + rng.integers(1, 15, m))
        pa, pb = _points(a), _points(b)
        for got, want in ((a, pa), (intersection(a, b), pa & pb), (intersection(b, a), pa & pb),
                          (difference(a, b), pa - pb)):
            assert _points(got) == want and total(got) == len(want)
            assert _well_formed(got)


def test_a_sorted_union_needs_no_sort_and_ten_million_against_none_is_empty():
    starts = np.arange(0, 10_000_000, 2, dtype=np.int64)
    u = union(starts, starts + 1)
    assert len(u[0]) == 5_000_000 and total(u) == 5_000_000
    assert len(intersection(u, union(np.zeros(0), np.zeros(0)))[0]) == 0
    assert total(intersection(u, (np.array([10]), np.array([20])))) == 5
