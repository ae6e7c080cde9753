"""The pure-Python collector on real workloads: names, nesting, threads, shapes, cleanup.

Every test drives ``PythonCollector`` directly and asserts structure, never durations.
"""

from __future__ import annotations

import sys
import threading
import time

import pytest
import torch
from torch.utils._python_dispatch import (
    TorchDispatchMode, _get_current_dispatch_mode_stack, _len_torch_dispatch_stack,
)

from opscope.collect.python.collector import PythonCollector
from opscope.model.records import (
    FLAG_UNFINISHED, NO_INPUTS, SCOPE_BACKWARD_FUNCTION, SCOPE_FUNCTION, SCOPE_USER,
)

RF = torch.autograd.profiler.record_function


def _installed_state():
    """Everything the collector may touch while recording."""
    return {
        "rf_enter": RF.__dict__["__enter__"],
        "rf_exit": RF.__dict__["__exit__"],
        "backward": torch.autograd.backward,
        "grad": torch.autograd.grad,
        "thread_hook": threading.getprofile(),
        "profile": sys.getprofile(),
        "mode_stack": _len_torch_dispatch_stack(),
    }


@pytest.fixture(autouse=True)
def nothing_left_installed():
    before = _installed_state()
    yield
    assert _installed_state() == before


class Event:
    def __init__(self, raw, i):
        rec = raw.records[i]
        self.name = raw.names[rec["name_id"]]
        self.start, self.end = int(rec["start_ns"]), int(rec["end_ns"])
        self.thread = int(rec["thread_index"])
        self.tid = raw.thread_ids[self.thread]
        self.scope, self.flags = int(rec["scope"]), int(rec["flags"])
        self.seq_nr = int(rec["seq_nr"])
        self.rf_thread_id = int(rec["rf_thread_id"])
        self.inputs = raw.inputs_of(self.thread, int(rec["input_offset"]))

    def contains(self, other) -> bool:
        return (self.thread == other.thread and self.start <= other.start
                and other.end <= self.end and self is not other)


def events(raw):
    return [Event(raw, i) for i in range(len(raw.records))]


def named(evs, name):
    return [e for e in evs if e.name == name]


