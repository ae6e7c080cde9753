"""Waits and lateness of collectives in flight at once count once, as wall time (issue 27, 8);
the example store queries of docs/store.md (items 8 and 30).

DDP issues its bucket all-reduces back to back, so they run at once: a rank that waits
for a late peer waits for both together. Two synthetic ranks, rank 1 late by 300 us at two
overlapping all-reduces: rank 0's wait, and rank 1's lateness in docs/store.md's straggler
query, are 310 us of wall time, not 600.
"""

from __future__ import annotations

import pytest

from opscope.analysis.ranks.analyse import analyse_ranks
from opscope.analysis.ranks.facts import rank_facts
from synthetic import SCOPE_USER, Op, make_session

LATE_US = 300


def rank_session(rank: int):
    """A step with two all-reduces on the caller's thread and gloo's ranges on two workers;
    rank 1 arrives LATE_US later, both end together."""
    late = LATE_US if rank else 0
    ops = [Op("ProfilerStep#1", 0, 1000, scope=SCOPE_USER)]
    for i, at in enumerate((100, 110)):
        ops.append(Op("c10d::allreduce_", at + late, at + late + 5))
        ops.append(Op("gloo:all_reduce", at + late, at + 400, thread=1 + i, scope=SCOPE_USER))
    return make_session(ops, thread_ids=(4242, 4243, 4244), start_us=0, stop_us=1000,
                        metadata={"distributedInfo": f'{{"rank": {rank}, "world_size": 2}}'})


def test_overlapping_waits_are_wall_time():
    facts = [rank_facts(rank_session(r), f"r{r}.json", r) for r in (0, 1)]
    result = analyse_ranks(facts)
    assert [c.ranks[0].wait_ms for c in result.collectives] == [0.3, 0.3]
    waits = {r.rank: r.wait_ms for r in result.ranks}
    assert waits == {0: 0.31, 1: 0.0}


def test_straggler_query_counts_overlapping_lateness_once(tmp_path):
    pytest.importorskip("duckdb")
    pytest.importorskip("pyarrow")
    from opscope.store.connect import connect
    from opscope.store.examples import EXAMPLE_QUERIES
    from opscope.store.write import StoreWriter

    with StoreWriter(tmp_path / "s") as writer:
        for r in (0, 1):
            writer.write_window(rank_session(r), rank=r)
    con = connect(tmp_path / "s")
    rows = con.sql(EXAMPLE_QUERIES["straggler per step"]).fetchall()
    assert rows == [(1, 1, 0.31)]
    walls = con.sql('SELECT rank, sum(wait_wall_ns), sum(wait_ns), sum(late_wall_ns) '
                    'FROM collective_ranks GROUP BY rank ORDER BY rank').fetchall()
    assert walls == [(0, 310_000, 600_000, 0), (1, 0, 0, 310_000)]


def test_top_ops_query_groups_the_step_ranges(tmp_path):
    """docs/store.md's top-ops SQL shows ``ProfilerStep*`` once, as the table does (item 30)."""
    pytest.importorskip("duckdb")
    pytest.importorskip("pyarrow")
    from opscope.store.connect import connect
    from opscope.store.examples import EXAMPLE_QUERIES
    from opscope.store.write import StoreWriter

    ops = []
    for k in range(3):
        ops += [Op(f"ProfilerStep#{k + 1}", k * 100, k * 100 + 100, scope=SCOPE_USER),
                Op("aten::mm", k * 100 + 10, k * 100 + 60)]
    with StoreWriter(tmp_path / "s") as writer:
        writer.write_window(make_session(ops))
    rows = connect(tmp_path / "s").sql(EXAMPLE_QUERIES["top ops by self time"]).fetchall()
    assert sorted(rows) == [("ProfilerStep*", 3, 0.15), ("aten::mm", 3, 0.15)]
