"""torch.profiler traces of every supported torch load with that torch's rule for Python functions.

With ``with_stack=True`` torch writes ``python_function`` events. What its own
``key_averages()`` makes of them changed across versions: torch 2.4 and 2.8
leave them out of ``events()``, 2.13 counts them as rows, 2.15 keeps them in
the tree but leaves them out of ``key_averages()`` by default. The oracle is
the installed torch's own table for the trace it just wrote; this file runs in
each venv of the compatibility matrix.
"""

from __future__ import annotations

import inspect
import json
import os

import numpy as np
import pytest
import torch

from opscope.analysis.aggregate import key_averages
from opscope.analysis.build import load_session
from opscope.cli.main import main
from opscope.event_list import EventList
from opscope.load.trace_events import python_function_rule

from test_trace_loader import table_cells
from workloads import mlp_step_fn


def installed_torch_rule() -> str:
    """What the installed torch does with Python functions, asked of torch itself."""
    from torch.autograd.profiler_util import EventList as TorchEventList, FunctionEvent

    # torch 2.15 added key_averages(include_python_functions=False): hidden by default
    if "include_python_functions" in inspect.signature(TorchEventList.key_averages).parameters:
        return "hidden"
    # torch between 2.8 and 2.13 made Python functions events (FunctionEvent.is_python_function)
    if "is_python_function" in inspect.signature(FunctionEvent.__init__).parameters:
        return "counted"
    return "absent"


@pytest.fixture(scope="module")
def stack_trace(tmp_path_factory):
    """One MLP step recorded by the installed torch.profiler with stacks and shapes.

    Returns (trace path, torch's table sorted by CPU total, the torch profiler).
    """
    path = str(tmp_path_factory.mktemp("torch_stack") / "stack.trace.json")
    step = mlp_step_fn()
    step()
    with torch.profiler.profile(record_shapes=True, with_stack=True) as prof:
        with torch.profiler.record_function("my_step"):
            step()
    prof.export_chrome_trace(path)
    table = prof.key_averages().table(sort_by="cpu_time_total", row_limit=-1)
    return path, table, prof


def _assert_same_table(got: str, expected: str) -> None:
    got_rows, expected_rows = table_cells(got), table_cells(expected)
    assert len(got_rows) >= 15
    assert sorted(got_rows) == sorted(expected_rows)  # the same rows (ties in any order)
    assert [r[2] for r in got_rows] == [r[2] for r in expected_rows]  # same order of totals
    assert got.splitlines()[-1] == expected.splitlines()[-1]  # Self CPU time total


def test_the_rule_is_the_writing_torchs(stack_trace):
    path, _, _ = stack_trace
    with open(path) as f:
        doc = json.load(f)
    python_events = [e for e in doc["traceEvents"] if e.get("cat") == "python_function"]
    assert python_events, "with_stack=True wrote no python_function events"
    assert python_function_rule(doc, python_events) == installed_torch_rule()
    assert load_session(path).python_functions == installed_torch_rule()


def test_stack_trace_table_is_torchs_key_averages_table(stack_trace):
    path, expected, prof = stack_trace
    loaded = load_session(path)
    got = EventList(key_averages(loaded.table)).table(sort_by="cpu_time_total", row_limit=-1)
    _assert_same_table(got, expected)
    # a negative self time (<module> had one when python_function events were rows
    # under every torch) only where torch itself prints one
    negative = lambda rows: {r.key for r in rows if r.self_cpu_time_total < 0}  # noqa: E731
    assert negative(key_averages(loaded.table)) == negative(prof.key_averages())


def test_stack_trace_rows_and_events_match_torchs(stack_trace):
    path, _, prof = stack_trace
    loaded = load_session(path)
    events = prof.events()
    rule = installed_torch_rule()
    if rule == "hidden":  # events in torch's tree, but not rows of key_averages
        events = [e for e in events if not e.is_python_function]
    assert len(loaded.table) == len(events)
    assert bool(loaded.python_function_rows.any()) is (rule == "counted")
    torch_rows = {(r.key, r.count) for r in prof.key_averages()}
    assert {(r.key, r.count) for r in key_averages(loaded.table)} == torch_rows


def test_opscope_table_prints_torchs_table(stack_trace, capsys):
    path, expected, _ = stack_trace
    with pytest.raises(SystemExit) as info:
        main(["table", path, "--sort", "cpu_time_total", "--limit", "-1"])
    out, err = capsys.readouterr()
    assert info.value.code in (0, None), err
    _assert_same_table(out.rstrip("\n"), expected)


# -- the three rules on a synthetic trace (fixed times) ------------------------------------

def _event(name, ts, dur, cat="cpu_op", **args):
    return {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": 7, "ts": ts, "dur": dur,
            "args": args}


def _write(tmp_path, call_from: bool, host_name: bool) -> str:
    """A range holding a Python function holding an op; the markers of each torch."""
    py_args = {"Python id": 1, "Ev Idx": 3}
    py_args.update({"CallFrom": "a.py:3"} if call_from else {"Python parent id": None})
    doc = {"schemaVersion": 1, "with_stack": 1, "traceEvents": [
        _event("my_range", 0.0, 100.0, cat="user_annotation"),
        _event("a.py(3): step", 10.0, 50.0, cat="python_function", **py_args),
        _event("aten::mm", 20.0, 30.0),
    ]}
    if host_name:
        doc["host_name"] = "vm"
    path = tmp_path / "synthetic.json"
    path.write_text(json.dumps(doc))
    return str(path)


def _self_times(session):
    return {r.key: (r.count, r.self_cpu_time_total) for r in key_averages(session.table)}


