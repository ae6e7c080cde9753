"""opscope.analysis.facts: per-event facts, computed once per session, one rule each."""

import numpy as np

from opscope.analysis import facts
from opscope.export.chrome_trace import forward_backward_links
from synthetic import SCOPE_BACKWARD_FUNCTION, SCOPE_USER, Op, TensorSpec, make_session


def two_steps():
    return [
        Op("ProfilerStep#1", 0, 100, scope=SCOPE_USER),
        Op("aten::linear", 10, 60, seq=5, inputs=[TensorSpec((4, 8))]),
        Op("aten::addmm", 15, 55, seq=5),
        Op("ProfilerStep#2", 200, 300, scope=SCOPE_USER),
        Op("autograd::engine::evaluate_function: AddmmBackward0", 210, 260, seq=5, fwd_thread=1),
        Op("AddmmBackward0", 211, 259, scope=SCOPE_BACKWARD_FUNCTION, seq=5, fwd_thread=1),
        Op("after the steps", 400, 410, scope=SCOPE_USER),
    ]


def test_each_fact_is_computed_once_and_shared():
    session = make_session(two_steps())
    for fact in (facts.module_ranges, facts.event_modules, facts.step_ranges,
                 facts.event_steps, facts.forward_links, facts.inputs_recorded):
        first = fact(session)
        assert fact(session) is first, fact.__name__
        assert len(first) == len(session.table) or fact is facts.step_ranges


def test_steps_column_holds_the_enclosing_step():
    session = make_session(two_steps())
    table = session.table
    steps = facts.event_steps(session)
    by_name = {table.name(i): int(steps[i]) for i in range(len(table))}
    assert [table.name(i) for i in facts.step_ranges(session)] == ["ProfilerStep#1",
                                                                  "ProfilerStep#2"]
    assert by_name["aten::addmm"] == 0 and by_name["AddmmBackward0"] == 1
    assert by_name["ProfilerStep#2"] == 1 and by_name["after the steps"] == -1


def test_forward_links_are_the_trace_flows():
    session = make_session(two_steps())
    table = session.table
    links = facts.forward_links(session)
    (node,) = np.flatnonzero(links >= 0)
    assert table.name(node) == "AddmmBackward0"
    assert table.name(links[node]) == "aten::linear"  # the outermost op with the seq
    assert forward_backward_links(session) == [(int(links[node]), int(node))]


def test_one_rule_for_recorded_shapes():
    with_inputs = make_session(two_steps())
    assert facts.inputs_recorded(with_inputs).sum() == 1 and facts.shapes_recorded(with_inputs)
    bare = [Op("aten::mm", 0, 10)]
    assert not facts.shapes_recorded(make_session(bare))
    # record_shapes on: shapes were recorded, even if no op had inputs
    assert facts.shapes_recorded(make_session(bare, options={"record_shapes": True}))


def test_no_modules_no_owners():
    session = make_session(two_steps())
    assert not facts.module_ranges(session).any()
    assert (facts.event_modules(session) == -1).all()
    assert facts.event_flops(session) is None and facts.event_memory(session) is None
