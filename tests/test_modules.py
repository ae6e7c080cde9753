"""with_modules=True on eager nn.Modules: named ranges, op attribution, the module view.

The three-level model (Model -> Block -> Linear) gives every Linear a distinct
(in, out) size, so the input shapes of an addmm (forward) or mm (backward) say by
themselves which layer ran it: that is the oracle the attribution is checked against.
"""

from __future__ import annotations

import json
from collections import Counter

import pytest
import torch
from torch import nn

import opscope
from opscope.analysis.flops import backward_mask
from opscope.analysis.facts import event_modules, module_ranges
from opscope.analysis.modules import module_hierarchy
from opscope.collect.module_hooks import installed_hooks

BATCH = 3
SIZES = {"blocks.0.fc1": (8, 16), "blocks.0.fc2": (16, 12), "blocks.1.fc1": (12, 20),
         "blocks.1.fc2": (20, 24), "head": (24, 4)}


class Block(nn.Module):
    def __init__(self, width_in: int, hidden: int, width_out: int):
        super().__init__()
        self.fc1 = nn.Linear(width_in, hidden)
        self.fc2 = nn.Linear(hidden, width_out)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList([Block(8, 16, 12), Block(12, 20, 24)])
        self.head = nn.Linear(24, 4)
        self.drop = nn.Dropout(0.0)

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        # dropout(p=0) creates no autograd node, so the mul's node gets the same
        # sequence number as the dropout op: the node must still go to Model
        return self.head(self.drop(x) * 2.0)


def train_step_fn():
    torch.manual_seed(0)
    model = Model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(BATCH, 8)

    def step():
        opt.zero_grad()
        model(x).pow(2).sum().backward()
        opt.step()

    return model, step


def layer_of(name: str, shapes) -> str:
    """The Linear that ran this matmul, from its input shapes alone ('' if not a Linear's)."""
    for path, (n_in, n_out) in SIZES.items():
        if name == "aten::addmm" and shapes[1:3] == [[BATCH, n_in], [n_in, n_out]]:
            return path
        if name == "aten::mm" and shapes in ([[BATCH, n_out], [n_out, n_in]],  # grad input
                                             [[n_out, BATCH], [BATCH, n_in]]):  # grad weight
            return path
    return ""


def profile_step(**options):
    model, step = train_step_fn()
    step()  # warm up: optimizer state, lazy init
    with opscope.profile(with_modules=True, record_shapes=True, **options) as prof:
        step()
    return prof


def contained(table, outer: int, inner: int) -> bool:
    return (table.thread_index[outer] == table.thread_index[inner]
            and table.start_ns[outer] <= table.start_ns[inner]
            and table.end_ns[inner] <= table.end_ns[outer])


def test_module_ranges_are_named_by_path_and_class(collector_name):
    prof = profile_step()
    counts = Counter(row.key for row in prof.key_averages() if row.is_user_annotation)
    expected = {"Model": 1, "blocks.0 (Block)": 1, "blocks.1 (Block)": 1, "drop (Dropout)": 1}
    expected.update({f"{path} (Linear)": 1 for path in SIZES})
    assert {k: v for k, v in counts.items() if k in prof.session.modules} == expected
    info = prof.session.modules["blocks.1.fc2 (Linear)"]
    assert (info.hierarchy, info.class_name, info.path, info.parameters) == \
        ("Model.blocks.1.fc2", "Linear", "blocks.1.fc2", 20 * 24 + 24)
    assert prof.session.modules["Model"].parameters == \
        sum(p.numel() for p in Model().parameters())
    # the ranges nest: each Linear inside its Block, each Block inside Model
    table = prof.session.table
    row = {table.name(i): i for i in range(len(table)) if module_ranges(prof.session)[i]}
    assert contained(table, row["Model"], row["blocks.0 (Block)"])
    assert contained(table, row["blocks.0 (Block)"], row["blocks.0.fc2 (Linear)"])
    assert not contained(table, row["blocks.0 (Block)"], row["blocks.1.fc1 (Linear)"])


