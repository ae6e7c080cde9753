"""Stragglers: ranks late at collectives by more than the job's own noise, and consistently.

On a balanced job every rank is sometimes the last to arrive at a collective, by
an amount that scheduling, the OS and the profilers' starts decide: the job's
noise. Naming the last rank of each collective (as Holistic Trace Analysis
names its top ranks in every iteration) names a rank on every job. The rule
here names a rank only when it is late by well beyond that noise, again and
again:

1. **Lateness.** At each collective, a rank's lateness is its arrival minus the
   median arrival of the other ranks there (negative: early). The median of
   the others, so that one other slow rank does not hide a straggler.
2. **Noise.** ``noise(r)`` is the largest of three spreads, each measured so
   that a straggler's own lateness does not raise its bar:

   - the others' spread: the median, over collectives, of twice the median
     distance of the other ranks' arrivals from their median (their range
     when there are two; none with 2 ranks in all);
   - the others' lateness: the median lateness of the other ranks at the
     collectives where they were late (lateness > 0);
   - ``r``'s own jitter: the median absolute deviation of its lateness at the
     collectives where it was at least ``floor_ms`` late. A rank late by 1 to
     40 ms at random is noisy; one late by 200 ms +- 3 is not.
3. **Late beyond the noise.** ``r`` is late beyond the noise at a collective
   when its lateness is at least ``NOISE_FACTOR x noise(r)`` and ``floor_ms``
   (``opscope ranks --min-lateness-ms``, and 5% of a step:
   ``opscope.analysis.ranks.analyse``).
4. **Consistently.** ``r`` is a straggler when it is late beyond the noise at
   ``MIN_LATE_COLLECTIVES`` collectives or more (at its only one, in a job of
   one) and at a third (``MIN_LATE_FRACTION``) of the collectives it joined. One late
   arrival (the first collective of a window, where the ranks' profilers
   started at different times; a rank descheduled once) is not a straggler; a
   rank that sleeps before each backward is late at each gradient all-reduce.

Stragglers are listed by total lateness (count x mean), the latest first.
``NOISE_FACTOR`` 5 and ``MIN_LATE_FRACTION`` a third were set on balanced
torchrun gloo jobs of 2, 3 and 4 ranks (8 steps, 16 collectives) on a loaded
2-core host (``tests/test_stragglers.py`` runs such jobs): a rank that
oversubscribed the cores was a few ms late at a third to half of the
collectives, up to 4.5 times its noise (a factor of 4 named one such rank in
12 jobs, 5 none), and a rank whose profiler started late was late beyond 5
times its noise at its first 4 of 16 collectives (a quarter named it). A rank
sleeping 200 ms before each backward is late by 50 to 100 times its noise, at
every other collective.

Example (three ranks, rank 2 late by 50 ms at 3 of 4 collectives, the others
within 1 ms of each other)::

    >>> arrivals = [{0: 0.0, 1: 0.5, 2: 50.0}, {0: 100.4, 1: 100.0, 2: 150.0},
    ...             {0: 200.0, 1: 200.8, 2: 200.3}, {0: 300.0, 1: 300.2, 2: 350.0}]
    >>> find_stragglers(arrivals, floor_ms=1.0)
    [Straggler(rank=2, late_count=3, mean_lateness_ms=49.817)]
    >>> find_stragglers(arrivals[2:3], floor_ms=1.0)  # balanced: nobody
    []
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Mapping, Sequence

import numpy as np

NOISE_FACTOR = 5.0
MIN_LATE_COLLECTIVES = 2
MIN_LATE_FRACTION = 1 / 3


@dataclass
class Straggler:
    """A rank late beyond the job's noise at ``late_count`` collectives, by ``mean_lateness_ms``."""

    rank: int
    late_count: int
    mean_lateness_ms: float


def lateness_matrix(arrivals: Sequence[Mapping[int, float]]):
    """(ranks, lateness [rank, collective] in ms, NaN where a rank did not join).

    >>> ranks, late = lateness_matrix([{0: 0.0, 1: 3.0}, {0: 10.0, 1: 9.0, 2: 14.0}])
    >>> ranks, late.tolist()
    ([0, 1, 2], [[-3.0, -1.5], [3.0, -3.0], [nan, 4.5]])
    """
    ranks = sorted({r for a in arrivals for r in a})
    index = {r: i for i, r in enumerate(ranks)}
    late = np.full((len(ranks), len(arrivals)), np.nan)
    for c, here in enumerate(arrivals):
        if len(here) < 2:
            continue
        rows = np.fromiter((index[r] for r in here), dtype=np.int64, count=len(here))
        times = np.fromiter(here.values(), dtype=np.float64, count=len(here))
        late[rows, c] = times - _median_of_others(times)
    return ranks, late


