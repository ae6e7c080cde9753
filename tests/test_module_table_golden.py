"""Golden tests for the module view (``analysis.modules`` + ``export.module_table``).

A synthetic session (fixed times, no profiler run): Model -> block (Block) -> block.fc
(Linear), plus head (Linear), then a backward pass whose nodes link to the forward ops
by sequence number. The expected text lives in ``tests/golden/module_table*.txt`` and
is rewritten only when ``OPSCOPE_UPDATE_GOLDEN=1`` is set.
"""

from __future__ import annotations


import numpy as np
import pytest

from opscope.analysis.modules import module_rows
from opscope.export.module_table import format_module_table
from opscope.model.modules import ModuleInfo
from synthetic import SCOPE_BACKWARD_FUNCTION, SCOPE_USER, Op, TensorSpec, make_session

from golden_files import check_golden  # noqa: E402
EVAL = "autograd::engine::evaluate_function: "


def addmm(start, end, seq, n_in, n_out):
    return Op("aten::addmm", start, end, seq=seq,
              inputs=[TensorSpec((n_out,)), TensorSpec((2, n_in)), TensorSpec((n_in, n_out)), 1, 1])


def mm(start, end, a, b):
    return Op("aten::mm", start, end, inputs=[TensorSpec(a), TensorSpec(b)])


def node(name, start, end, seq):
    return [Op(EVAL + name, start, end),
            Op(name, start + 1, end - 1, scope=SCOPE_BACKWARD_FUNCTION, seq=seq, fwd_thread=1)]


def model_session():
    ops = [
        Op("Model", 0, 100, scope=SCOPE_USER),
        Op("block (Block)", 5, 60, scope=SCOPE_USER),
        Op("block.fc (Linear)", 10, 40, scope=SCOPE_USER),
        Op("aten::linear", 12, 38, seq=1),
        addmm(15, 35, 2, 3, 4),
        Op("aten::relu", 45, 55, seq=3),
        Op("head (Linear)", 65, 95, scope=SCOPE_USER),
        addmm(70, 90, 4, 4, 2),
        Op("aten::sum", 96, 99, seq=5),  # the loss, inside Model only
        *node("SumBackward0", 110, 118, 5),
        *node("AddmmBackward0", 120, 150, 4),
        mm(125, 135, (2, 2), (2, 4)),
        mm(136, 146, (2, 2), (2, 4)),
        *node("ReluBackward0", 155, 165, 3),
        *node("AddmmBackward0", 170, 200, 2),
        mm(175, 190, (4, 2), (2, 3)),
        Op("Optimizer.step#SGD.step", 210, 230, scope=SCOPE_USER),
    ]
    session = make_session(ops, options={"with_flops": True, "with_modules": True})
    session.modules = {
        "Model": ModuleInfo.for_module("", "Model", "Model", 26),
        "block (Block)": ModuleInfo.for_module("block", "Block", "Model", 16),
        "block.fc (Linear)": ModuleInfo.for_module("block.fc", "Linear", "Model", 16),
        "head (Linear)": ModuleInfo.for_module("head", "Linear", "Model", 10),
    }
    return session


def test_rows_attribute_forward_and_backward():
    # backward: each evaluate_function range goes to the module whose forward op has the
    # node's sequence number (the loss's SumBackward0 to Model); FLOPs: addmm 2*2*3*4 and
    # its weight-gradient mm 2*4*2*3 for block.fc, addmm 2*2*4*2 and two mm 2*2*2*4 for head
    rows = module_rows(model_session())
    summary = [(r.key, r.depth, r.count, r.forward_time_total, r.backward_time_total,
                r.self_cpu_time_total, r.flops) for r in rows]
    assert summary == [
        ("Model", 0, 1, 100.0, 78.0, 23.0, 192),
        ("block (Block)", 1, 1, 55.0, 40.0, 35.0, 96),
        ("block.fc (Linear)", 2, 1, 30.0, 30.0, 60.0, 96),
        ("head (Linear)", 1, 1, 30.0, 30.0, 60.0, 96),
    ]


def test_module_table_golden():
    text = format_module_table(module_rows(model_session()), with_flops=True)
    check_golden("module_table.txt", text)


def test_module_table_with_memory_sorted_and_limited_golden():
    session = model_session()
    memory = np.zeros(len(session.table), dtype=np.int64)
    names = [session.table.name(i) for i in range(len(session.table))]
    memory[names.index("aten::addmm")] = 4096
    memory[names.index("aten::relu")] = 2048
    memory[len(names) - 1 - names[::-1].index("aten::mm")] = 1024
    rows = module_rows(session, memory=memory)
    assert [(r.key, r.cpu_memory_usage, r.self_cpu_memory_usage) for r in rows] == [
        ("Model", 4096 + 2048 + 1024 + 0, 0), ("block (Block)", 4096 + 2048 + 1024, 2048),
        ("block.fc (Linear)", 4096 + 1024, 4096 + 1024), ("head (Linear)", 0, 0)]
    text = format_module_table(rows, sort_by="cpu_time_total", row_limit=3, time_unit="us",
                               max_name_column_width=20)
    check_golden("module_table_memory.txt", text)


def test_bad_sort_key_names_the_choices():
    with pytest.raises(ValueError, match="sort_by='speed' is not a module table column"):
        format_module_table(module_rows(model_session()), sort_by="speed")


def test_flops_scaled_from_the_largest_row():
    """The root holds the model's total: it reads 6.624 GFLOPs, not 6624223.360 KFLOPs."""
    rows = module_rows(model_session())
    rows[0].flops = 6_624_223_360
    text = format_module_table(rows, with_flops=True)
    assert "Total GFLOPs" in text and "6.624" in text
    assert "KFLOPs" not in text and "6624223.360" not in text
