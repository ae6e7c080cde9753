"""with_stack: Python stacks captured at op entry by the native observer."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

import opscope


THIS_FILE = "test_with_stack.py"


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        return torch.relu(self.fc(x))


def train_step_for_stack_test(model, opt, x):
    opt.zero_grad()
    model(x).sum().backward()
    opt.step()


@pytest.fixture(scope="module")
def stacked():
    import os
    os.environ["OPSCOPE_COLLECTOR"] = "native"
    try:
        torch.manual_seed(0)
        model = nn.Sequential(Block(), Block())
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        x = torch.randn(4, 8)
        with opscope.profile(with_stack=True, record_shapes=True) as prof:
            train_step_for_stack_test(model, opt, x)
    finally:
        del os.environ["OPSCOPE_COLLECTOR"]
    return prof


def by_name(prof, name):
    return [e for e in prof.events() if e.name == name]


def test_forward_ops_carry_python_stack_innermost_first(stacked):
    (addmm, _) = by_name(stacked, "aten::addmm")
    assert addmm.stack[0].startswith("torch/nn/modules/linear.py(")
    assert addmm.stack[0].endswith(": forward")
    joined = "\n".join(addmm.stack)
    assert f"{THIS_FILE}(" in joined and "): forward" in joined  # Block.forward
    assert any(f.endswith(": train_step_for_stack_test") for f in addmm.stack)
    # innermost first: the Linear frame comes before the Block frame, which comes before ours
    pos = {f: i for i, f in enumerate(addmm.stack)}
    block = next(i for f, i in pos.items() if THIS_FILE in f and f.endswith(": forward"))
    step = next(i for f, i in pos.items() if f.endswith(": train_step_for_stack_test"))
    assert 0 < block < step


def test_backward_ops_carry_their_forward_stack(stacked):
    events = stacked.events()
    forward = {e.sequence_nr: e for e in events if e.name == "aten::addmm"}
    nodes = [e for e in events if e.name == "AddmmBackward0"]
    assert len(nodes) == 2
    for node in nodes:
        assert node.stack == forward[node.sequence_nr].stack
        for child in node.cpu_children:  # e.g. aten::mm inside the node
            assert child.stack == node.stack
    relu_bwd = by_name(stacked, "ReluBackward0")
    assert all(any(THIS_FILE in f for f in e.stack) for e in relu_bwd)


def test_every_python_called_op_has_a_stack(stacked):
    missing = [e.name for e in stacked.events()
               if e.name.startswith("aten::") and not e.stack]
    assert missing == []


def test_group_by_stack_and_source_location_column(stacked):
    rows = stacked.key_averages(group_by_stack_n=2)
    relu = [r for r in rows if r.key == "aten::relu"]
    assert len(relu) == 1 and len(relu[0].stack) == 2 and relu[0].count == 2
    text = rows.table(sort_by="self_cpu_time_total", row_limit=5)
    assert "Source Location" in text.splitlines()[1]
    assert "torch/nn/modules/linear.py(" in text or f"{THIS_FILE}(" in text


def test_trace_has_call_stack_arg(stacked, tmp_path):
    path = tmp_path / "t.json"
    stacked.export_chrome_trace(str(path))
    ops = [e for e in json.loads(path.read_text())["traceEvents"]
           if e.get("name") == "aten::addmm"]
    stack = ops[0]["args"]["Call stack"]
    assert stack.endswith(";") and stack.startswith("torch/nn/modules/linear.py(")
    assert "train_step_for_stack_test" in stack


def test_export_stacks_names_this_file_and_function(stacked, tmp_path):
    path = tmp_path / "prof.stacks"
    stacked.export_stacks(str(path), "self_cpu_time_total")
    lines = path.read_text().splitlines()
    assert lines
    addmm = [line for line in lines if line.rsplit(" ", 1)[0].endswith(";aten::addmm")]
    assert addmm
    frames = addmm[0].rsplit(" ", 1)[0].split(";")
    # root first: this test's function comes before Block.forward, the op is the leaf
    names = [f for f in frames if THIS_FILE in f]
    assert any(f.endswith(":_train_step_for_stack_test") for f in names)
    assert frames.index(next(f for f in frames if f.endswith(":_train_step_for_stack_test"))) \
        < frames.index(next(f for f in frames if f.startswith("torch/nn/modules/linear.py")))
    assert all(line.rsplit(" ", 1)[1].isdigit() for line in lines)


def test_stacks_do_not_change_op_counts_against_torch(native_only):
    torch.manual_seed(0)
    model = nn.Sequential(Block(), Block())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(4, 8)
    train_step_for_stack_test(model, opt, x)

    def counts(prof):
        out = {}
        for e in prof.events():
            if e.name.startswith("aten::"):
                out[e.name] = out.get(e.name, 0) + 1
        return out

    with opscope.profile(with_stack=True, profile_memory=True) as ours:
        train_step_for_stack_test(model, opt, x)
    with torch.profiler.profile() as theirs:
        train_step_for_stack_test(model, opt, x)
    assert counts(ours) == counts(theirs)


def test_python_fallback_records_forward_stacks(monkeypatch):
    monkeypatch.setenv("OPSCOPE_COLLECTOR", "python")
    model = nn.Sequential(Block())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with opscope.profile(with_stack=True) as prof:
        train_step_for_stack_test(model, opt, torch.randn(4, 8))
    assert prof.session.collector == "python"
    addmm = by_name(prof, "aten::addmm")
    assert addmm and addmm[0].stack[0].startswith("torch/nn/modules/linear.py(")
    assert any(f.endswith(": train_step_for_stack_test") for f in addmm[0].stack)