def _median_of_others(times: np.ndarray) -> np.ndarray:
    """For each value, the median of all the other values (two values or more).

    >>> _median_of_others(np.array([5.0, 1.0, 3.0, 10.0])).tolist()
    [3.0, 5.0, 5.0, 3.0]
    """
    k = len(times)
    order = np.argsort(times, kind="stable")
    ranked = times[order]
    pos = np.empty(k, dtype=np.int64)
    pos[order] = np.arange(k)

    def remaining(j: int) -> np.ndarray:  # the j-th smallest once each value is removed
        return np.where(pos > j, ranked[j], ranked[min(j + 1, k - 1)])

    if k % 2 == 0:  # k - 1 others: one middle value
        return remaining((k - 2) // 2)
    return (remaining((k - 3) // 2) + remaining((k - 1) // 2)) / 2


def _others_spread(arrivals: Sequence[Mapping[int, float]], index: Dict[int, int],
                   n: int) -> np.ndarray:
    """Per rank, the median over collectives of the others' spread (0: never 2 others).

    The others' spread at a collective: twice the median distance of the other
    ranks' arrivals from their median (their range, for 2 others); a minority
    of other stragglers does not move it.

    >>> _others_spread([{0: 0.0, 1: 1.0, 2: 9.0, 3: 1.5}], {0: 0, 1: 1, 2: 2, 3: 3}, 4).tolist()
    [1.0, 3.0, 1.0, 2.0]
    """
    spread = np.full((n, len(arrivals)), np.nan)
    for c, here in enumerate(arrivals):
        k = len(here)
        if k < 3:
            continue
        rows = np.fromiter((index[r] for r in here), dtype=np.int64, count=k)
        times = np.fromiter(here.values(), dtype=np.float64, count=k)
        gaps = np.abs(times[None, :] - _median_of_others(times)[:, None])
        np.fill_diagonal(gaps, np.inf)  # a rank is not its own other: the k - 1 smallest
        middle = sorted({(k - 2) // 2, (k - 1) // 2})
        gaps = np.partition(gaps, middle, axis=1)[:, middle]
        spread[rows, c] = 2 * gaps.mean(axis=1)
    known = ~np.isnan(spread).all(axis=1)
    out = np.zeros(n)
    out[known] = np.nanmedian(spread[known], axis=1)
    return out


def _others_lateness(late: np.ndarray) -> np.ndarray:
    """Per rank, the median of the other ranks' positive lateness (0: they have none)."""
    rows, _ = np.nonzero(late > 0)
    values = late[late > 0]
    out = np.zeros(late.shape[0])
    for r in range(late.shape[0]):
        others = values[rows != r]
        out[r] = float(np.median(others)) if others.size else 0.0
    return out


def _own_jitter(late: np.ndarray, floor_ms: float) -> np.ndarray:
    """Per rank, the median absolute deviation of its lateness where it is >= ``floor_ms``."""
    out = np.zeros(late.shape[0])
    for r, row in enumerate(late):
        big = row[row >= floor_ms]
        if big.size >= 2:
            out[r] = float(np.median(np.abs(big - np.median(big))))
    return out


def find_stragglers(arrivals: Sequence[Mapping[int, float]], *,
                    floor_ms: float) -> List[Straggler]:
    """The stragglers of a job given each collective's arrivals (rank -> ms); see above.

    >>> find_stragglers([{0: 0.0, 1: 400.0}], floor_ms=1.0)  # a job of one collective
    [Straggler(rank=1, late_count=1, mean_lateness_ms=400.0)]
    """
    ranks, late = lateness_matrix(arrivals)
    if not ranks:
        return []
    index = {r: i for i, r in enumerate(ranks)}
    noise = np.maximum.reduce([_others_spread(arrivals, index, len(ranks)),
                               _others_lateness(late), _own_jitter(late, floor_ms)])
    bar = np.maximum(NOISE_FACTOR * noise, floor_ms)
    found: List[Straggler] = []
    for i, rank in enumerate(ranks):
        joined = late[i][~np.isnan(late[i])]
        beyond = joined[joined >= bar[i]]
        need = max(min(MIN_LATE_COLLECTIVES, len(joined)), MIN_LATE_FRACTION * len(joined))
        if len(beyond) and len(beyond) >= need:
            found.append(Straggler(rank, len(beyond), round(float(beyond.mean()), 3)))
    return sorted(found, key=lambda s: (-s.late_count * s.mean_lateness_ms, s.rank))
