"""Rank traces read on every core (issue 31, 4): the same results as reading them one by one.

``opscope.load.parallel.map_in_processes`` gives results in order and raises a worker's
error in the caller; ``load_ranks(jobs=N)`` and ``write_merged_trace(jobs=N)`` give what
``jobs=1`` gives, on small synthetic rank traces in torch.profiler's format.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import threading

import pytest

from opscope.analysis.ranks.facts import load_ranks
from opscope.load.ranks import trace_paths
from opscope.export.merged_trace import write_merged_trace
from opscope.load.parallel import WorkerDied, map_in_processes

RANKS = 5
HANG_S = 120  # a worker's death is known at once; this only ends a hang


def _fail_on_three(x: int) -> int:
    if x == 3:
        raise ValueError("item 3 is bad")
    return x * 10


def test_results_come_in_order_and_errors_reach_the_caller():
    assert list(map_in_processes(_fail_on_three, [0, 1, 2], jobs=2)) == [0, 10, 20]
    assert list(map_in_processes(abs, list(range(-20, 0)), jobs=2)) == list(range(20, 0, -1))
    with pytest.raises(ValueError, match="item 3 is bad"):
        list(map_in_processes(_fail_on_three, list(range(8)), jobs=2))


@pytest.fixture(scope="module")
def rank_folder(tmp_path_factory):
    """RANKS traces: 3 steps, an allreduce per step, rank 2 late by 30 ms at each."""
    folder = tmp_path_factory.mktemp("ranks")
    for rank in range(RANKS):
        events = []
        for step in range(3):
            t0 = 1000.0 + step * 100_000
            late = 30_000 if rank == 2 else rank * 10
            events += [
                {"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{step}",
                 "pid": 100 + rank, "tid": 1, "ts": t0, "dur": 90_000},
                {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 100 + rank, "tid": 1,
                 "ts": t0 + 10, "dur": 500, "args": {"Input Dims": [[8, 8], [8, 8]],
                                                     "Input type": ["float", "float"]}},
                {"ph": "X", "cat": "cpu_op", "name": "c10d::allreduce_", "pid": 100 + rank,
                 "tid": 1, "ts": t0 + 1000 + late, "dur": 5},
                {"ph": "X", "cat": "user_annotation", "name": "gloo:all_reduce",
                 "pid": 100 + rank, "tid": 2, "ts": t0 + 1001 + late,
                 "dur": 31_500 - late, "args": {"Input Dims": [[256]],
                                                 "Input type": ["float"]}},
                {"ph": "s", "cat": "fwdbwd", "id": step, "pid": 100 + rank, "tid": 1,
                 "ts": t0 + 10, "name": "fwdbwd"}]
        doc = {"distributedInfo": {"backend": "gloo", "rank": rank, "world_size": RANKS},
               "baseTimeNanoseconds": 1_700_000_000_000_000_000 + rank,
               "traceEvents": events}
        (folder / f"job.rank{rank}.pt.trace.json").write_text(json.dumps(doc))
    return folder


def test_load_ranks_in_processes_gives_the_same_facts(rank_folder):
    one = load_ranks(str(rank_folder), jobs=1)
    two = load_ranks(str(rank_folder), jobs=2)
    assert [f.rank for f in two] == list(range(RANKS))
    assert two == one
    assert all(len(f.calls) == 3 and f.steps == 3 for f in two)


def test_merge_in_processes_writes_the_same_bytes(rank_folder, tmp_path):
    paths = trace_paths(str(rank_folder))
    assert write_merged_trace(paths, str(tmp_path / "one.json"), jobs=1) == list(range(RANKS))
    assert write_merged_trace(paths, str(tmp_path / "two.json"), jobs=2) == list(range(RANKS))
    one, two = (tmp_path / "one.json").read_bytes(), (tmp_path / "two.json").read_bytes()
    assert one == two
    merged = json.loads(two)
    assert {e["pid"] for e in merged["traceEvents"]} == set(range(RANKS))


def _die_on_two(x: int) -> int:
    if x == 2:
        os.kill(os.getpid(), signal.SIGKILL)  # as the kernel's OOM killer would
    return x


def test_a_worker_killed_mid_item_is_an_error_not_a_wait_without_end():
    # multiprocessing.Pool waited forever for the dead worker's item; now it is WorkerDied.
    # Run in a thread so that a hang fails here (the join's timeout) instead of stalling
    # the suite.
    errors = []

    def read():
        try:
            list(map_in_processes(_die_on_two, list(range(6)), jobs=2))
        except Exception as error:  # noqa: BLE001 - checked below
            errors.append(error)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(timeout=HANG_S)
    assert not reader.is_alive(), "map_in_processes waits for a dead worker"
    assert len(errors) == 1 and isinstance(errors[0], WorkerDied), errors
    assert "--jobs 1" in str(errors[0])
    assert multiprocessing.active_children() == []  # no worker left behind


def test_a_caller_that_stops_early_leaves_no_worker():
    results = map_in_processes(abs, list(range(-9, 0)), jobs=2)
    assert next(results) == 9
    results.close()
    assert multiprocessing.active_children() == []