def test_every_forward_and_backward_op_lands_under_its_module(collector_name):
    prof = profile_step()
    session = prof.session
    table = session.table
    hierarchy = module_hierarchy(session)
    checked = Counter()
    for i in range(len(table)):
        name = table.name(i)
        inputs = table.inputs(i)
        layer = layer_of(name, inputs.shapes) if inputs is not None else ""
        if layer:
            assert hierarchy[i] == f"Model.{layer}", (name, inputs.shapes)
            checked[name] += 1
    # forward: one addmm per Linear; backward: one mm for each weight gradient and one
    # for each input gradient (the first layer's input needs none)
    assert checked == {"aten::addmm": 5, "aten::mm": 9}

    # relu and its backward belong to the Block whose forward ran the relu
    blocks = {16: "Model.blocks.0", 20: "Model.blocks.1"}
    relus = [(table.name(i), hierarchy[i], blocks[table.inputs(i).shapes[0][1]])
             for i in range(len(table))
             if table.name(i) in ("aten::relu", "aten::threshold_backward")]
    assert len(relus) == 4 and all(got == want for _, got, want in relus)
    muls = [hierarchy[i] for i in range(len(table))
            if table.name(i) in ("aten::mul", "MulBackward0")
            and table.inputs(i) is not None and table.inputs(i).shapes[0] == [BATCH, 24]]
    assert muls and all(h == "Model" for h in muls)
    drop_bwd = [hierarchy[i] for i in range(len(table)) if table.name(i) == "MulBackward0"]
    assert drop_bwd == ["Model"]
    # every op inside a backward node belongs where the node does
    owner = event_modules(session)
    for i in range(len(table)):
        if table.scope[i] == 1 and table.name(i).endswith("Backward0") and owner[i] >= 0:
            inside = [j for j in range(len(table)) if j != i and contained(table, i, j)]
            assert inside or collector_name == "python"
            assert all(hierarchy[j] == hierarchy[i] for j in inside)
    # forward ops outside the model (the loss) and the optimizer belong to no module
    for i in range(len(table)):
        if table.name(i) in ("aten::pow", "aten::add_"):
            assert hierarchy[i] == ""
    # every forward aten op runs under the innermost module range around it
    ranges = [j for j in range(len(table)) if module_ranges(session)[j]]
    backward = backward_mask(table)
    forward_ops = [i for i in range(len(table))
                   if table.name(i).startswith("aten::") and not backward[i]]
    assert len(forward_ops) > 20
    for i in forward_ops:
        around = [j for j in ranges if contained(table, j, i)]
        innermost = max(around, key=lambda j: table.start_ns[j]) if around else -1
        assert owner[i] == innermost, table.name(i)


def test_module_table_times_nest(collector_name):
    prof = profile_step()
    rows = prof.key_averages(group_by="module")
    assert [(r.key, r.depth) for r in rows] == [
        ("Model", 0), ("blocks.0 (Block)", 1), ("blocks.0.fc1 (Linear)", 2),
        ("blocks.0.fc2 (Linear)", 2), ("blocks.1 (Block)", 1), ("blocks.1.fc1 (Linear)", 2),
        ("blocks.1.fc2 (Linear)", 2), ("drop (Dropout)", 1), ("head (Linear)", 1)]
    for row in rows:
        children = [rows[c] for c in row.children]
        assert row.forward_time_total >= sum(c.forward_time_total for c in children)
        assert row.backward_time_total >= sum(c.backward_time_total for c in children)
        assert row.cpu_time_total >= sum(c.cpu_time_total for c in children)
        assert row.self_cpu_time_total >= 0 and row.count == 1
        if row.class_name == "Linear":
            assert row.backward_time_total > 0
        if row.class_name == "Dropout":
            assert row.backward_time_total == 0
    text = prof.module_table()
    assert text.splitlines()[1].split()[:3] == ["Module", "#", "of"]
    assert "    blocks.0.fc1 (Linear)" in text and "Module backward time total" in text


