"""Higher-order ops (``torch.cond``) under the Python fallback collector, on every torch.

torch 2.4 and 2.8 raise when a HOP meets a dispatch mode with no rule for it
(``collect/python/hops.py`` registers one); newer torch routes HOPs to the mode
itself. Either way a HOP is one record, named as torch names it, and the ops
around it are recorded as usual.
"""

from __future__ import annotations

import sys
import threading

import pytest
import torch
from torch.utils._python_dispatch import _len_torch_dispatch_stack

import opscope
from opscope.collect.python.collector import PythonCollector, _OpMode
from opscope.collect.python.hops import route_higher_order_ops, torch_routes_higher_order_ops


def _dynamo_registry_wrapped() -> bool:
    convert_frame = sys.modules.get("torch._dynamo.convert_frame")
    return "add" in vars(getattr(convert_frame, "input_codes", object()))


@pytest.fixture(autouse=True)
def nothing_left_installed():
    before = (sys.getprofile(), threading.getprofile(), _len_torch_dispatch_stack())
    yield
    assert (sys.getprofile(), threading.getprofile(), _len_torch_dispatch_stack()) == before
    assert not _dynamo_registry_wrapped(), "collect.python.dynamo's wrapper outlived the recording"


def _names(raw):
    return [raw.names[rec["name_id"]] for rec in raw.records]


def _record(work, **options):
    collector = PythonCollector()
    collector.start(**options)
    try:
        result = work()
    finally:
        raw = collector.stop()
    return result, raw


def _branching(x):
    before = x + 1  # recorded before the HOP
    out = torch.cond(x.sum() > 0, torch.sin, torch.cos, (before,))
    return out * 2  # recorded after it: the mode is back on the stack


@pytest.mark.parametrize("sign", [1.0, -1.0], ids=["true-branch", "false-branch"])
def test_cond_runs_and_is_one_record(sign):
    x = torch.full((3,), sign)
    expected = _branching(x)
    out, raw = _record(lambda: _branching(x))
    assert torch.equal(out, expected)
    names = _names(raw)
    assert names.count("cond") == 1
    assert "aten::add" in names and "aten::mul" in names
    assert names.index("aten::add") < names.index("cond")  # kept in call order


@pytest.mark.parametrize("options", [dict(record_shapes=True), dict(with_stack=True)],
                         ids=["record_shapes", "with_stack"])
def test_cond_with_shapes_and_stacks(options):
    x = torch.ones(3)
    out, raw = _record(lambda: _branching(x), **options)
    assert torch.equal(out, _branching(x)) and "cond" in _names(raw)


def test_cond_twice_and_after_stop():
    x = torch.ones(2)
    _, raw = _record(lambda: [_branching(x) for _ in range(2)])
    assert _names(raw).count("cond") == 2
    assert torch.equal(_branching(x), torch.sin(x + 1) * 2)  # no mode left behind


def test_cond_under_opscope_profile_with_the_python_collector(monkeypatch):
    monkeypatch.setenv("OPSCOPE_COLLECTOR", "python")
    x = torch.ones(4)
    expected = _branching(x)  # torch 2.4 to 2.8 compile cond at its first call: not here
    with opscope.profile() as prof:
        out = _branching(x)
    assert torch.equal(out, expected)
    counts = {row.key: row.count for row in prof.key_averages()}
    assert counts.get("cond") == 1 and counts.get("aten::mul") == 1


def test_routing_is_idempotent_and_only_where_torch_needs_it():
    route_higher_order_ops(_OpMode)
    assert route_higher_order_ops(_OpMode) == 0  # already done: nothing more
    if torch_routes_higher_order_ops():
        return  # this torch hands HOPs to __torch_dispatch__ itself
    from torch._ops import _higher_order_ops

    for hop in _higher_order_ops.values():
        table = getattr(hop, "python_key_table", getattr(hop, "python_key_mode_table", {}))
        assert _OpMode in table, f"no rule for {hop}"


def test_compiled_code_first_met_while_recording_compiles_afterwards():
    from torch._dynamo.eval_frame import _debug_get_cache_entry_list

    def fresh(x):
        return torch.cos(x) + 1

    compiled = torch.compile(fresh, backend="eager")
    x = torch.ones(3)
    collector = PythonCollector()
    collector.start()
    try:
        compiled(x)
        if hasattr(sys.modules["torch._dynamo.convert_frame"], "any_torch_dispatch_mode_on_stack"):
            assert _dynamo_registry_wrapped()  # noting the codes dynamo meets while recording
    finally:
        raw = collector.stop()
    assert "aten::cos" in _names(raw)
    assert torch.equal(compiled(x), torch.cos(x) + 1)
    # torch 2.13 marked the code "skip forever" while our mode was on (older torch
    # compiled it then); either way it is compiled once recording is over
    assert _debug_get_cache_entry_list(fresh.__code__)
