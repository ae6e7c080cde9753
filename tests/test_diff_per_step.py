"""``opscope diff`` compares per step when both sides have steps (issue 27, item 15).

A: 3 steps, B: 5 steps of the same work. Raw totals made every op a regression;
per step nothing changed, and the output says the rows are per step.
"""

from __future__ import annotations

from opscope.analysis.diff import diff_sessions
from opscope.export.diff_html import render_diff_html
from opscope.export.diff_text import format_diff
from synthetic import SCOPE_USER, Op, make_session


def steps(n: int, mm_us: float = 30, with_steps: bool = True):
    ops = []
    for k in range(n):
        t = k * 100
        if with_steps:
            ops.append(Op(f"ProfilerStep#{k + 1}", t, t + 100, scope=SCOPE_USER))
        ops += [Op("aten::mm", t + 10, t + 10 + mm_us), Op("aten::add", t + 50, t + 60)]
    return make_session(ops)


def test_same_work_over_more_steps_is_no_regression():
    diff = diff_sessions(steps(3), steps(5))
    assert diff.steps == (3, 5)
    assert diff.regressions == [] and diff.improvements == []
    mm = next(r for r in diff.ops if r.key == "aten::mm")
    assert mm.calls == (1.0, 1.0) and mm.self_us == (30.0, 30.0)
    text = format_diff(diff, names=("a", "b"))
    assert "Per step: A has 3 steps, B has 5; times and calls are per step" in text
    assert "Self CPU time per step: 100.000us -> 100.000us" in text
    assert "Per step: A has 3 steps" in render_diff_html(diff, names=("a", "b"))


def test_a_slower_op_per_step_is_still_found():
    diff = diff_sessions(steps(3), steps(5, mm_us=60))
    assert [r.key for r in diff.regressions] == ["aten::mm"]


def test_without_steps_on_one_side_totals_are_compared():
    diff = diff_sessions(steps(3), steps(5, with_steps=False))
    assert diff.steps is None
    mm = next(r for r in diff.ops if r.key == "aten::mm")
    assert mm.calls == (3, 5)
    assert "Per step" not in format_diff(diff) and "Self CPU time total" in format_diff(diff)
