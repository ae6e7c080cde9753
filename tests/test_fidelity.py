"""Fidelity: on the same workload, opscope (native) and torch.profiler agree on
op names and call counts in key_averages()."""

from __future__ import annotations

from collections import Counter

import pytest
import torch

import opscope
from workloads import mlp_step_fn, transformer_step_fn


def counts_torch(step):
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        step()
    return Counter({row.key: row.count for row in prof.key_averages()})


def counts_opscope(step, **kwargs):
    with opscope.profile(**kwargs) as prof:
        step()
    return Counter({row.key: row.count for row in prof.key_averages()})


@pytest.mark.parametrize("make_step", [mlp_step_fn, transformer_step_fn],
                         ids=["mlp", "transformer"])
def test_names_and_counts_match_torch_profiler(make_step, native_only):
    step = make_step()
    step()  # warm up: lazy init, optimizer state
    expected = counts_torch(step)
    got = counts_opscope(step)
    assert got == expected
    aten = [k for k in got if k.startswith("aten::")]
    assert len(aten) > 10
    assert any(k.startswith("autograd::engine::evaluate_function: ") for k in got)
    assert any(k.startswith("Optimizer.step#") for k in got)


def test_counts_match_with_record_shapes(native_only):
    step = mlp_step_fn()
    step()
    with torch.profiler.profile(record_shapes=True) as tp:
        step()
    with opscope.profile(record_shapes=True) as op:
        step()

    def by_shape(prof):
        return Counter({(r.key, str(r.input_shapes)): r.count
                        for r in prof.key_averages(group_by_input_shape=True)})

    assert by_shape(op) == by_shape(tp)


def test_nesting_matches_torch_profiler(native_only):
    """Each op's parent name equals torch's for the same op occurrence."""
    step = mlp_step_fn()
    step()
    with torch.profiler.profile() as tp:
        step()
    with opscope.profile() as op:
        step()

    def parent_pairs(events):
        return Counter((e.name, e.cpu_parent.name if e.cpu_parent is not None else None)
                       for e in events)

    assert parent_pairs(op.events()) == parent_pairs(tp.events())
