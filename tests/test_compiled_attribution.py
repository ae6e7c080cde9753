"""Inside torch.compile'd graphs: kernels are ops, with their modules and source lines.

One two-block model is compiled once (Inductor on CPU, a temporary cache folder) and
profiled for one training step with ``with_modules`` and ``with_stack``; the tests
read that one profile. No Inductor flag is set by the test: ``import opscope`` did it.

On a torch whose Inductor lacks a hook that opscope needs (torch 2.4, 2.8: see COMPAT.md)
the tests of attribution skip, naming the hook, and those of the fallback run: the graphs
stay at graph level, opscope says so in one line, nothing breaks.
"""

from __future__ import annotations

import json
import os
import shutil
import sys

import pytest
import torch

import opscope
from opscope.collect.inductor_install import HOOKS, missing_hooks
from opscope.collect.inductor_sites import module_path, parse_sites, SITE_LINE_PREFIX
from compiled_process import Block
from subprocesses import run_in_group

CALL = "## Call CompiledFxGraph"


def _step(model, x):
    loss = model(x).sum()
    loss.backward()
    return loss


@pytest.fixture(scope="module")
def compiled_profile(tmp_path_factory):
    if shutil.which("g++") is None and shutil.which("c++") is None:
        pytest.skip("inductor on CPU needs a C++ compiler (g++), none found")
    patch = pytest.MonkeyPatch()
    cache = str(tmp_path_factory.mktemp("inductor"))
    patch.setenv("TORCHINDUCTOR_CACHE_DIR", cache)
    torch.manual_seed(0)
    model = torch.nn.Sequential(Block(), Block())
    compiled = torch.compile(model)
    x = torch.randn(8, 32)
    for _ in range(2):
        _step(compiled, x)
    with opscope.profile(with_modules=True, with_stack=True) as prof:
        loss = _step(compiled, x)
    yield prof, float(loss.detach()), model, x, cache
    torch._dynamo.reset()
    patch.undo()


@pytest.fixture
def attributed(compiled_profile):
    """The profile, where this torch's Inductor has every hook that attribution needs."""
    missing = missing_hooks()
    if missing:
        pytest.skip(f"torch {torch.__version__}'s Inductor lacks {', '.join(missing)}: its "
                    "graphs stay at graph level (test_a_torch_lacking_a_hook_... checks that)")
    return compiled_profile


def _in_calls(prof, prefix=CALL):
    """The events inside a compiled graph's call (a range named ``prefix...``)."""
    events = prof.events()
    out = []
    for e in events:
        up = e.cpu_parent
        while up is not None and not up.name.startswith(prefix):
            up = up.cpu_parent
        if up is not None:
            out.append(e)
    assert events
    return out


def test_each_generated_kernel_is_an_op_inside_its_graph_call(compiled_profile):
    """On every torch: kernel ranges are Inductor's own (``cpp.enable_kernel_profile``);
    where torch opens no call range, inside the autograd function that runs the graph."""
    prof = compiled_profile[0]
    kernels = [e for e in _in_calls(prof, "CompiledFunction" if missing_hooks() else CALL)
               if "cpp_fused" in e.name]
    names = {e.name for e in kernels}
    assert any("native_layer_norm_relu" in n for n in names)  # forward
    assert any("backward" in n for n in names)  # the backward graph's
    table = prof.key_averages().table(row_limit=-1)
    assert any(n[:40] in table for n in names)


def test_kernels_and_extern_ops_carry_the_inner_modules(attributed):
    prof = attributed[0]
    inside = _in_calls(prof)
    by_name = {}
    for e in inside:
        if e.name in ("aten::addmm", "aten::mm") or "cpp_fused" in e.name:
            by_name.setdefault(e.name, set()).add(e.module_hierarchy)
    assert {"Sequential.0.fc1", "Sequential.1.fc2"} <= by_name["aten::addmm"]
    assert {"Sequential.0.fc1", "Sequential.0.fc2"} <= by_name["aten::mm"]  # backward
    fused = set().union(*(v for k, v in by_name.items() if "cpp_fused" in k))
    assert {"Sequential.0", "Sequential.1"} <= fused


def test_module_table_has_the_compiled_models_modules_forward_and_backward(attributed):
    prof = attributed[0]
    rows = {row.key: row for row in prof.key_averages(group_by="module")}
    for name in ("0 (Block)", "1 (Block)", "0.fc1 (Linear)", "1.fc2 (Linear)"):
        assert name in rows, sorted(rows)
        assert rows[name].count == 1
    assert rows["0.fc1 (Linear)"].cpu_time_total > 0


