"""Issue 18's report points on synthetic sessions (no browser needed): optimizer steps,
backward by op kind, the 5% rule threshold and ranking, folded torch frames, the demo's
options. ``tests/test_report_real_browser.py`` checks the same on a real model's page."""

from __future__ import annotations

import inspect

import pytest

import opscope
from opscope.analysis.categories import BACKWARD
from opscope.cli.demo import DEMO_OPTIONS
from opscope.report.data import report_data
from opscope.report.recommendations import MATERIAL_SHARE
from synthetic import SCOPE_BACKWARD_FUNCTION, SCOPE_USER, Op, make_session

PLUMBING = "/site-packages/torch/nn/modules/module.py(1762): _call_impl"


def optimizer_loop(steps: int = 3):
    """``steps`` iterations inside one user range, each ending with an optimizer step."""
    ops = [Op("train loop", 0, steps * 1000 + 500, scope=SCOPE_USER)]
    for k in range(steps):
        t = 10 + k * 1000
        ops += [Op("aten::mm", t, t + 300),
                Op("autograd::engine::evaluate_function: MmBackward0", t + 300, t + 700),
                Op("MmBackward0", t + 310, t + 690, scope=SCOPE_BACKWARD_FUNCTION),
                Op("aten::mm", t + 320, t + 520), Op("aten::add", t + 520, t + 600),
                Op("Optimizer.step#SGD.step", t + 800, t + 1000, scope=SCOPE_USER),
                Op("aten::add_", t + 810, t + 900)]
    return make_session(ops)


def test_steps_end_at_each_optimizer_step():
    ov = report_data(optimizer_loop(3))["overview"]
    assert ov["step_source"] == "optimizer.step" and ov["has_steps"]
    assert [s["name"] for s in ov["steps"]] == ["step 1", "step 2", "step 3"]
    assert ov["spread"]["count"] == 3
    for step in ov["steps"]:
        # the loop range spans every step: its self time counts in none
        assert sum(step["parts"]) == pytest.approx(step["dur_us"])
    # the first step starts at the thread's first event (the loop range at 0)
    assert [s["dur_us"] for s in ov["steps"]] == [1010.0, 1000.0, 1000.0]


def test_profiler_steps_stay_the_first_choice():
    ops = [Op("ProfilerStep#1", 0, 2000, scope=SCOPE_USER),
           Op("Optimizer.step#SGD.step", 100, 200, scope=SCOPE_USER),
           Op("Optimizer.step#SGD.step", 300, 400, scope=SCOPE_USER)]
    ov = report_data(make_session(ops))["overview"]
    assert ov["step_source"] == "ProfilerStep" and len(ov["steps"]) == 1


def test_backward_parts_add_up_to_backward():
    ov = report_data(optimizer_loop(2))["overview"]
    parts = dict(zip(ov["backward"]["parts"], ov["backward"]["totals"]))
    assert sum(parts.values()) == pytest.approx(ov["totals"][ov["categories"].index(BACKWARD)])
    # per step: MmBackward0's aten::mm is matmul, its aten::add elementwise, the rest engine
    assert parts["matmul/conv"] == 400.0 and parts["elementwise"] == 160.0
    assert parts["autograd engine"] == 240.0


def test_no_rule_fires_under_five_percent_and_rules_rank_by_saving():
    ops = [Op("ProfilerStep#1", 0, 100_000, scope=SCOPE_USER), Op("aten::mm", 1, 90_000)]
    t = 90_100.0
    for _ in range(60):  # 60 copies of 5 us: 0.3% of the step, under the threshold
        ops += [Op("aten::copy_", t, t + 5)]
        t += 20
    shapes = {"record_shapes": True}
    assert report_data(make_session(ops, options=shapes))["recommendations"] == []

    ops = [Op("ProfilerStep#1", 0, 1000, scope=SCOPE_USER),
           Op("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", 0, 100,
              scope=SCOPE_USER),
           Op("Optimizer.step#SGD.step", 100, 400, scope=SCOPE_USER)]
    recs = report_data(make_session(ops))["recommendations"]
    assert [r["id"] for r in recs] == ["optimizer", "data-loading"]  # 300 us before 100 us
    assert all(r["saving_us"] >= MATERIAL_SHARE * 1000 for r in recs)


def test_call_sites_and_flame_fold_torch_frames():
    stack = ["model.py(9): forward", PLUMBING, "train.py(4): main"]
    s = make_session([Op("aten::mm", 0, 30, stack=stack), Op("aten::mm", 40, 50, stack=stack)])
    data = report_data(s)
    site = data["operators"]["rows"][0]["stacks"][0]
    assert site == [["model.py(9): forward", "train.py(4): main"], 2, 40.0, stack]
    flame = data["flame"]
    assert [flame["names"][k] for k in flame["plumbing"]] == [PLUMBING]


def test_demo_records_with_every_option():
    recording = {"record_shapes", "profile_memory", "with_stack", "with_flops", "with_modules"}
    assert recording <= set(inspect.signature(opscope.profile).parameters)
    assert DEMO_OPTIONS == {name: True for name in recording}