def test_module_called_several_times_counts_each_call():
    shared = nn.Linear(4, 4)

    class Loop(nn.Module):
        def __init__(self):
            super().__init__()
            self.shared = shared

        def forward(self, x):
            for _ in range(3):
                x = self.shared(x)
            return x

    model, x = Loop(), torch.randn(2, 4)
    with opscope.profile(with_modules=True) as prof:
        for _ in range(2):
            model(x).sum().backward()
    rows = {r.key: r for r in prof.key_averages(group_by="module")}
    assert rows["Loop"].count == 2 and rows["shared (Linear)"].count == 6
    assert rows["shared (Linear)"].backward_time_total > 0
    assert rows["Loop"].forward_time_total >= rows["shared (Linear)"].forward_time_total


def test_trace_marks_module_ranges_and_op_hierarchy(tmp_path):
    prof = profile_step()
    path = tmp_path / "trace.json"
    prof.export_chrome_trace(str(path))
    events = json.loads(path.read_text())["traceEvents"]
    marked = {e["name"]: e["args"] for e in events if "Module Class" in e.get("args", {})}
    assert marked["blocks.0.fc1 (Linear)"]["Module Hierarchy"] == "Model.blocks.0.fc1"
    assert marked["Model"]["Module Path"] == "" and marked["Model"]["Module Class"] == "Model"
    assert "Input Dims" not in marked["Model"]  # a range has no inputs, as in torch's trace
    assert all(e["cat"] == "user_annotation" for e in events if e["name"] in marked)
    addmm = [e["args"]["Module Hierarchy"] for e in events if e["name"] == "aten::addmm"]
    assert addmm == [f"Model.{p}" for p in SIZES]


def test_hooks_live_only_while_recording():
    model, step = train_step_fn()
    seen = []
    sched = opscope.schedule(wait=1, warmup=1, active=1, repeat=2)
    with opscope.profile(schedule=sched, with_modules=True) as prof:
        for _ in range(6):
            seen.append(len(installed_hooks()))
            step()
            prof.step()
    assert seen == [0, 0, 2, 0, 0, 2]
    assert installed_hooks() == []
    assert "head (Linear)" in prof.session.modules


def test_forward_that_raises_closes_its_ranges():
    class Boom(nn.Module):
        def forward(self, x):
            raise ValueError("boom")

    class Outer(nn.Module):
        def __init__(self):
            super().__init__()
            self.boom = Boom()

        def forward(self, x):
            try:
                return self.boom(x)
            except ValueError:
                return x + 1

    with opscope.profile(with_modules=True) as prof:
        Outer()(torch.ones(2))
    table = prof.session.table
    names = [table.name(i) for i in range(len(table))]
    assert names.count("boom (Boom)") == 1
    i, j = names.index("Outer"), names.index("boom (Boom)")
    assert contained(table, i, j) and table.flags[j] == 0  # closed, not cut at stop


def test_group_by_errors_name_the_argument():
    with opscope.profile() as prof:
        nn.Linear(2, 2)(torch.ones(1, 2))
    with pytest.raises(ValueError, match="group_by must be None or 'module'"):
        prof.key_averages(group_by="class")
    with pytest.raises(RuntimeError, match="with_modules=True"):
        prof.module_table()


def test_all_options_keep_aten_counts_equal_to_torch_profiler(native_only):
    from workloads import mlp_step_fn, transformer_step_fn

    for make_step in (mlp_step_fn, transformer_step_fn):
        step = make_step()
        step()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as tp:
            step()
        with opscope.profile(with_stack=True, with_modules=True, with_flops=True) as op:
            step()

        def aten(prof):
            return Counter({r.key: r.count for r in prof.key_averages()
                            if r.key.startswith("aten::")})

        assert aten(op) == aten(tp)
        assert len(aten(op)) > 10
        assert op.session.modules and op.session.flops.sum() > 0
