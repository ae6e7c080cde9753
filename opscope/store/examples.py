"""Example queries over a store, as docs/store.md shows them (each is tested on a real store).

Example::

    >>> sorted(EXAMPLE_QUERIES)
    ['memory peak per category', 'per-module time', 'straggler per step', 'top ops by self time']
"""

from __future__ import annotations

EXAMPLE_QUERIES = {
    "top ops by self time": """\
SELECT CASE WHEN name LIKE 'ProfilerStep#%' THEN 'ProfilerStep*' ELSE name END AS op,
       count(*) AS calls, sum(self_ns) / 1e6 AS self_ms
FROM events
GROUP BY op
ORDER BY self_ms DESC
LIMIT 20""",
    "per-module time": """\
SELECT module, count(DISTINCT rank) AS ranks, sum(self_ns) / 1e6 AS self_ms
FROM events
WHERE module IS NOT NULL
GROUP BY module
ORDER BY self_ms DESC""",
    "straggler per step": """\
WITH late AS (
    SELECT step, rank, sum(late_wall_ns) AS late_ns  -- overlapping collectives once
    FROM collective_ranks
    WHERE step IS NOT NULL
    GROUP BY step, rank)
SELECT step, arg_max(rank, late_ns) AS straggler, max(late_ns) / 1e6 AS late_ms
FROM late
GROUP BY step
ORDER BY step""",
    "memory peak per category": """\
SELECT rank, coalesce(category, 'unknown') AS category, max(total_allocated) AS peak_bytes
FROM memory
GROUP BY ALL
ORDER BY rank, peak_bytes DESC""",
}