def test_most_kernels_and_extern_ops_lie_in_modules_below_the_root(attributed):
    """Counted by ops, not time (no test asserts a duration): bench/ measures the time."""
    prof = attributed[0]
    ops = [e for e in _in_calls(prof)
           if "cpp_fused" in e.name or e.name in ("aten::addmm", "aten::mm")]
    below = [e for e in ops if "." in e.module_hierarchy]
    assert len(ops) >= 16 and len(below) / len(ops) >= 0.85, \
        [(e.name, e.module_hierarchy) for e in ops]


def test_kernel_stacks_are_the_models_source_lines(attributed):
    prof = attributed[0]
    kernels = [e for e in _in_calls(prof) if "cpp_fused" in e.name or e.name == "aten::mm"]
    assert kernels
    model_file = os.path.join(os.path.dirname(__file__), "compiled_process.py")
    with_source = [e for e in kernels if e.stack and e.stack[0].startswith(model_file)]
    assert len(with_source) / len(kernels) >= 0.9, [e.stack[:1] for e in kernels]
    assert all(e.stack[0].endswith(": forward") for e in with_source)


def test_results_equal_those_without_recording(compiled_profile):
    prof, loss, model, x, _ = compiled_profile
    compiled = torch.compile(model)
    assert float(compiled(x).sum()) == loss
    del prof


def test_site_notes_round_trip_and_module_paths():
    site = ("aten::mm", ((1, (("", "M"), ("a.0", "L"))),), ("f.py(1): g",))
    assert parse_sites(SITE_LINE_PREFIX + repr(site) + ")\n") == [site]
    assert parse_sites("x = 1\n") is None
    assert module_path("L['self'].layers[2]", "L['self']") == "layers.2"


