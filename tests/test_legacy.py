"""opscope.autograd.profile: the deprecated legacy profiler's API on a real training step."""

from __future__ import annotations

import collections
import json
import re
import warnings

import pytest
import torch

import opscope
import opscope.autograd
from conftest import reference_dir
from opscope.record_function import recording_collector
from workloads import mlp_step_fn


def legacy_profile(**kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        return opscope.autograd.profile(**kwargs)


@pytest.fixture
def step():
    fn = mlp_step_fn()
    fn()  # warm up: first-call allocations and lazy init stay out of the profile
    return fn


def test_warns_deprecated_pointing_to_opscope_profile():
    with pytest.warns(FutureWarning, match=r"deprecated.*opscope\.profile"):
        opscope.autograd.profile()


def test_names_and_counts_equal_torch_legacy_profiler(step, native_only):
    import torch.autograd.profiler_legacy as torch_legacy

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with torch_legacy.profile() as theirs:
            step()
    with legacy_profile() as ours:
        step()
    expected = collections.Counter({e.key: e.count for e in theirs.key_averages()})
    got = collections.Counter({e.key: e.count for e in ours.key_averages()})
    assert got == expected


def test_results_of_a_train_step(step, collector_name):
    prof = legacy_profile(record_shapes=True)
    assert str(prof) == repr(prof) == "<unfinished opscope.autograd.profile>"
    with prof as entered:
        assert entered is prof
        assert recording_collector() is not None
        assert repr(prof) == "<unfinished opscope.autograd.profile>"
        with pytest.raises(RuntimeError, match="didn't finish"):
            prof.key_averages()
        with opscope.record_function("legacy step"):
            step()
    events = prof.function_events
    names = [e.name for e in events]
    assert "legacy step" in names and "Optimizer.step#SGD.step" in names
    assert all(e.is_legacy for e in events)
    starts = [e.time_range.start for e in events]
    assert starts == sorted(starts)
    rows = {row.key: row for row in prof.key_averages()}
    assert rows["legacy step"].count == 1
    assert prof.total_average().key == "Total"
    assert prof.self_cpu_time_total == pytest.approx(sum(e.self_cpu_time_total for e in events))
    assert prof.self_cpu_time_total > 0
    text = prof.table(sort_by="self_cpu_time_total", row_limit=5)
    assert "Self CPU time total:" in text and "Input Shapes" in text
    assert str(prof) == events.table()
    assert repr(prof).startswith("[<FunctionEvent")
    by_shape = prof.key_averages(group_by_input_shape=True)
    assert len(by_shape) >= len(rows)


def test_chrome_trace_is_the_legacy_bare_array(step, tmp_path):
    odd = 'range "quoted" \\ name'
    with legacy_profile() as prof:
        with opscope.record_function(odd):
            step()
    path = tmp_path / "legacy.json"
    prof.export_chrome_trace(str(path))
    doc = json.loads(path.read_text())
    reference = json.loads((reference_dir() / "legacy_trace.json").read_text())
    assert isinstance(doc, list) and isinstance(reference, list)
    assert all(list(e) == list(reference[0]) for e in doc)  # same keys, same order
    assert {e["pid"] for e in doc} == {"CPU functions"} and {e["ph"] for e in doc} == {"X"}
    assert [e["name"] for e in doc] == [e.trace_name for e in prof.function_events
                                        if e.trace_name is not None]
    assert odd in [e["name"] for e in doc]
    # ts is microseconds since the profiler started; each op nests inside the range
    assert min(e["ts"] for e in doc) >= 0
    outer = [e for e in doc if e["name"] == odd][0]
    addmm = [e for e in doc if e["name"] == "aten::addmm"]
    assert addmm and all(outer["ts"] <= e["ts"] <= outer["ts"] + outer["dur"] for e in addmm)


def test_export_stacks_needs_with_stack(step, tmp_path):
    with legacy_profile() as prof:
        step()
    with pytest.raises(RuntimeError, match="with_stack=True"):
        prof.export_stacks(str(tmp_path / "stacks.txt"))
    assert not (tmp_path / "stacks.txt").exists()


def test_export_stacks_writes_one_line_per_event_with_a_stack(step, tmp_path):
    with legacy_profile(with_stack=True) as prof:
        step()
    with pytest.raises(ValueError, match="metric must be one of"):
        prof.export_stacks(str(tmp_path / "x"), "wall_time")
    path = tmp_path / "stacks.txt"
    prof.export_stacks(str(path))
    with_stack = [e for e in prof.function_events if e.stack and int(e.self_cpu_time_total) > 0]
    if not with_stack:
        pytest.skip("Python stacks are not recorded yet (with_stack records nothing; issue 5)")
    lines = path.read_text().splitlines()
    assert len(lines) == len(with_stack)
    reference = (reference_dir() / "legacy_stacks.txt").read_text().splitlines()
    shape = re.compile(r"^[^ ]+\([0-9]+\):_[^ ]*(;[^ ]+)* [0-9]+$")  # file(line):_name;... value
    assert all(shape.match(line) for line in reference)
    assert all(shape.match(line) for line in lines)
    assert any("test_legacy.py" in line for line in lines)  # this file's frames are there
    for line, ev in zip(lines, with_stack):
        frames, value = line.rsplit(" ", 1)
        assert int(value) == int(ev.self_cpu_time_total)
        assert frames.split(";")[-1] == ev.stack[0].translate(str.maketrans(" ;\t\n", "____"))


def test_reentry_raises_and_another_profiler_blocks(step):
    prof = legacy_profile()
    with prof:
        step()
    with pytest.raises(RuntimeError, match="not reentrant"):
        with prof:
            pass
    with opscope.profile():
        with pytest.raises(RuntimeError, match="not reentrant"):
            with legacy_profile():
                pass
    assert recording_collector() is None


def test_disabled_does_nothing(step):
    prof = legacy_profile(enabled=False)
    with prof as entered:
        assert entered is None
        assert recording_collector() is None
        step()
    assert prof.function_events is None
    assert repr(prof) == "<disabled opscope.autograd.profile>"
    with pytest.raises(RuntimeError, match="enabled=False"):
        prof.table()


def test_use_cuda_without_cuda_warns_and_records_cpu(step):
    if torch.cuda.is_available():
        pytest.skip("CUDA is available here")
    with pytest.warns(UserWarning, match="CUDA is not available"):
        prof = legacy_profile(use_cuda=True)
    assert prof.use_cuda is False
    with prof:
        step()
    assert prof.key_averages()


def test_with_flops_records_shapes():
    prof = legacy_profile(with_flops=True)
    assert prof.record_shapes is True
    with prof:
        torch.mm(torch.ones(4, 8), torch.ones(8, 2))
    mm = [e for e in prof.function_events if e.name == "aten::mm"][0]
    assert mm.input_shapes == [[4, 8], [8, 2]]


def test_memory_counts_toward_open_ranges_else_top_level(native_only, tmp_path):
    """Legacy semantics: an allocation counts for every open range; none open: [memory]."""
    kept = []
    with legacy_profile(profile_memory=True) as prof:
        kept.append(torch.empty(1000, dtype=torch.float32))  # aten::empty is open: counted there
        with opscope.record_function("outer"):
            with opscope.record_function("inner"):
                kept.append(torch.empty(2000, dtype=torch.float32))
        kept.pop(0)  # freed with no range open: a top-level [memory] event of -4000 B
    rows = {row.key: row for row in prof.key_averages()}
    if all(row.cpu_memory_usage == 0 for row in rows.values()):
        pytest.skip("profile_memory does not record allocations yet (issue 4)")
    assert rows["outer"].cpu_memory_usage >= 8000
    assert rows["inner"].cpu_memory_usage >= 8000
    assert rows["inner"].self_cpu_memory_usage == 0  # the allocation is aten::empty's own
    assert rows["[memory]"].cpu_memory_usage <= -4000
    top = [e for e in prof.function_events if e.name == "[memory]"]
    assert top and all(e.cpu_parent is None for e in top)
    prof.export_chrome_trace(str(tmp_path / "legacy.json"))
    assert "[memory]" not in [e["name"] for e in json.loads((tmp_path / "legacy.json").read_text())]
    assert "CPU Mem" in prof.table()
