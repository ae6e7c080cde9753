"""with_flops=True: per-op FLOPs from recorded shapes, checked against torch's own counters.

Oracles: ``torch.utils.flop_counter.FlopCounterMode`` for the matmul, convolution and
attention families (forward and backward), and torch.profiler's own ``with_flops`` for
elementwise add/mul.
"""

from __future__ import annotations

import json
from collections import Counter

import pytest
import torch
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode, flop_registry

import opscope
from opscope.analysis.flops import ATTENTION_KERNELS, flop_totals, op_flops
from opscope.model.records import RecordedInputs

aten = torch.ops.aten


def _raw(formula):
    def counted(*args, **kwargs):
        return formula(*args, **kwargs)
    counted._get_raw = True  # already shape-wrapped by torch's registry
    return counted


# FlopCounterMode of torch before 2.15 has no formula for the CPU attention kernel; with
# this mapping it counts it as it counts the GPU kernels, which is what opscope does
# (documented). Where torch has one (2.15+), the installed formula is kept.
TORCH_COUNTS_CPU_ATTENTION = aten._scaled_dot_product_flash_attention_for_cpu in flop_registry
CPU_ATTENTION = {} if TORCH_COUNTS_CPU_ATTENTION else {
    aten._scaled_dot_product_flash_attention_for_cpu:
        _raw(flop_registry[aten._scaled_dot_product_flash_attention]),
    aten._scaled_dot_product_flash_attention_for_cpu_backward:
        _raw(flop_registry[aten._scaled_dot_product_flash_attention_backward]),
}


def torch_flops(step, mapping=CPU_ATTENTION) -> int:
    with FlopCounterMode(display=False, custom_mapping=mapping) as counter:
        step()
    return counter.get_total_flops()


def opscope_totals(step, **options):
    with opscope.profile(with_flops=True, **options) as prof:
        step()
    return prof, flop_totals(prof.session.table, prof.session.flops)


def encoder_step_fn():
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(d_model=16, nhead=2, dim_feedforward=32, dropout=0.0,
                                       batch_first=True)
    opt = torch.optim.SGD(layer.parameters(), lr=0.01)
    x = torch.randn(2, 5, 16)

    def step():
        opt.zero_grad()
        layer(x).pow(2).mean().backward()
        opt.step()

    return step


class ConvNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1d = nn.Conv1d(3, 4, 3, padding=1)
        self.conv2d = nn.Conv2d(4, 6, 3, stride=2, padding=1, groups=2)
        self.deconv = nn.ConvTranspose2d(6, 4, 3, stride=2, output_padding=1)
        self.conv3d = nn.Conv3d(1, 2, (2, 3, 3), dilation=(1, 2, 1))
        self.fc = nn.Linear(2 * 3 * 4 * 8, 5)

    def forward(self, x):
        y = torch.relu(self.conv1d(x))                      # [2, 4, 64]
        y = torch.relu(self.conv2d(y.view(2, 4, 8, 8)))     # [2, 6, 4, 4]
        y = self.deconv(y)                                  # [2, 4, 10, 10]
        y = self.conv3d(y[:, :, :, :].reshape(2, 1, 4, 10, 10))  # [2, 2, 3, 6, 8]
        return self.fc(y.flatten(1)[:, :192])


def convnet_step_fn():
    torch.manual_seed(0)
    net = ConvNet()
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    x = torch.randn(2, 3, 64)  # needs no grad: the first conv computes no input gradient

    def step():
        opt.zero_grad()
        net(x).sum().backward()
        opt.step()

    return step


@pytest.mark.parametrize("make_step", [encoder_step_fn, convnet_step_fn],
                         ids=["transformer_encoder_layer", "conv_net"])
