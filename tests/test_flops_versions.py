"""with_flops on every supported torch (2.4 to 2.15): torch.profiler's own counts, and
grouped-query attention, which torch 2.4/2.8's formulas reject.

Each test asks the installed torch what to expect (torch.profiler run in the same test,
or a feature check); none hard-codes a torch version.
"""

from __future__ import annotations

import warnings
from collections import Counter

import pytest
import torch
from torch import nn

import opscope
from opscope.analysis.flops import attention_backward_flops, attention_flops
from tests.synthetic import Op, TensorSpec, make_session


def workload():
    torch.manual_seed(0)
    a, b = torch.randn(4, 6), torch.randn(6, 3)
    a @ b
    torch.addmm(torch.randn(3), a, b)
    torch.bmm(torch.randn(2, 4, 6), torch.randn(2, 6, 3))
    torch.baddbmm(torch.randn(2, 4, 3), torch.randn(2, 4, 6), torch.randn(2, 6, 3))
    nn.functional.conv2d(torch.randn(1, 2, 6, 6), torch.randn(3, 2, 3, 3), stride=2,
                         padding=1)
    nn.functional.linear(torch.randn(5, 6), torch.randn(3, 6), torch.randn(3))
    torch.matmul(torch.randn(2, 3, 6), torch.randn(6, 5))
    (a + a, a * 3.0, a.add(1))
    conv = nn.Conv2d(2, 3, 3)
    conv(torch.randn(1, 2, 6, 6, requires_grad=True)).sum().backward()


def per_op(events, conv2d="aten::conv2d"):
    """(name, FLOPs) -> calls, the FLOPs of a conv2d being those of its subtree (opscope
    puts a conv2d's count on the _convolution inside it; torch on the conv2d).

    ``conv2d``: the op a conv2d call records as (the Python collector sees only the
    ``aten::convolution`` that conv2d dispatches).
    """
    def subtree(e):
        return (e.flops or 0) + sum(subtree(c) for c in e.cpu_children)

    counts = Counter()
    for e in events:
        if e.name == conv2d:
            counts[("aten::conv2d", subtree(e))] += 1
        else:
            counts[(e.name, e.flops or 0)] += 1
    return counts


def test_counts_equal_torch_profiler_for_the_ops_it_counts(collector_name):
    workload()
    with torch.profiler.profile(with_flops=True) as tp:
        workload()
    with opscope.profile(with_flops=True) as op:
        workload()
    expected = per_op(tp.events())
    counted_by_torch = {name for (name, flops) in expected if flops}
    assert {"aten::mm", "aten::conv2d", "aten::add", "aten::mul"} <= counted_by_torch
    got = per_op(op.events(), "aten::convolution" if collector_name == "python"
                 else "aten::conv2d")
    for name in sorted(counted_by_torch):
        assert {k: c for k, c in got.items() if k[0] == name} == \
            {k: c for k, c in expected.items() if k[0] == name}, name


def test_attention_formulas_by_hand():
    # b=3, 6 query heads over 2 key/value heads, s_q=5, s_k=9, d=4, d_v=7
    q, k, v = [3, 6, 5, 4], [3, 2, 9, 4], [3, 2, 9, 7]
    scores, output = 3 * 6 * 5 * 9 * 4, 3 * 6 * 5 * 9 * 7  # multiply-adds
    assert attention_flops(q, k, v) == 2 * (scores + output) == 17820
    # backward: scores again, grad of scores (over d_v), grad of v, grad of q, grad of k
    assert attention_backward_flops([3, 6, 5, 7], q, k, v) == \
        2 * (scores + output + output + scores + scores) == 42120
    with pytest.raises(ValueError, match="multiple"):
        attention_flops([3, 5, 5, 4], k, v)
    with pytest.raises(ValueError, match="do not fit"):
        attention_flops(q, [3, 2, 9, 4], [3, 2, 8, 7])
    assert attention_flops([3, 5, 4], [3, 9, 4], [3, 9, 7]) is None  # not [b, h, s, d]


# grouped-query SDPA (enable_gqa) came in torch 2.5: ask the installed op's schema
HAS_GQA = "enable_gqa" in str(torch.ops.aten.scaled_dot_product_attention.default._schema)


@pytest.mark.skipif(not HAS_GQA, reason="this torch's SDPA has no enable_gqa")
def test_grouped_query_attention_is_counted(collector_name):
    q = torch.randn(2, 4, 5, 8, requires_grad=True)
    kv = torch.randn(2, 2, 7, 8, requires_grad=True)

    def step():
        nn.functional.scaled_dot_product_attention(q, kv, kv, enable_gqa=True).sum().backward()

    step()
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # no "no FLOP count" warning
        with opscope.profile(with_flops=True) as prof:
            step()
    counted = {e.name: e.flops for e in prof.events() if e.flops}
    kernels = {n: f for n, f in counted.items() if "_scaled_dot_product_" in n}
    if kernels:  # a fused kernel ran (torch 2.13+ on CPU): the hand formulas
        forward = 2 * 2 * 4 * 5 * 7 * (8 + 8)
        assert sorted(kernels.values()) == sorted([forward, forward // 16 * 40])
    else:  # the math backend ran (torch 2.8 on CPU): its bmms carry the count
        assert counted.get("aten::bmm", 0) > 0


def test_rejected_shapes_warn_instead_of_a_silent_zero():
    ops = [Op("aten::mm", 0, 10, inputs=[TensorSpec((2, 3)), TensorSpec((4, 5))]),
           Op("aten::bmm", 20, 30, inputs=[TensorSpec((2, 2, 3)), TensorSpec((2, 3, 4))])]
    with pytest.warns(RuntimeWarning, match=r"no FLOP count for aten::mm: .*\[2, 3\]") as w:
        session = make_session(ops, options={"with_flops": True})
    assert len([x for x in w if "FLOP" in str(x.message)]) == 1
    assert "\n" not in str(w[0].message)
    assert session.flops.tolist() == [0, 2 * 2 * 2 * 3 * 4]