def _second_process(mode: str, cache: str) -> dict:
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=cache)
    done = run_in_group([sys.executable, os.path.join(os.path.dirname(__file__),
                                                      "compiled_process.py"), mode],
                        timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_process_that_loads_the_graphs_from_the_fx_cache_attributes_them(attributed):
    seen = _second_process("warm", attributed[4])
    assert seen["cache_hits"] >= 2, seen  # forward and backward: no codegen in that process
    hierarchies = {h for _, h in seen["kernels"]}
    assert {"Sequential.0.fc1", "Sequential.1.fc2"} <= hierarchies, seen
    assert not seen["warnings"], seen["warnings"]


def test_a_model_compiled_before_opscope_is_graph_level_with_one_line(compiled_profile):
    seen = _second_process("late", compiled_profile[4])
    if missing_hooks():  # the one line is the missing hook's, said at import
        assert len(seen["warnings"]) == 1 and "lacks" in seen["warnings"][0], seen["warnings"]
    else:
        assert len(seen["warnings"]) == 2, seen["warnings"]  # one per graph: fwd, bwd
        assert all("import opscope before" in w for w in seen["warnings"])
    assert {h for _, h in seen["kernels"]} <= {"Sequential", ""}, seen


def test_a_torch_lacking_a_hook_says_so_once_and_stays_at_graph_level(compiled_profile):
    """Its CompiledFxGraph.__call__ opens no call range (torch 2.8's; on an older torch,
    whatever it lacks): one line naming what is missing, graphs at graph level."""
    seen = _second_process("no-range", compiled_profile[4])
    assert len(seen["warnings"]) == 1, seen["warnings"]
    line = seen["warnings"][0]
    assert f"torch {torch.__version__}'s Inductor lacks" in line and "\n" not in line, line
    assert "'## Call CompiledFxGraph' range" in line and "graph level" in line, line
    assert {h for _, h in seen["kernels"]} <= {"Sequential", ""}, seen
    assert any("cpp_fused" in name for name, _ in seen["kernels"]), seen  # still ops
    assert seen["frames"], seen  # Dynamo's compiles are kept all the same


# The schema is spelled out: torch 2.4's inference reads no string annotations (this file's
# ``from __future__ import annotations``).
@torch.library.custom_op("opscope_test::scale", mutates_args=(), schema="(Tensor x) -> Tensor")
def _scale(x: torch.Tensor) -> torch.Tensor:
    return x * 2.0


@_scale.register_fake
def _(x):
    return torch.empty_like(x)


class _Branchy(torch.nn.Module):
    """A custom op and a torch.cond: attribution may fail here; nothing else may."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 8)

    def forward(self, x):
        y = _scale(self.fc(x))
        return torch.cond(y.sum() > 0, lambda t: t.relu(), lambda t: t.tanh(), (y,))


def test_a_custom_op_and_a_cond_never_break_the_compile_or_the_run(compiled_profile):
    torch.manual_seed(0)
    model = _Branchy()
    x = torch.randn(4, 8)
    with torch.no_grad():  # the custom op has no autograd formula
        expected = model(x)
        compiled = torch.compile(model)
        compiled(x)
        with _any_warnings() as caught:
            with opscope.profile(with_modules=True, with_stack=True) as prof:
                got = compiled(x)
            names = [row.key for row in prof.key_averages()]
    assert torch.allclose(got, expected)
    ran = "Torch-Compiled Region" if HOOKS["call_range"] in missing_hooks() else CALL
    assert any(n.startswith(ran) for n in names), names  # the compiled code ran
    said = [str(w.message) for w in caught if "opscope" in str(w.message)]
    assert len(said) <= 1 and all("graph level" in s for s in said), said


def _any_warnings():
    import warnings

    class _Catch(warnings.catch_warnings):
        def __enter__(self):
            caught = super().__enter__()
            warnings.simplefilter("always")
            return caught

    return _Catch(record=True)


def test_diff_by_module_matches_an_eager_and_a_compiled_trace(attributed, tmp_path, capsys):
    from test_cli_table import run_cli

    prof, _, model, x, _ = attributed
    with opscope.profile(with_modules=True) as eager:
        _step(model, x)
    eager.export_chrome_trace(str(tmp_path / "eager.json"))
    prof.export_chrome_trace(str(tmp_path / "compiled.json"))
    status, out, err = run_cli(capsys, "diff", str(tmp_path / "eager.json"),
                               str(tmp_path / "compiled.json"), "--group-by", "module")
    assert status == 0, err
    lines = {line.split()[0]: line.split() for line in out.splitlines() if line.strip()}
    for module in ("0.fc1", "1.fc2", "0.ln"):
        cells = lines[module]
        assert cells[2] == "1" and cells[5] == "1", cells  # one call on each side
    status, _, err = run_cli(capsys, "diff", str(tmp_path / "eager.json"),
                             str(tmp_path / "compiled.json"), "--group-by", "module",
                             "-o", str(tmp_path / "d.html"))
    assert status == 0 and 'id="module-paths"' in (tmp_path / "d.html").read_text(), err


def test_table_by_graph_has_the_forward_and_backward_graph(attributed, tmp_path, capsys):
    from test_cli_table import run_cli

    attributed[0].export_chrome_trace(str(tmp_path / "compiled.json"))
    status, out, err = run_cli(capsys, "table", str(tmp_path / "compiled.json"),
                               "--group-by", "graph")
    assert status == 0, err
    rows = [line.split() for line in out.splitlines() if " forward " in line + " "
            or " backward " in line + " "]
    assert sorted(r[1] for r in rows) == ["backward", "forward"], out
    for row in rows:
        assert int(row[3]) == 1 and int(row[5]) >= 1 and row[6].endswith("%"), row


def test_graph_breaks_are_read_from_the_metadata_and_bounded():
    from opscope.analysis.build import build_session
    from opscope.analysis.compiled_graphs import graph_breaks
    from opscope.model.records import RawSession
    from opscope.model.torch_names import GRAPH_BREAKS_KEY

    def breaks(text):
        raw = RawSession.empty()
        raw.metadata[GRAPH_BREAKS_KEY] = text
        return graph_breaks(build_session(raw))

    assert breaks('{"print() call": 2}') == {"print() call": 2}
    assert breaks("[" * 100_000) == {} and breaks('"x"') == {} and breaks('{"a": "b"}') == {}


def _module_names(fused_modules):
    """``0.ln (LayerNorm) x10`` entries as (module name, node count) pairs."""
    return [(name, int(count)) for name, count in (m.rsplit(" x", 1) for m in fused_modules)]


def test_a_kernel_fused_from_two_modules_names_both_live_and_in_the_trace(attributed, tmp_path):
    prof = attributed[0]
    live = {(e.name, tuple(e.fused_modules)) for e in _in_calls(prof) if e.fused_modules}
    ln_relu = [m for name, m in live if "native_layer_norm_relu" in name]  # forward
    assert ln_relu, live
    for modules in ln_relu:
        names = [name for name, _ in _module_names(modules)]
        block = names[0].split(".")[0]
        assert set(names) == {f"{block}.ln (LayerNorm)", f"{block} (Block)"}, modules
        counts = [n for _, n in _module_names(modules)]
        assert counts == sorted(counts, reverse=True) and min(counts) >= 1, modules
    assert {m[0].split(".")[0] for m in ln_relu} == {"0", "1"}
    assert all(len(m) >= 2 for _, m in live)  # only kernels of several modules list them
    assert not any(e.fused_modules for e in prof.events() if not e.name.startswith("graph_")
                   and e.name not in ("aten::addmm", "aten::mm")), live
    path = str(tmp_path / "compiled.json")
    prof.export_chrome_trace(path)
    with open(path) as f:
        args = [e.get("args", {}) for e in json.load(f)["traceEvents"]]
    assert sum("Fused Modules" in a for a in args) == sum(
        1 for e in prof.events() if e.fused_modules)
    back = opscope.load(path)
    assert {(e.name, tuple(e.fused_modules)) for e in back.events() if e.fused_modules} == live
    calls = len([e for e in prof.events() if e.fused_modules])
    for table in (prof.module_table(), back.module_table()):
        note = table.strip().splitlines()[-1]
        assert note.startswith(f"Fused kernels: {calls} calls of ") and "majority" in note


def test_fused_modules_are_listed_kept_and_noted_without_a_compile(tmp_path):
    """A synthetic graph call (no compile): a kernel of 10 LayerNorm nodes and 1 node of
    its Block, then an extern addmm of one module."""
    from opscope.analysis.build import build_session
    from opscope.analysis.function_events import function_events
    from opscope.model.modules import ModuleInfo
    from opscope.model.records import (NO_INPUTS, SCOPE_FUNCTION, SCOPE_USER, RawSession,
                                       records_from_rows)

    kernel = "graph_0_cpp_fused_native_layer_norm_relu_0"
    call = f"{CALL} fabc ##"
    rows = [(0, 100_000, -1, 0, 0, 0, 1, NO_INPUTS, SCOPE_USER, 0, 0),
            (10_000, 90_000, -1, 1, 0, 0, 1, NO_INPUTS, SCOPE_USER, 0, 0),
            (20_000, 40_000, -1, 2, 0, 0, 1, NO_INPUTS, SCOPE_USER, 0, 0),
            (50_000, 70_000, -1, 3, 0, 0, 1, NO_INPUTS, SCOPE_FUNCTION, 0, 0)]
    ln = (("", "Net"), ("0", "Block"), ("0.ln", "LayerNorm"))
    sites = [(kernel, ((1, ln[:2]), (10, ln)), ()),
             ("aten::addmm", ((3, ln[:2] + (("0.fc2", "Linear"),)),), ())]
    raw = RawSession(records_from_rows(rows), [], [1], ["Net", call, kernel, "aten::addmm"],
                     0, 100_000, 0, modules={"Net": ModuleInfo.for_module("", "Net", "Net")},
                     compiled_sites={call: [sites]})
    session = build_session(raw, options={"with_modules": True})
    expected = ["0.ln (LayerNorm) x10", "0 (Block) x1"]  # most nodes first
    events = {e.name: e for e in function_events(session)}
    assert events[kernel].fused_modules == expected
    assert events[kernel].module_hierarchy == "Net.0.ln"  # the majority rule's module
    assert all(not e.fused_modules for name, e in events.items() if name != kernel)
    profile = opscope.load(build_and_export(session, tmp_path / "t.json"))
    with open(tmp_path / "t.json") as f:
        written = [e["args"]["Fused Modules"] for e in json.load(f)["traceEvents"]
                   if "Fused Modules" in e.get("args", {})]
    assert written == ["0.ln (LayerNorm) x10; 0 (Block) x1"]
    assert [e.fused_modules for e in profile.events() if e.fused_modules] == [expected]
    assert profile.module_table().splitlines()[-1].startswith(
        "Fused kernels: 1 call of 1 compiled kernel ran FX nodes of several modules")
    from opscope.report.modules import module_view

    assert module_view(session)["fused_note"].startswith("Fused kernels: 1 call of 1 ")
    assert "Fused kernels" not in opscope.load(build_and_export(
        build_session(RawSession(**{**raw.__dict__, "compiled_sites": None}),
                      options={"with_modules": True}), tmp_path / "plain.json")).module_table()


def build_and_export(session, path):
    from opscope.export.chrome_trace import write_chrome_trace

    return write_chrome_trace(session, str(path))