def test_forward_plus_backward_equals_flop_counter_mode(make_step, collector_name):
    step = make_step()
    step()
    expected = torch_flops(step)
    prof, totals = opscope_totals(step)
    assert totals.without_elementwise == expected
    assert totals.forward > 0 and totals.backward > 0
    # the per-event column, key_averages and FunctionEvents all carry the same sum
    assert int(prof.session.flops.sum()) == totals.total
    assert sum(r.flops for r in prof.key_averages()) == totals.total
    assert sum(e.flops or 0 for e in prof.events()) == totals.total


def test_the_documented_difference_is_cpu_attention_only():
    step = encoder_step_fn()
    step()
    plain = torch_flops(step, mapping={})
    prof, totals = opscope_totals(step)
    table = prof.session.table
    attention = sum(int(prof.session.flops[i]) for i in range(len(table))
                    if "scaled_dot_product" in table.name(i))
    assert attention > 0
    # the installed torch says whether its FlopCounterMode counts the CPU kernel (2.15+)
    missing = 0 if TORCH_COUNTS_CPU_ATTENTION else attention
    assert totals.without_elementwise == plain + missing


def test_each_flop_counted_once_on_the_innermost_op(native_only):
    layer = nn.Linear(16, 8)
    x = torch.randn(4, 16)
    with opscope.profile(with_flops=True) as prof:
        layer(x)
        torch.matmul(torch.randn(2, 3, 16), torch.randn(16, 5))
        nn.functional.conv2d(torch.randn(1, 2, 6, 6), torch.randn(3, 2, 3, 3))
    by_name = Counter()
    for e in prof.events():
        by_name[e.name] += e.flops or 0
    assert by_name["aten::addmm"] == 2 * 4 * 16 * 8 and by_name["aten::linear"] == 0
    assert by_name["aten::mm"] == 2 * 6 * 16 * 5 and by_name["aten::matmul"] == 0
    assert by_name["aten::_convolution"] == 2 * 1 * 3 * 2 * 9 * 16
    assert by_name["aten::conv2d"] == 0 and by_name["aten::convolution"] == 0


def test_math_attention_backend_counts_its_matmuls(collector_name):
    q, k, v = (torch.randn(2, 2, 5, 8, requires_grad=True) for _ in range(3))

    def step():
        with sdpa_kernel(SDPBackend.MATH):
            nn.functional.scaled_dot_product_attention(q, k, v).sum().backward()

    step()
    prof, totals = opscope_totals(step)
    assert totals.without_elementwise == torch_flops(step) > 0


def recorded(shapes, concrete=None):
    types = ["float" if s else "Scalar" for s in shapes]
    return RecordedInputs([list(s) for s in shapes], types, [[] for _ in shapes],
                          concrete or [""] * len(shapes))


def torch_accepts(formula, *shapes) -> bool:
    """Whether the installed torch's formula takes these shapes (2.4/2.8 assert on GQA)."""
    try:
        formula(*shapes)
    except AssertionError:
        return False
    return True


@pytest.mark.parametrize("kernel", ATTENTION_KERNELS)
@pytest.mark.parametrize("kv_heads", [4, 2], ids=["multi_head", "grouped_query"])
def test_every_attention_backend_counts_like_torch(kernel, kv_heads):
    q, kv = (2, 4, 6, 8), (2, kv_heads, 7, 8)
    forward = op_flops(f"aten::{kernel}", recorded([q, kv, kv]))
    backward = op_flops(f"aten::{kernel}_backward", recorded([q, q, kv, kv]))
    # by hand: 2 FLOPs per multiply-add, b*h_q*s_q*s_k products of length d, twice
    # forward (scores, output) and five times backward
    assert forward == 2 * 2 * 4 * 6 * 7 * (8 + 8)
    assert backward == 2 * 2 * 4 * 6 * 7 * (3 * 8 + 2 * 8)
    assert op_flops("aten::scaled_dot_product_attention", recorded([q, kv, kv])) == forward
    torch_forward = flop_registry[aten._scaled_dot_product_efficient_attention]
    torch_backward = flop_registry[aten._scaled_dot_product_flash_attention_backward]
    if torch_accepts(torch_forward, q, kv, kv):
        assert forward == torch_forward(q, kv, kv)
    else:  # only grouped-query shapes on torch 2.4/2.8, where opscope still counts
        assert kv_heads < 4
    if torch_accepts(torch_backward, q, q, kv, kv):
        assert backward == torch_backward(q, q, kv, kv)
    else:
        assert kv_heads < 4


