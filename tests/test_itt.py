"""opscope.itt: ranges become user annotations, marks instant events; ITT forwarding."""

from __future__ import annotations

import json
import threading

import pytest
import torch

import opscope
from opscope import itt
from opscope.model.records import SCOPE_USER
from workloads import mlp_step_fn


def profile_step_with_itt(step):
    with opscope.profile() as prof:
        assert itt.range_push("train step") == 0
        itt.mark("before forward")
        step()
        itt.mark('after "step"')
        assert itt.range_pop() == 0
    return prof


def test_range_is_a_user_annotation_enclosing_the_step(collector_name):
    step = mlp_step_fn()
    step()
    prof = profile_step_with_itt(step)
    table = prof.session.table
    names = table.symbols.names
    rows = [i for i in range(len(table)) if names[table.name_id[i]] == "train step"]
    assert len(rows) == 1
    r = rows[0]
    assert table.scope[r] == SCOPE_USER and table.parent[r] == -1
    # the optimizer step, recorded on this thread, nests inside the range
    inside = [i for i in range(len(table)) if names[table.name_id[i]] == "Optimizer.step#SGD.step"]
    assert inside, "the optimizer step was not recorded"
    for i in inside:
        p = table.parent[i]
        while p >= 0 and p != r:
            p = table.parent[p]
        assert p == r
    row = [e for e in prof.key_averages() if e.key == "train step"][0]
    assert row.count == 1 and row.is_user_annotation


def test_marks_are_instant_events_in_the_trace(tmp_path, collector_name):
    step = mlp_step_fn()
    prof = profile_step_with_itt(step)
    assert [m[2] for m in prof.session.marks] == ["before forward", 'after "step"']
    assert all(m[1] == threading.get_native_id() for m in prof.session.marks)
    path = tmp_path / "trace.json"
    prof.export_chrome_trace(str(path))
    events = json.loads(path.read_text())["traceEvents"]
    instants = [e for e in events if e.get("ph") == "i" and e.get("s") == "t"]
    assert [e["name"] for e in instants] == ["before forward", 'after "step"']
    train = [e for e in events if e.get("name") == "train step" and e.get("ph") == "X"]
    assert len(train) == 1 and train[0]["cat"] == "user_annotation"
    for e in instants:
        assert e["tid"] == train[0]["tid"] and e["pid"] == train[0]["pid"]
        assert train[0]["ts"] <= e["ts"] <= train[0]["ts"] + train[0]["dur"]
    assert instants[0]["ts"] <= instants[1]["ts"]


def test_depths_nest_per_thread():
    assert itt.range_push("outer") == 0
    assert itt.range_push("inner") == 1
    seen = []
    worker = threading.Thread(target=lambda: seen.extend([itt.range_push("w"), itt.range_pop(),
                                                          itt.range_pop()]))
    worker.start()
    worker.join()
    assert seen == [0, 0, -1]  # the worker has its own stack
    assert itt.range_pop() == 1
    assert itt.range_pop() == 0
    assert itt.range_pop() == -1


def test_nothing_is_kept_while_not_recording():
    itt.mark("nobody listens")
    itt.range_push("unrecorded")
    with opscope.profile() as prof:
        itt.range_pop()  # opened before the profiler: nothing to close in the trace
        _ = torch.ones(3) + 1
    assert prof.session.marks == []
    assert "unrecorded" not in [e.key for e in prof.key_averages()]
    assert itt._marks == []


def test_range_open_when_the_profiler_stops_is_closed_safely(collector_name):
    with opscope.profile() as prof:
        itt.range_push("left open")
        _ = torch.ones(3) * 2
    assert itt.range_pop() == 0  # after stop: no error, no hook touched
    assert "left open" in [e.key for e in prof.key_averages()]


def test_range_context_manager_formats_its_name():
    with opscope.profile() as prof:
        with itt.range("epoch {} of {total}", 1, total=3):
            _ = torch.ones(2) + 1
    assert "epoch 1 of 3" in [e.key for e in prof.key_averages()]


def test_bad_message_is_a_type_error_naming_msg():
    with pytest.raises(TypeError, match="msg must be a str"):
        itt.mark(3)
    with pytest.raises(TypeError, match="range_push: msg must be a str"):
        itt.range_push(None)


def test_is_available_reports_torch_itt():
    assert itt.is_available() == bool(torch._C._itt.is_available())


@pytest.mark.skipif(not torch._C._itt.is_available(), reason="this torch build has no ITT")
def test_calls_reach_torch_itt(monkeypatch):
    """Forwarded calls go through torch.profiler.itt (a spy records them, then calls torch)."""
    from torch.profiler import itt as torch_itt

    calls = []

    class Spy:
        def range_push(self, msg):
            calls.append(("push", msg))
            return torch_itt.range_push(msg)

        def range_pop(self):
            calls.append(("pop",))
            return torch_itt.range_pop()

        def mark(self, msg):
            calls.append(("mark", msg))
            return torch_itt.mark(msg)

    monkeypatch.setattr(itt, "_forward", Spy())
    itt.range_push("vtune range")
    itt.mark("vtune mark")
    itt.range_pop()
    assert calls == [("push", "vtune range"), ("mark", "vtune mark"), ("pop",)]
    assert itt._forward is not None and itt.is_available()
