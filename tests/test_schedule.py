"""The schedule: actions per step, every transition, warnings, callbacks."""

from __future__ import annotations

import itertools
import warnings

import pytest
import torch

import opscope
from opscope.schedule import TRANSITIONS, ProfilerAction, schedule

A = ProfilerAction


def actions(sched, n):
    return [sched(i) for i in range(n)]


def test_schedule_actions_with_skip_and_repeat():
    s = schedule(wait=1, warmup=1, active=2, repeat=2, skip_first=2)
    assert actions(s, 12) == [A.NONE, A.NONE,
                              A.NONE, A.WARMUP, A.RECORD, A.RECORD_AND_SAVE,
                              A.NONE, A.WARMUP, A.RECORD, A.RECORD_AND_SAVE,
                              A.NONE, A.NONE]


def test_repeat_zero_keeps_cycling():
    s = schedule(wait=0, warmup=1, active=1)
    assert actions(s, 200)[-2:] == [A.WARMUP, A.RECORD_AND_SAVE]
    assert actions(s, 200).count(A.RECORD_AND_SAVE) == 100


@pytest.mark.parametrize("kwargs, name", [
    (dict(wait=-1, warmup=1, active=1), "wait"),
    (dict(wait=0, warmup=-2, active=1), "warmup"),
    (dict(wait=0, warmup=1, active=0), "active"),
    (dict(wait=0, warmup=1, active=1, repeat=-1), "repeat"),
    (dict(wait=0, warmup=1, active=1, skip_first=-3), "skip_first"),
])
def test_bad_schedule_arguments_name_the_argument(kwargs, name):
    with pytest.raises(ValueError, match=name):
        schedule(**kwargs)


def test_zero_warmup_warns():
    with pytest.warns(UserWarning, match="won't be using warmup"):
        schedule(wait=1, warmup=0, active=1)


def test_transition_table_covers_every_pair():
    states = list(ProfilerAction)
    for prev, cur in itertools.product(states, states + [None]):
        assert (prev, cur) in TRANSITIONS


class ScriptedSchedule:
    """A schedule that returns a fixed list of actions, for transition tests."""

    def __init__(self, seq):
        self.seq = seq

    def __call__(self, step):
        return self.seq[step] if step < len(self.seq) else A.NONE


EXPECTED_WARNINGS = {
    (A.WARMUP, A.NONE): "Incorrect schedule: WARMUP followed by NONE",
    (A.RECORD, A.NONE): "Incorrect schedule: RECORD followed by NONE",
    (A.RECORD, A.WARMUP): "Incorrect schedule: RECORD followed by WARMUP",
}


@pytest.mark.parametrize("prev, cur", list(itertools.product(list(A), list(A))))
def test_each_transition(prev, cur, native_only):
    """Drive the profiler through prev -> cur and check recording state and callbacks."""
    ready = []
    prof = opscope.profile(schedule=ScriptedSchedule([prev, cur]),
                           on_trace_ready=lambda p: ready.append(p.step_num))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with prof:
            torch.ones(2).add_(1)
            prof.step()
            recording_after_step = prof._recording
            torch.ones(2).mul_(2)
    messages = [str(w.message) for w in caught]
    expected = EXPECTED_WARNINGS.get((prev, cur))
    if expected:
        assert expected in messages
    else:
        assert not any("Incorrect schedule" in m for m in messages)
    assert recording_after_step == (cur in (A.RECORD, A.RECORD_AND_SAVE))
    # a trace is ready when a RECORD_AND_SAVE step ends, and on exit after RECORD*
    expected_ready = []
    if prev == A.RECORD_AND_SAVE:
        expected_ready.append(1)
    if cur in (A.RECORD, A.RECORD_AND_SAVE):
        expected_ready.append(1)
    assert ready == expected_ready


def test_on_trace_ready_once_per_active_cycle(native_only):
    seen = []

    def handler(p):
        names = {row.key for row in p.key_averages()}
        seen.append((p.step_num, "ProfilerStep*" in names))

    with opscope.profile(schedule=opscope.schedule(wait=1, warmup=1, active=2, repeat=3),
                         on_trace_ready=handler) as p:
        for _ in range(14):
            torch.ones(3).add_(1)
            p.step()
    assert seen == [(4, True), (8, True), (12, True)]


def test_step_ranges_only_with_a_schedule(native_only):
    with opscope.profile() as p:
        torch.ones(2).add_(1)
        p.step()
        torch.ones(2).add_(1)
    assert not any(e.name.startswith("ProfilerStep") for e in p.events())
    with opscope.profile(schedule=opscope.schedule(wait=0, warmup=1, active=2, repeat=1)) as p:
        for _ in range(3):
            torch.ones(2).add_(1)
            p.step()
    steps = [e.trace_name for e in p.events() if e.name == "ProfilerStep*"]
    assert steps == ["ProfilerStep#1", "ProfilerStep#2"]
    assert p.step_num == 3


def test_torch_schedule_is_accepted(native_only):
    """A schedule built with torch.profiler.schedule returns torch's enum; we accept it."""
    ready = []
    with opscope.profile(schedule=torch.profiler.schedule(wait=0, warmup=1, active=1, repeat=1),
                         on_trace_ready=lambda p: ready.append(p.step_num)) as p:
        for _ in range(3):
            p.step()
    assert ready == [2]


def test_every_transition_step_has_a_method():
    """Each step name TRANSITIONS uses is one of schedule.STEP_NAMES, taken by a profile method."""
    from opscope.api.profiler import profile
    from opscope.schedule import OUTPUT_STEPS, STEP_NAMES, WARN_PREFIX

    used = {name for steps in TRANSITIONS.values() for name in steps
            if not name.startswith(WARN_PREFIX)}
    assert used == set(STEP_NAMES)
    assert set(OUTPUT_STEPS) <= set(STEP_NAMES)
    assert set(profile._STEPS) == set(STEP_NAMES)
    for name, method in profile._STEPS.items():
        assert callable(method) and getattr(profile, method.__name__) is method, name


def test_a_failing_output_step_runs_the_steps_after_it(native_only, monkeypatch):
    """"ready" still runs after "stop" fails; the first error is raised, a second one warns."""
    from opscope.api.profiler import profile

    original_stop = profile._STEPS["stop"]

    def failing_stop(prof):
        original_stop(prof)
        raise OSError("disk full")

    monkeypatch.setitem(profile._STEPS, "stop", failing_stop)
    ready = []
    prof = opscope.profile(schedule=schedule(wait=0, warmup=1, active=1, repeat=1),
                           on_trace_ready=lambda p: (ready.append(p.step_num), 1 / 0))
    prof.start()
    prof.step()
    torch.ones(2).add(1)
    with pytest.warns(RuntimeWarning, match="a second output failed too: ZeroDivisionError"):
        with pytest.raises(OSError, match="disk full"):
            prof.step()  # RECORD_AND_SAVE -> NONE: stop, then ready
    assert ready == [2]
    assert "aten::add" in {row.key for row in prof.key_averages()}
    prof.stop()
