"""FunctionEvent details users read from Python: concrete inputs as torch gives them, and
the module each op ran in (``module_hierarchy``), in events and in ``to_dataframe()``."""

from __future__ import annotations

import json

import pytest
import torch

import opscope


def _ops():
    x = torch.randn(4, 4)
    torch.add(x, 1, alpha=2)
    x.sum(dim=0, keepdim=True)
    x.view(-1)
    x.transpose(0, 1)
    torch.cat([x, x], 1)
    x.to(torch.float64)
    torch.clamp(x, min=0.5)


def _concrete(events):
    return [(e.name, e.concrete_inputs) for e in events if e.name.startswith("aten::")]


def test_concrete_inputs_equal_torchs_values():
    with torch.profiler.profile(record_shapes=True) as theirs:
        _ops()
    with opscope.profile(record_shapes=True) as ours:
        _ops()
    expected = _concrete(theirs.events())
    got = _concrete(ours.events())
    assert got == expected
    values = [v for _, inputs in got for v in inputs]
    kinds = {type(v) for v in values}
    assert {type(None), bool, int, float, list} <= kinds and str not in kinds  # values, not text


class _Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 4)
        self.head = torch.nn.Sequential(torch.nn.ReLU(), torch.nn.Linear(4, 2))

    def forward(self, x):
        return self.head(self.fc(x))


def test_module_hierarchy_of_events_matches_the_trace(tmp_path):
    net = _Net()
    with opscope.profile(with_modules=True) as prof:
        net(torch.randn(3, 8)).sum().backward()
    events = prof.events()
    by_name = {}
    for e in events:
        by_name.setdefault(e.name, set()).add(e.module_hierarchy)
    assert {h for h in by_name["aten::addmm"]} == {"_Net.fc", "_Net.head.1"}
    assert by_name["aten::relu"] == {"_Net.head.0"}
    path = tmp_path / "t.json"
    prof.export_chrome_trace(str(path))
    in_trace = [e.get("args", {}).get("Module Hierarchy", "")
                for e in json.loads(path.read_text())["traceEvents"]
                if e.get("ph") == "X" and e.get("cat") in ("cpu_op", "user_annotation")]
    assert sorted(e.module_hierarchy for e in events) == sorted(in_trace)


def test_module_hierarchy_column_in_dataframe():
    pytest.importorskip("pandas")
    with opscope.profile(with_modules=True) as prof:
        _Net()(torch.randn(2, 8))
    frame = prof.events().to_dataframe()
    assert "module_hierarchy" in frame.columns
    assert "_Net.fc" in set(frame["module_hierarchy"])


def test_without_modules_the_hierarchy_is_empty():
    with opscope.profile() as prof:
        _Net()(torch.randn(2, 8))
    assert {e.module_hierarchy for e in prof.events()} == {""}
