"""opscope.step_tracker: one global step per iteration, whoever reports it."""

from __future__ import annotations

import gc
import weakref

import pytest
import torch

import opscope
from opscope.step_tracker import (PROFILER_REQUESTER, KinetoStepTracker, StepTracker,
                                  add_optimizer_listener, is_tracking_optimizer_steps,
                                  optimizer_listeners, remove_optimizer_listener)
from workloads import MLP


@pytest.fixture
def steps_seen():
    seen = []
    key = StepTracker.add_listener(seen.append)
    yield seen
    StepTracker.remove_listener(key)


def test_requesters_count_separately_and_the_global_step_is_their_max():
    StepTracker.init_step_count("t_a")
    StepTracker.init_step_count("t_b")
    start = StepTracker.current_step()
    assert StepTracker.increment_step("t_a") == start + 1
    assert StepTracker.increment_step("t_b") == start + 1  # b catches up: no new step
    assert StepTracker.increment_step("t_a") == start + 2
    assert StepTracker.current_step() == start + 2
    assert StepTracker.erase_step_count("t_a") is True
    assert StepTracker.erase_step_count("t_a") is False
    assert StepTracker.erase_step_count("t_b") is True
    assert KinetoStepTracker is StepTracker


def test_listeners_hear_each_new_global_step_once(steps_seen):
    StepTracker.init_step_count("t_x")
    StepTracker.init_step_count("t_y")
    start = StepTracker.current_step()
    for _ in range(3):
        StepTracker.increment_step("t_x")
        StepTracker.increment_step("t_y")
    assert steps_seen == [start + 1, start + 2, start + 3]
    StepTracker.erase_step_count("t_x")
    StepTracker.erase_step_count("t_y")


def test_a_failing_listener_warns_and_training_goes_on():
    def broken(step):
        raise ValueError("listener bug")

    key = StepTracker.add_listener(broken)
    try:
        model = torch.nn.Linear(4, 2)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        before = StepTracker.current_step()
        with pytest.warns(RuntimeWarning, match="listener bug"):
            model(torch.randn(3, 4)).sum().backward()
            opt.step()
        assert StepTracker.current_step() == before + 1
    finally:
        StepTracker.remove_listener(key)
    with pytest.raises(TypeError, match="callable"):
        StepTracker.add_listener(42)


def test_every_optimizer_step_counts_once_per_iteration(steps_seen):
    assert is_tracking_optimizer_steps()  # installed by `import opscope`
    gc.collect()  # optimizers of earlier tests are no requesters any more
    torch.manual_seed(0)
    model = MLP()
    body = torch.optim.SGD(model.body.parameters(), lr=0.1)
    head = torch.optim.Adam(model.head.parameters(), lr=1e-3)
    x, y = torch.randn(8, 16), torch.randint(0, 4, (8,))
    start = StepTracker.current_step()
    for _ in range(4):
        body.zero_grad()
        head.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        body.step()
        head.step()  # two optimizers, one iteration: one step
    assert StepTracker.current_step() == start + 4
    assert steps_seen == [start + 1, start + 2, start + 3, start + 4]


def test_profiler_step_and_optimizer_step_together_count_once():
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    start = StepTracker.current_step()
    with opscope.profile(schedule=opscope.schedule(wait=1, warmup=1, active=1, repeat=1)) as p:
        assert PROFILER_REQUESTER in StepTracker._step_dict
        for _ in range(3):
            model(torch.randn(2, 4)).sum().backward()
            opt.step()
            p.step()
    assert StepTracker.current_step() == start + 3
    assert PROFILER_REQUESTER not in StepTracker._step_dict  # erased when it stopped


def test_profiler_step_alone_advances_the_global_step():
    start = StepTracker.current_step()
    with opscope.profile(schedule=opscope.schedule(wait=0, warmup=1, active=1)) as p:
        for _ in range(5):
            p.step()
    assert StepTracker.current_step() == start + 5


def test_an_optimizer_added_later_joins_the_running_count():
    gc.collect()
    first = torch.optim.SGD([torch.zeros(2, requires_grad=True)], lr=0.1)
    start = StepTracker.current_step()
    first.step()
    second = torch.optim.SGD([torch.zeros(2, requires_grad=True)], lr=0.1)
    second.step()  # first seen in an iteration the other already counted
    for _ in range(2):
        first.step()
        second.step()
    assert StepTracker.current_step() == start + 3


def test_a_collected_optimizer_stops_being_a_requester():
    opt = torch.optim.SGD([torch.zeros(2, requires_grad=True)], lr=0.1)
    opt.step()
    before = set(StepTracker._step_dict)
    del opt
    gc.collect()
    after = set(StepTracker._step_dict)
    assert len(before - after) == 1 and next(iter(before - after)).startswith("Optimizer#")


def test_a_dropped_optimizer_awaiting_gc_does_not_hold_back_a_new_one():
    # an optimizer in a reference cycle (a closure, a scheduler, ...) outlives its
    # last use until the GC runs; the next optimizer's count must not depend on when
    gc.disable()
    try:
        old = torch.optim.SGD([torch.zeros(2, requires_grad=True)], lr=0.1)
        old.cycle = old
        old.step()
        alive = weakref.ref(old)
        del old
        assert alive() is not None  # still there, waiting for the GC
        start = StepTracker.current_step()
        new = torch.optim.SGD([torch.zeros(2, requires_grad=True)], lr=0.1)
        new.step()
        assert StepTracker.current_step() == start + 1
        new.step()
        assert StepTracker.current_step() == start + 2
    finally:
        gc.enable()


def test_optimizer_listeners_may_remove_themselves_while_torch_iterates_its_hooks():
    from torch.optim import optimizer as optim_module

    hooks_before = list(optim_module._global_optimizer_post_hooks)
    calls = []
    keys = {}

    def once(optimizer, args, kwargs):
        calls.append("once")
        remove_optimizer_listener(keys["once"])
        remove_optimizer_listener(keys["later"])  # removed before its turn: not called

    keys["once"] = add_optimizer_listener(once)
    keys["later"] = add_optimizer_listener(lambda *a: calls.append("later"))
    opt = torch.optim.SGD([torch.zeros(2, requires_grad=True)], lr=0.1)
    opt.step()
    opt.step()
    assert calls == ["once"]
    assert optimizer_listeners() == []
    assert list(optim_module._global_optimizer_post_hooks) == hooks_before
    with pytest.raises(TypeError, match="callable"):
        add_optimizer_listener(None)


def test_a_failing_optimizer_listener_warns_and_the_step_still_counts():
    opt = torch.optim.SGD([torch.zeros(2, requires_grad=True)], lr=0.1)
    opt.step()
    key = add_optimizer_listener(lambda *a: 1 / 0)
    try:
        start = StepTracker.current_step()
        with pytest.warns(RuntimeWarning, match="ZeroDivisionError"):
            opt.step()
        assert StepTracker.current_step() == start + 1
    finally:
        remove_optimizer_listener(key)
