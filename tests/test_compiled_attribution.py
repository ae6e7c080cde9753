"""Inside torch.compile'd graphs: kernels are ops, with their modules and source lines.

One two-block model is compiled once (Inductor on CPU, a temporary cache folder) and
profiled for one training step with ``with_modules`` and ``with_stack``; the tests
read that one profile. No Inductor flag is set by the test: ``import opscope`` did it.
"""

from __future__ import annotations

import shutil

import pytest
import torch

import opscope
from opscope.collect.inductor_sites import module_path, parse_sites, SITE_LINE_PREFIX

CALL = "## Call CompiledFxGraph"


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(32, 64)
        self.ln = torch.nn.LayerNorm(64)
        self.fc2 = torch.nn.Linear(64, 32)

    def forward(self, x):
        return x + self.fc2(torch.relu(self.ln(self.fc1(x))))  # BLOCK LINE


def _step(model, x):
    loss = model(x).sum()
    loss.backward()
    return loss


@pytest.fixture(scope="module")
def compiled_profile(tmp_path_factory):
    if shutil.which("g++") is None and shutil.which("c++") is None:
        pytest.skip("inductor on CPU needs a C++ compiler (g++), none found")
    patch = pytest.MonkeyPatch()
    patch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path_factory.mktemp("inductor")))
    torch.manual_seed(0)
    model = torch.nn.Sequential(Block(), Block())
    compiled = torch.compile(model)
    x = torch.randn(8, 32)
    for _ in range(2):
        _step(compiled, x)
    with opscope.profile(with_modules=True, with_stack=True) as prof:
        loss = _step(compiled, x)
    yield prof, float(loss), model, x
    torch._dynamo.reset()
    patch.undo()


def _in_calls(prof):
    """The events inside a compiled graph's call, with the call's direction."""
    events = prof.events()
    by_id = {id(e): e for e in events}
    out = []
    for e in events:
        up = e.cpu_parent
        while up is not None and not up.name.startswith(CALL):
            up = up.cpu_parent
        if up is not None:
            out.append(e)
    assert by_id
    return out


def test_each_generated_kernel_is_an_op_inside_its_graph_call(compiled_profile):
    prof = compiled_profile[0]
    kernels = [e for e in _in_calls(prof) if "cpp_fused" in e.name]
    names = {e.name for e in kernels}
    assert any("native_layer_norm_relu" in n for n in names)  # forward
    assert any("backward" in n for n in names)  # the backward graph's
    table = prof.key_averages().table(row_limit=-1)
    assert any(n[:40] in table for n in names)


def test_kernels_and_extern_ops_carry_the_inner_modules(compiled_profile):
    prof = compiled_profile[0]
    inside = _in_calls(prof)
    by_name = {}
    for e in inside:
        if e.name in ("aten::addmm", "aten::mm") or "cpp_fused" in e.name:
            by_name.setdefault(e.name, set()).add(e.module_hierarchy)
    assert {"Sequential.0.fc1", "Sequential.1.fc2"} <= by_name["aten::addmm"]
    assert {"Sequential.0.fc1", "Sequential.0.fc2"} <= by_name["aten::mm"]  # backward
    fused = set().union(*(v for k, v in by_name.items() if "cpp_fused" in k))
    assert {"Sequential.0", "Sequential.1"} <= fused


def test_module_table_has_the_compiled_models_modules_forward_and_backward(compiled_profile):
    prof = compiled_profile[0]
    rows = {row.key: row for row in prof.key_averages(group_by="module")}
    for name in ("0 (Block)", "1 (Block)", "0.fc1 (Linear)", "1.fc2 (Linear)"):
        assert name in rows, sorted(rows)
        assert rows[name].count == 1
    assert rows["0.fc1 (Linear)"].cpu_time_total > 0


def test_most_kernels_and_extern_ops_lie_in_modules_below_the_root(compiled_profile):
    """Counted by ops, not time (no test asserts a duration): bench/ measures the time."""
    prof = compiled_profile[0]
    ops = [e for e in _in_calls(prof)
           if "cpp_fused" in e.name or e.name in ("aten::addmm", "aten::mm")]
    below = [e for e in ops if "." in e.module_hierarchy]
    assert len(ops) >= 16 and len(below) / len(ops) >= 0.85, \
        [(e.name, e.module_hierarchy) for e in ops]


def test_kernel_stacks_are_the_models_source_lines(compiled_profile):
    prof = compiled_profile[0]
    kernels = [e for e in _in_calls(prof) if "cpp_fused" in e.name or e.name == "aten::mm"]
    assert kernels
    with_source = [e for e in kernels if e.stack and __file__ in e.stack[0]]
    assert len(with_source) / len(kernels) >= 0.9, [e.stack[:1] for e in kernels]
    assert all(e.stack[0].endswith(": forward") for e in with_source)


def test_results_equal_those_without_recording(compiled_profile):
    prof, loss, model, x = compiled_profile
    compiled = torch.compile(model)
    assert float(compiled(x).sum()) == loss
    del prof


def test_site_notes_round_trip_and_module_paths():
    line = SITE_LINE_PREFIX + repr(("aten::mm", ((("", "M"), ("a.0", "L")),), ("f.py(1): g",))) + ")"
    assert parse_sites(line + "\n") == [("aten::mm", ((("", "M"), ("a.0", "L")),), ("f.py(1): g",))]
    assert parse_sites("x = 1\n") is None
    assert module_path("L['self'].layers[2]", "L['self']") == "layers.2"
