"""A DDP rank's report shows its collectives as communication (issue 27, item 10).

A synthetic rank: a step with 100 us of compute, then an all-reduce whose gloo range runs
on a worker thread for 800 us while the step's thread records nothing (it waits). The
Overview must count that time as communication, not idle; its top ops must list
``gloo:all_reduce`` (a user range, as torch records it); Recommendations must say the
rank waits on the others.
"""

from __future__ import annotations

from opscope.analysis.categories import CATEGORY_NAMES
from opscope.report.data import report_data
from synthetic import SCOPE_USER, Op, make_session


def ddp_rank():
    return make_session([
        Op("ProfilerStep#1", 0, 1000, scope=SCOPE_USER),
        Op("aten::mm", 0, 100),
        Op("c10d::allreduce_", 100, 110),
        Op("gloo:all_reduce", 100, 900, thread=1, scope=SCOPE_USER),
    ], thread_ids=(4242, 4243), start_us=0, stop_us=1000)


def test_waiting_for_a_collective_is_communication_not_idle():
    step = report_data(ddp_rank())["overview"]["steps"][0]
    parts = dict(zip(CATEGORY_NAMES, step["parts"]))
    assert parts["communication"] == 800.0  # the c10d op, then the wait until 900 us
    assert parts["idle"] == 100.0  # after the collective: nothing in flight
    assert parts["matmul/conv"] == 100.0
    assert sum(step["parts"]) == step["dur_us"]


def test_top_ops_list_the_collective_range_and_advice_names_the_wait():
    data = report_data(ddp_rank())
    top = [(r["name"], r["communication"]) for r in data["overview"]["top_ops"]]
    assert top[0] == ("gloo:all_reduce", True)
    assert ("c10d::allreduce_", True) in top and ("aten::mm", False) in top
    advice = {r["id"]: r for r in data["recommendations"]}
    assert "waiting-on-ranks" in advice
    assert "80.0% of step time" in advice["waiting-on-ranks"]["evidence"][0]


def test_no_collective_leaves_idle_alone():
    session = make_session([Op("ProfilerStep#1", 0, 1000, scope=SCOPE_USER),
                            Op("aten::mm", 0, 100)], start_us=0, stop_us=1000)
    data = report_data(session)
    parts = dict(zip(CATEGORY_NAMES, data["overview"]["steps"][0]["parts"]))
    assert (parts["communication"], parts["idle"]) == (0.0, 900.0)
    assert not any(r["id"] == "waiting-on-ranks" for r in data["recommendations"])