def test_matmul_shapes_follow_torch_rules():
    cases = [((5,), (5,)), ((3, 5), (5,)), ((2, 3, 5), (5,)), ((5,), (5, 4)),
             ((5,), (2, 5, 4)), ((2, 1, 3, 5), (6, 5, 4)), ((3, 5), (2, 5, 4))]
    for a, b in cases:
        with FlopCounterMode(display=False) as counter:
            torch.matmul(torch.randn(a), torch.randn(b))
        # by a 1-D tensor torch runs dot/mv, which neither counter counts
        assert (op_flops("aten::matmul", recorded([a, b])) or 0) == \
            counter.get_total_flops(), (a, b)
    assert op_flops("aten::matmul", recorded([(3, 5), (4, 2)])) is None  # bad shapes


def test_elementwise_add_and_mul_match_torch_profiler(collector_name):
    def work():
        a, b = torch.ones(3, 4), torch.ones(4)
        (b + a, a * 2.0, a.add(1), a * a, a.add_(1), a.mul_(2))

    work()
    with torch.profiler.profile(with_flops=True) as tp:
        work()
    with opscope.profile(with_flops=True) as op:
        work()

    def pairs(events):
        return Counter((e.name, e.flops) for e in events
                       if e.name in ("aten::add", "aten::mul", "aten::add_", "aten::mul_"))

    expected = pairs(tp.events())
    assert expected[("aten::add", 4)] == 1 and expected[("aten::mul", 12)] == 2
    got = Counter({(n, f or 0): c for (n, f), c in pairs(op.events()).items()})
    assert got == Counter({(n, f or 0): c for (n, f), c in expected.items()})


def test_table_scales_flops_and_shows_flop_rate():
    a, b = torch.randn(64, 64), torch.randn(64, 64)
    with opscope.profile(with_flops=True) as prof:
        a @ b
        a + b
    text = prof.key_averages().table(sort_by="cpu_time_total")
    header = text.splitlines()[1]
    # smallest non-zero count: the add's 4096 -> KFLOPs, as torch picks the unit
    assert header.rstrip().endswith("Total KFLOPs") and "FLOP/s" in header
    mm_line = next(line for line in text.splitlines() if line.strip().startswith("aten::mm"))
    assert mm_line.split()[-1] == f"{2 * 64 ** 3 / 1000:.3f}"


def test_shapes_are_recorded_for_flops_without_record_shapes(tmp_path):
    with opscope.profile(with_flops=True) as prof:
        torch.randn(4, 6) @ torch.randn(6, 2)
    mm = next(e for e in prof.events() if e.name == "aten::mm")
    assert mm.input_shapes == [[4, 6], [6, 2]] and mm.flops == 96
    path = tmp_path / "trace.json"
    prof.export_chrome_trace(str(path))
    events = json.loads(path.read_text())["traceEvents"]
    mm_args = next(e["args"] for e in events if e["name"] == "aten::mm")
    assert mm_args["flops"] == 96 and mm_args["Input Dims"] == [[4, 6], [6, 2]]
    assert all("flops" not in e.get("args", {}) for e in events if e["name"] == "aten::randn")


def test_unknown_shapes_give_no_count():
    assert op_flops("aten::mm", None) is None
    assert op_flops("aten::mm", recorded([(2, 3), (4, 5)])) is None
    padding_same = RecordedInputs([[1, 2, 5, 5], [3, 2, 3, 3], [], [], [], [], []],
                                  ["float", "float", "", "ScalarList", "String",
                                   "ScalarList", "Scalar"], [[]] * 7,
                                  ["", "", "", "[1, 1]", "", "[1, 1]", "1"])
    assert op_flops("aten::conv2d", padding_same) is None