def test_absent_rule_drops_python_functions(tmp_path):
    """torch 2.4 and 2.8: not events, so the range's self time excludes only the op."""
    s = load_session(_write(tmp_path, call_from=False, host_name=False))
    assert s.python_functions == "absent"
    assert _self_times(s) == {"my_range": (1, 70.0), "aten::mm": (1, 30.0)}


def test_counted_rule_keeps_them_as_rows(tmp_path):
    """torch 2.13: a row of their own, and the op nests under them."""
    s = load_session(_write(tmp_path, call_from=False, host_name=True))
    assert s.python_functions == "counted"
    assert _self_times(s) == {"my_range": (1, 50.0), "a.py(3): step": (1, 20.0),
                              "aten::mm": (1, 30.0)}
    assert s.python_function_rows.tolist() == [False, True, False]


def test_hidden_rule_keeps_them_in_the_tree_only(tmp_path):
    """torch 2.15: the range's self time excludes the Python function, which has no row."""
    s = load_session(_write(tmp_path, call_from=True, host_name=True))
    assert s.python_functions == "hidden"
    assert _self_times(s) == {"my_range": (1, 50.0), "aten::mm": (1, 30.0)}
    assert not s.python_function_rows.any()
    assert len(s.table) == 2 and s.table.parent.tolist() == [-1, 0]


@pytest.mark.parametrize("rule", ["absent", "counted", "hidden"])
def test_the_rule_can_be_chosen(tmp_path, rule):
    s = load_session(_write(tmp_path, call_from=False, host_name=False), python_functions=rule)
    assert s.python_functions == rule
    assert ("a.py(3): step" in _self_times(s)) is (rule == "counted")


def test_a_bad_rule_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match="python_functions must be one of"):
        load_session(_write(tmp_path, call_from=False, host_name=False),
                     python_functions="some")


def test_hidden_rule_keeps_memory_stacks_and_flops_per_row(tmp_path):
    """Per-row values follow the rows kept; memory of a dropped row is owned by none."""
    doc = {"profile_memory": 1, "with_stack": 1, "traceEvents": [
        _event("my_range", 0.0, 100.0, cat="user_annotation"),
        _event("a.py(3): step", 10.0, 50.0, cat="python_function", CallFrom="a.py:3"),
        _event("aten::mm", 20.0, 30.0, flops=8, **{"Call stack": "a.py(3): step;"}),
        {"ph": "i", "name": "[memory]", "pid": 1, "tid": 7, "ts": 25.0,
         "args": {"Addr": 1, "Bytes": 64, "Total Allocated": 64, "Device Type": 0}},
        {"ph": "i", "name": "[memory]", "pid": 1, "tid": 7, "ts": 55.0,
         "args": {"Addr": 2, "Bytes": 32, "Total Allocated": 96, "Device Type": 0}},
    ]}
    path = tmp_path / "memory.json"
    path.write_text(json.dumps(doc))
    s = load_session(str(path))
    names = [s.table.name(i) for i in range(len(s.table))]
    assert names[:2] == ["my_range", "aten::mm"]
    assert s.stacks[1] == ["a.py(3): step"] and s.stacks[0] is None
    assert s.flops[1] == 8 and s.flops[0] == 0
    owners = np.asarray(s.memory_owner).tolist()
    assert all(o < len(s.table) for o in owners)
    mm = names.index("aten::mm")
    assert s.event_memory["self_cpu_memory_usage"][mm] == 64
    # the 32 bytes fell in the Python function outside the op: now owned by none
    assert s.event_memory["self_cpu_memory_usage"].sum() == 64
    assert s.event_memory["cpu_memory_usage"][0] == 96


def test_hidden_rule_drops_python_events_not_ranges_of_the_same_name(tmp_path):
    """Rows are dropped by where they came from, never by their name."""
    doc = {"traceEvents": [
        _event("a.py(3): step", 0.0, 100.0, cat="user_annotation"),
        _event("a.py(3): step", 10.0, 50.0, cat="python_function", CallFrom="a.py:3"),
        _event("aten::mm", 20.0, 30.0),
        _event("aten::add", 70.0, 10.0),  # a second child: no same-name folding
    ]}
    path = tmp_path / "same_name.json"
    path.write_text(json.dumps(doc))
    s = load_session(str(path))
    assert s.python_functions == "hidden"
    assert _self_times(s) == {"a.py(3): step": (1, 40.0), "aten::mm": (1, 30.0),
                              "aten::add": (1, 10.0)}


# -- traces recorded by each supported torch (tests/torch_traces, record_trace.py) -----------

TRACES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "torch_traces")
RULE_OF_VERSION = {"2.4.1": "absent", "2.8.0": "absent", "2.13.0": "counted",
                   "2.15.0": "hidden"}


@pytest.mark.parametrize("version", sorted(RULE_OF_VERSION))
def test_every_versions_trace_loads_with_its_rule_whatever_torch_runs(version, capsys):
    """Whichever torch is installed, each version's trace gives that version's table."""
    path = os.path.join(TRACES, f"torch-{version}.trace.json.gz")
    with open(os.path.join(TRACES, f"torch-{version}.table.txt")) as f:
        expected = f.read()
    assert load_session(path).python_functions == RULE_OF_VERSION[version]
    with pytest.raises(SystemExit) as info:
        main(["table", path, "--sort", "cpu_time_total", "--limit", "-1"])
    out, err = capsys.readouterr()
    assert info.value.code in (0, None), err
    _assert_same_table(out.rstrip("\n"), expected.rstrip("\n"))