def make_train_step():
    """A small MLP step (forward, cross_entropy, backward, SGD), built outside recording."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(5, 8), torch.tensor([0, 1, 2, 3, 0])

    def step(collector):
        handle = collector.range_push("outer")
        with torch.profiler.record_function("my_range"):
            loss = torch.nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad()
        collector.range_pop(handle)

    return step


def record(fn, *, record_shapes=False):
    """Run ``fn(collector)`` between start and stop; the RawSession."""
    c = PythonCollector()
    c.start(record_shapes=record_shapes)
    try:
        fn(c)
    finally:
        raw = c.stop()
    return raw


def test_train_step_names_scopes_and_session_fields():
    raw = record(make_train_step())
    evs = events(raw)
    names = {e.name for e in evs}
    assert {"my_range", "outer", "Optimizer.step#SGD.step", "aten::addmm", "aten::mm",
            "aten::nll_loss_forward"} <= names
    assert not any(n.startswith("profiler::") for n in names)  # record_function's own ops
    assert {e.scope for e in named(evs, "my_range") + named(evs, "outer")} == {SCOPE_USER}
    assert {e.scope for e in named(evs, "aten::addmm")} == {SCOPE_FUNCTION}
    assert all(e.flags & FLAG_UNFINISHED == 0 for e in evs)
    assert raw.collector == "python" and raw.process_id > 0
    assert raw.thread_ids == [threading.get_native_id()]
    assert {e.rf_thread_id for e in evs} == {1}
    assert all(raw.start_ns <= e.start <= e.end <= raw.stop_ns for e in evs)
    assert abs(raw.epoch_offset_ns - (time.time_ns() - time.monotonic_ns())) < 60 * 10**9


def test_ranges_contain_their_ops():
    evs = events(record(make_train_step()))
    (outer,), (mine,) = named(evs, "outer"), named(evs, "my_range")
    (step,) = named(evs, "Optimizer.step#SGD.step")
    assert outer.contains(mine) and mine.contains(step)
    ops = [e for e in evs if e.name.startswith("aten::")]
    assert ops and all(mine.contains(op) for op in ops)
    assert any(step.contains(op) and op.name.startswith("aten::add") for op in ops)
    (addmm_first, _) = named(evs, "aten::addmm")
    assert not step.contains(addmm_first)


def test_backward_nodes_wrap_their_ops():
    evs = events(record(make_train_step()))
    nodes = named(evs, "AddmmBackward0")
    assert len(nodes) == 2
    for node in nodes:
        assert node.scope == SCOPE_BACKWARD_FUNCTION and node.seq_nr >= 0
        (outer,) = [e for e in named(evs, "autograd::engine::evaluate_function: AddmmBackward0")
                    if e.contains(node)]
        assert outer.scope == SCOPE_FUNCTION
        assert any(node.contains(op) for op in named(evs, "aten::mm"))
    assert named(evs, "torch::autograd::AccumulateGrad")
    forward_addmm = named(evs, "aten::addmm")
    assert not any(n.contains(op) for n in nodes for op in forward_addmm)


def test_shapes_decode_to_the_tensors_used():
    a, b, bias = torch.randn(3, 5), torch.randn(5, 7), torch.randn(7)

    def work(c):
        torch.addmm(bias, a, b, beta=0.5)
        torch.zeros(2, 3, dtype=torch.float64)
        torch.cat([a, a], dim=1)

    evs = events(record(work, record_shapes=True))
    (addmm,) = named(evs, "aten::addmm")
    assert addmm.inputs.shapes == [[7], [3, 5], [5, 7], [], []]
    assert addmm.inputs.strides[1] == [5, 1]
    assert addmm.inputs.types[:3] == ["float"] * 3
    assert addmm.inputs.concrete[3:] == ["0.5", "1"]  # beta given, alpha from the schema default
    (zeros,) = named(evs, "aten::zeros")
    assert zeros.inputs.concrete[:3] == ["[2, 3]", "7", ""]  # dtype as c10::ScalarType Double
    (cat,) = named(evs, "aten::cat")
    assert cat.inputs.types == ["TensorList", "Scalar"] and cat.inputs.concrete[1] == "1"


def test_no_shapes_unless_asked():
    raw = record(make_train_step())
    assert set(raw.records["input_offset"].tolist()) == {NO_INPUTS}
    assert all(len(blob) == 0 for blob in raw.inputs)


def test_thread_started_while_recording_carries_its_own_tid():
    seen = {}

    def worker():
        seen["tid"] = threading.get_native_id()
        with torch.profiler.record_function("worker_range"):
            torch.ones(4, 4).mm(torch.ones(4, 4))

    def work(c):
        t = threading.Thread(target=worker)
        t.start()
        t.join()
        torch.ones(2).add(1)

    raw = record(work)
    evs = events(raw)
    (rng,) = named(evs, "worker_range")
    (mm,) = named(evs, "aten::mm")
    assert rng.tid == mm.tid == seen["tid"] != threading.get_native_id()
    assert rng.contains(mm) and rng.rf_thread_id == mm.rf_thread_id != 1
    (add,) = named(evs, "aten::add")
    assert add.tid == threading.get_native_id()
    assert sorted(raw.thread_ids) == sorted([seen["tid"], threading.get_native_id()])


class _ThreadRunner:
    """A thread that runs the callables it is handed, one at a time."""

    def __init__(self):
        self.jobs, self.results = [], []
        self.cv = threading.Condition()
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    def _loop(self):
        while True:
            with self.cv:
                self.cv.wait_for(lambda: self.jobs)
                job = self.jobs.pop(0)
            if job is None:
                return
            result = job()
            with self.cv:
                self.results.append(result)
                self.cv.notify_all()

    def run(self, job):
        with self.cv:
            n = len(self.results)
            self.jobs.append(job)
            self.cv.notify_all()
            assert self.cv.wait_for(lambda: len(self.results) > n, timeout=30)
            return self.results[-1]

    def close(self):
        with self.cv:
            self.jobs.append(None)
            self.cv.notify_all()
        self.thread.join(timeout=30)


def _stack_len_after_an_op():
    torch.ones(2).add(1)
    return _len_torch_dispatch_stack()  # a Python call after the op, so a lazy pop has run


def test_thread_outliving_stop_drops_the_mode_after_its_next_op():
    runner = None

    def work(c):
        nonlocal runner
        runner = _ThreadRunner()
        runner.run(lambda: torch.ones(3).mul(2))

    raw = record(work)
    try:
        assert named(events(raw), "aten::mul")[0].tid == runner.thread.native_id
        assert runner.run(_stack_len_after_an_op) == 0
        assert runner.run(lambda: sys.getprofile()) is None
    finally:
        runner.close()


def test_thread_running_before_start_joins_at_its_first_record_function():
    runner = _ThreadRunner()
    try:
        def work(c):
            runner.run(lambda: torch.ones(3).sub(1))  # not seen: the thread has not joined
            def ranged():
                with torch.profiler.record_function("late_range"):
                    torch.ones(3).div(2)
            runner.run(ranged)

        evs = events(record(work))
        (rng,) = named(evs, "late_range")
        (div,) = named(evs, "aten::div")
        assert rng.tid == div.tid == runner.thread.native_id and rng.contains(div)
        assert runner.run(_stack_len_after_an_op) == 0
    finally:
        runner.close()


@pytest.mark.skipif(not hasattr(threading, "setprofile_all_threads"), reason="Python 3.12+")
def test_thread_running_before_start_joins_at_its_next_call_on_312():
    runner = _ThreadRunner()
    try:
        evs = events(record(lambda c: runner.run(lambda: torch.ones(3).sub(1))))
        assert named(evs, "aten::sub")[0].tid == runner.thread.native_id
        assert runner.run(_stack_len_after_an_op) == 0
    finally:
        runner.close()


def test_hooks_are_installed_while_recording_and_gone_after():
    before = _installed_state()
    c = PythonCollector()
    c.start()
    during = _installed_state()
    assert c.is_recording()
    raw = c.stop()
    assert not c.is_recording()
    for key in ("rf_enter", "rf_exit", "backward", "grad", "thread_hook", "mode_stack"):
        assert during[key] != before[key], key
    assert _installed_state() == before
    assert len(raw.records) == 0


def test_exception_inside_recording_leaves_everything_clean():
    before = _installed_state()
    c = PythonCollector()
    with pytest.raises(RuntimeError):
        c.start()
        try:
            c.range_push("never_popped")
            with torch.profiler.record_function("failing"):
                torch.ones(2, 3).mm(torch.ones(2, 3))  # shape mismatch raises
        finally:
            raw = c.stop()
    assert _installed_state() == before
    evs = events(raw)
    (failing,) = named(evs, "failing")
    (mm,) = named(evs, "aten::mm")
    assert failing.contains(mm) and failing.flags & FLAG_UNFINISHED == 0
    (open_range,) = named(evs, "never_popped")
    assert open_range.flags & FLAG_UNFINISHED and open_range.end == raw.stop_ns

    second = events(record(make_train_step()))  # the same collector class works again
    assert named(second, "aten::addmm") and named(second, "Optimizer.step#SGD.step")


class _FailingBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, grad):
        raise ValueError("backward failed on purpose")


def test_exception_in_backward_closes_its_nodes():
    x = torch.ones(3, requires_grad=True)

    def work(c):
        loss = _FailingBackward.apply(x.exp()).sum()
        with pytest.raises(ValueError):
            loss.backward()

    raw = record(work)
    evs = events(raw)
    (failed,) = named(evs, "_FailingBackwardBackward")
    assert failed.flags & FLAG_UNFINISHED == 0 and failed.end <= raw.stop_ns
    assert named(evs, "autograd::engine::evaluate_function: _FailingBackwardBackward")
    assert not named(evs, "ExpBackward0")  # never reached
    # The hooks went with the failed call: a later backward (not recording) is plain.
    y = x.exp().sum()
    y.backward()
    assert torch.allclose(x.grad, torch.ones(3).exp())


class _CountingMode(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(func._schema.name)
        return func(*args, **(kwargs or {}))


def test_user_mode_already_active_keeps_working():
    user = _CountingMode()
    with user:
        raw = record(lambda c: torch.ones(2, 2).mm(torch.ones(2, 2)))
        assert _get_current_dispatch_mode_stack() == [user]
    assert user.ops == ["aten::ones", "aten::ones", "aten::mm"]  # no op of ours leaks in
    assert named(events(raw), "aten::mm")


def test_stop_inside_a_user_mode_removes_only_ours():
    user = _CountingMode()
    c = PythonCollector()
    c.start()
    with user:
        torch.ones(2).neg()
        raw = c.stop()
        assert _get_current_dispatch_mode_stack() == [user]
        torch.ones(2).abs()
    assert user.ops == ["aten::ones", "aten::neg", "aten::ones", "aten::abs"]
    assert named(events(raw), "aten::neg")


def test_unfinished_record_function_ends_at_stop():
    c = PythonCollector()
    c.start()
    rf = torch.profiler.record_function("left_open")
    rf.__enter__()
    raw = c.stop()
    rf.__exit__(None, None, None)  # after stop: the original __exit__, no error
    (left,) = named(events(raw), "left_open")
    assert left.flags & FLAG_UNFINISHED and left.end == raw.stop_ns


def test_start_twice_and_stop_without_start_raise():
    c = PythonCollector()
    with pytest.raises(RuntimeError, match="not recording"):
        c.stop()
    c.start()
    try:
        with pytest.raises(RuntimeError, match="already recording"):
            c.start()
    finally:
        c.stop()


def test_range_pop_after_stop_and_clock():
    c = PythonCollector()
    assert c.name == "python"
    t0 = time.monotonic_ns()
    assert t0 <= c.now_ns() <= time.monotonic_ns()
    c.start()
    handle = c.range_push("r")
    raw = c.stop()
    c.range_pop(handle)  # harmless once stopped
    (r,) = named(events(raw), "r")
    assert r.flags & FLAG_UNFINISHED


def test_autograd_grad_is_recorded_too():
    w = torch.randn(4, 3, requires_grad=True)

    def work(c):
        (g,) = torch.autograd.grad(outputs=(torch.ones(2, 4) @ w).sum(), inputs=[w])
        assert g.shape == w.shape

    evs = events(record(work))
    (mm_node,) = named(evs, "MmBackward0")
    assert any(mm_node.contains(op) for op in named(evs, "aten::mm"))


def test_higher_order_op_runs_under_the_mode():
    def work(c):
        out = torch.cond(torch.tensor(True), torch.sin, torch.cos, (torch.zeros(3),))
        assert torch.equal(out, torch.zeros(3))

    assert named(events(record(work)), "cond")
