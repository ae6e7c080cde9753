"""Dynamo's own time per compiled frame, the report's Compiled view and the diff page's modules.

One small model with a graph break (two Dynamo frames: ``forward`` and the function that
resumes it) is compiled once with Inductor in a temporary cache folder, and recompiled once
(a second value of its int argument); one window records two training steps with
``with_modules`` and ``with_stack``, and an eager window records the same model. The tests
read those windows: counts, names and nesting, never a duration. The guard, wrapper and
compile arithmetic is checked on a synthetic session with fixed times. (The compiled model
of tests/test_compiled_attribution.py has no graph break and no recompile: this file needs
its own, and shares it between its tests.)
"""

from __future__ import annotations

import inspect
import json
import os
import shutil

import pytest
import torch

import opscope
from opscope.analysis.compiled_frames import frame_rows
from opscope.collect.inductor_install import HOOKS, missing_hooks
from opscope.analysis.compiled_graphs import graph_rows
from opscope.model.torch_names import COMPILED_FRAMES_KEY
from opscope.report.data import report_data
from synthetic import SCOPE_BACKWARD_FUNCTION, SCOPE_USER, Op, make_session
from test_cli_table import run_cli
from test_report_browser import VIEWS, ReportPage, artifacts, browser  # noqa: F401 (fixtures)


class _Broken(torch.nn.Module):
    """Two graphs per step: Dynamo breaks ``forward`` at the marked line."""

    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(16, 16)
        self.fc2 = torch.nn.Linear(16, 16)

    def forward(self, x, k: int):
        y = torch.relu(self.fc1(x)) * k
        torch._dynamo.graph_break()  # the break
        return self.fc2(y)


BREAK_LINE = next(n for n, line in enumerate(inspect.getsourcelines(_Broken)[0],
                                             inspect.getsourcelines(_Broken)[1])
                  if "# the break" in line)


def _step(model, x, k):
    model(x, k).sum().backward()


@pytest.fixture(scope="module")
def windows(tmp_path_factory):
    if shutil.which("g++") is None and shutil.which("c++") is None:
        pytest.skip("inductor on CPU needs a C++ compiler (g++), none found")
    patch = pytest.MonkeyPatch()
    patch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path_factory.mktemp("inductor")))
    folder = tmp_path_factory.mktemp("compiled_report")
    torch.manual_seed(0)
    model = _Broken()
    compiled = torch.compile(model)
    x = torch.randn(4, 16)
    for k in (1, 1, 2, 2):  # k == 2 recompiles forward (its int is guarded on)
        _step(compiled, x, k)
    with opscope.profile(with_modules=True, with_stack=True) as prof:
        _step(compiled, x, 1)
        _step(compiled, x, 2)
    with opscope.profile(with_modules=True) as eager:
        _step(model, x, 1)
    prof.export_chrome_trace(str(folder / "compiled.json"))
    eager.export_chrome_trace(str(folder / "eager.json"))
    yield prof.session, eager.session, folder
    torch._dynamo.reset()
    patch.undo()


def _skip_without(*hooks):
    """Skip where this torch's Inductor lacks one of ``hooks`` (keys of HOOKS); its Dynamo
    frames are still read (torch 2.8: no call range, so no graph rows)."""
    missing = [HOOKS[h] for h in hooks if HOOKS[h] in missing_hooks()]
    if missing:
        pytest.skip(f"torch {torch.__version__}'s Inductor lacks {', '.join(missing)}")


def _graph_calls_recorded():
    return HOOKS["call_range"] not in missing_hooks()


def _frames_told_apart(session):
    """False where Dynamo's ``Torch-Compiled Region`` ranges name no compile id (torch 2.4):
    then all its frames are one row."""
    return [f.frame for f in frame_rows(session)] != [""]


def _skip_unless_frames_told_apart(session):
    if not _frames_told_apart(session):
        pytest.skip(f"torch {torch.__version__}'s Torch-Compiled Region ranges name no "
                    "compile id: Dynamo's frames are not told apart")


def _frames_by_name(session):
    return {f.code.split(" (")[0]: f for f in frame_rows(session)}


def test_each_dynamo_frame_has_its_runs_guards_graphs_and_code(windows):
    _skip_unless_frames_told_apart(windows[0])
    frames = _frames_by_name(windows[0])
    forward = frames["forward"]
    resume = frames[f"torch_dynamo_resume_in_forward_at_{BREAK_LINE}"]
    assert forward.code == f"forward ({__file__}:{inspect.getsourcelines(_Broken.forward)[1]})"
    for frame in (forward, resume):
        assert frame.calls == 2, frame  # one run per step
        assert frame.guard_calls == 2, frame  # one cache lookup before each run
        # its forward graph and its backward graph, where torch opens their call ranges
        assert frame.graphs == (2 if _graph_calls_recorded() else 0), frame
    assert len(forward.compile_ids) == 1 and forward.compile_ids[0].endswith("/1"), forward
    assert forward.compiles == 2 and forward.recompiles == 1
    assert any("k" in reason for reason in forward.recompile_reasons), forward
    assert resume.compiles == 1 and resume.recompile_reasons == []
    assert forward.break_lines == [f"{__file__}:{BREAK_LINE}"]
    assert any("graph_break()" in reason for reason in forward.break_reasons), forward


def test_dynamo_compiles_none_of_opscopes_module_hooks(windows):
    """After the graph break the eager module calls run under Dynamo's frame callback: it
    compiled opscope's hooks (and what they call) as frames with no graph, each paying a
    compile and then a cache lookup per call."""
    kept = json.loads(windows[0].metadata[COMPILED_FRAMES_KEY])
    package = os.path.dirname(opscope.__file__)
    assert kept and not [e for e in kept.values() if (e["file"] or "").startswith(package)]
    if _frames_told_apart(windows[0]):
        assert {f.code.split(" (")[0] for f in frame_rows(windows[0])} == {
            "forward", f"torch_dynamo_resume_in_forward_at_{BREAK_LINE}"}


def test_modules_found_in_graphs_have_the_parameter_counts_eager_mode_gives(windows):
    """The hooks never see the inner modules' calls (they run inside the graphs): their
    parameter counts come from the compiled module, equal to the eager recording's."""
    _skip_without(*HOOKS)
    compiled, eager = windows[0].modules, windows[1].modules
    for name in ("fc1 (Linear)", "fc2 (Linear)"):
        assert compiled[name].parameters == eager[name].parameters == 16 * 16 + 16, name


def test_backward_graphs_run_for_their_forwards_frame(windows):
    _skip_without("call_range")
    frames = _frames_by_name(windows[0])
    graphs = graph_rows(windows[0])
    assert sorted(g.direction for g in graphs) == ["backward"] * 2 + ["forward"] * 2
    for name in ("forward", f"torch_dynamo_resume_in_forward_at_{BREAK_LINE}"):
        cid = frames[name].compile_ids[0]
        assert sorted(g.direction for g in graphs if g.frame == cid) == ["backward", "forward"]


def test_the_recording_keeps_dynamos_compiles_in_its_metadata(windows):
    kept = json.loads(windows[0].metadata[COMPILED_FRAMES_KEY])
    names = {entry["name"] for entry in kept.values()}
    assert {"forward", f"torch_dynamo_resume_in_forward_at_{BREAK_LINE}"} <= names
    assert all(set(entry) == {"name", "file", "line", "guards", "recompile_reason",
                              "break_reasons"} for entry in kept.values())


def test_the_compiles_kept_are_those_since_dynamos_last_reset(monkeypatch):
    """torch._dynamo.reset() numbers frames from 0 again; an earlier numbering's frame 0
    named the window's frame 0 (a test's fixture reset Dynamo after a torch.cond)."""
    from types import SimpleNamespace

    import torch._dynamo.utils as dynamo_utils
    from opscope.collect.inductor_sites import compiled_frames_so_far

    def metric(cid, name):
        return SimpleNamespace(compile_id=cid, co_name=name, co_filename="m.py",
                               co_firstlineno=1, guard_count=1)

    metrics = [metric("0/0", "old"), metric("0/1", "old"), metric("1/0", "cond"),
               metric("0/0", "forward"), metric("1/0", "resume")]
    monkeypatch.setattr(dynamo_utils, "get_compilation_metrics", lambda: metrics)
    kept = compiled_frames_so_far()
    assert {cid: entry["name"] for cid, entry in kept.items()} == {"0/0": "forward",
                                                                  "1/0": "resume"}


def _synthetic():
    """Frame 0 (compile 0/1) runs a forward graph, its backward runs later; frame 1 (a
    resume function) is compiled inside the window; times in us on a fake clock."""
    ops = [
        Op("TorchDynamo Cache Lookup", 0, 10, scope=SCOPE_USER),
        Op("Torch-Compiled Region: 0/1", 10, 100, scope=SCOPE_USER),
        Op("Pregraph bytecode", 11, 13, scope=SCOPE_USER),
        Op("AOTDispatcher Runtime Wrapper Prologue", 13, 15, scope=SCOPE_USER),
        Op("CompiledFunction", 20, 80, seq=7),
        Op("## Call CompiledFxGraph ffwd ##", 30, 70, scope=SCOPE_USER),
        Op("graph_0_cpp_fused_add_0", 40, 50, scope=SCOPE_USER),
        Op("TorchDynamo Cache Lookup", 82, 85, scope=SCOPE_USER),
        Op("dynamo", 85, 90, scope=SCOPE_USER),
        Op("dynamo_data: compile_id=1/0", 86, 87, scope=SCOPE_USER),
        Op("Torch-Compiled Region: 1/0", 91, 95, scope=SCOPE_USER),
        Op("TorchDynamo Cache Lookup", 150, 155, scope=SCOPE_USER),  # ran eager: no region
        Op("autograd::engine::evaluate_function: CompiledFunctionBackward", 200, 300),
        Op("CompiledFunctionBackward", 205, 295, scope=SCOPE_BACKWARD_FUNCTION, seq=7,
           fwd_thread=1),
        Op("## Call CompiledFxGraph fbwd ##", 220, 260, scope=SCOPE_USER),
    ]
    kept = {"0/0": {"name": "forward", "file": "m.py", "line": 9,
                    "break_reasons": ["Call to graph_break()\n  Explanation: ..."]},
            "0/1": {"name": "forward", "file": "m.py", "line": 9,
                    "recompile_reason": "0/0: k == 1"},
            "1/0": {"name": "torch_dynamo_resume_in_forward_at_12", "file": "m.py", "line": 12}}
    return make_session(ops, metadata={COMPILED_FRAMES_KEY: json.dumps(kept)})


def test_guards_wrappers_and_compiles_add_up_on_fixed_times():
    frames = {f.frame: f for f in frame_rows(_synthetic())}
    zero, one = frames["0"], frames["1"]
    assert (zero.calls, zero.time_us, zero.backward_us, zero.graph_us, zero.graphs) == \
        (1, 90.0, 90.0, 80.0, 2)
    assert (zero.guard_calls, zero.guard_us) == (1, 10.0)
    # CompiledFunction 60 - its graph 40, CompiledFunctionBackward 90 - 40, two ranges of 2
    assert zero.wrapper_us == 74.0
    assert (zero.compiles, zero.recompile_reasons) == (2, ["0/0: k == 1"])
    assert (zero.break_lines, zero.break_reasons) == (["m.py:12"], ["Call to graph_break()"])
    assert zero.code == "forward (m.py:9)"
    assert (one.calls, one.guard_calls, one.guard_us, one.compile_us, one.compiles) == \
        (1, 1, 3.0, 5.0, 1)
    assert one.code == "torch_dynamo_resume_in_forward_at_12 (m.py:12)"


def test_without_metadata_the_window_gives_the_compiles_and_the_callers_line():
    session = _synthetic()
    session.metadata.clear()
    frames = {f.frame: f for f in frame_rows(session)}
    assert frames["0"].compiles == 2  # compile 0/1 ran: the frame's second compile
    assert frames["0"].break_lines == [] and frames["0"].code == ""


def test_the_report_has_a_compiled_view_only_for_a_compiled_recording(windows):
    data = report_data(windows[0])["compiled"]
    assert [f["frame"] for f in data["frames"]] == [f.frame for f in frame_rows(windows[0])]
    assert {g["key"] for g in data["graphs"]} == {g.key for g in graph_rows(windows[0])}
    assert data["totals"]["guard_calls"] == sum(f["guard_calls"] for f in data["frames"]) >= 4
    assert report_data(windows[1])["compiled"] is None
    if _frames_told_apart(windows[0]):  # recompiles and breaks are counted per frame
        assert data["totals"]["recompiles"] >= 1
        assert any("graph break at" in note for f in data["frames"] for note in f["notes"])


def test_the_compiled_view_renders_in_a_browser(windows, browser, artifacts,  # noqa: F811
                                                tmp_path):
    from opscope.report import write_report

    compiled, eager = tmp_path / "compiled.html", tmp_path / "eager.html"
    write_report(windows[0], compiled)
    write_report(windows[1], eager)
    page = ReportPage(browser, compiled, artifacts, "compiled")
    for view in VIEWS + ("compiled",):
        page.show(view)
    frames = page.rows("#compiled-frames tbody tr", [0, 1, 2, 6])
    expected = frame_rows(windows[0])
    assert [(f, code, int(calls), int(guards)) for f, code, calls, guards in frames] == \
        [(f.frame, f.code, f.calls, f.guard_calls) for f in expected]
    assert len(page.rows("#compiled-graphs tbody tr", [0])) == (
        4 if _graph_calls_recorded() else 0)
    assert "opscope.dynamo.Profiler" in page.js(
        "document.getElementById('compiled-see-also').textContent")
    page.check_clean()
    page = ReportPage(browser, eager, artifacts, "eager")
    assert page.js("document.querySelector('#tabs button[data-view=\"compiled\"]')") is None
    for view in VIEWS:
        page.show(view)
    page.check_clean()


def test_table_by_graph_prints_the_frames_and_the_break(windows, capsys):
    _skip_unless_frames_told_apart(windows[0])
    status, out, err = run_cli(capsys, "table", str(windows[2] / "compiled.json"),
                               "--group-by", "graph")
    assert status == 0, err
    assert "Dynamo frames" in out
    row = next(line.split() for line in out.splitlines() if line.rstrip().endswith(
        f"forward ({__file__}:{inspect.getsourcelines(_Broken.forward)[1]})"))
    assert row[1] == "2" and row[5] == "2" and row[9] == "2", row  # calls, guards, compiles
    assert f"graph break at {__file__}:{BREAK_LINE}: Call to `torch._dynamo.graph_break()`" \
        in out


def _module_rows_of_page(path):
    import re

    text = path.read_text()
    table = text[text.index('id="module-paths"'):]
    table = table[:table.index("</table>")]
    return re.findall(r'<td class="name"[^>]*>([^<]*)</td><td data-v="(\d+)">', table)


def test_the_diff_page_has_the_modules_by_call_path(windows, tmp_path, capsys):
    folder = windows[2]
    page = tmp_path / "diff.html"
    status, out, err = run_cli(capsys, "diff", str(folder / "eager.json"),
                               str(folder / "compiled.json"), "-o", str(page))
    assert status == 0, err
    assert _module_rows_of_page(page) == [("_Broken", "1"), ("fc1 (Linear)", "1"),
                                          ("fc2 (Linear)", "1")]
    by_module = tmp_path / "by_module.html"
    status, out, err = run_cli(capsys, "diff", str(folder / "eager.json"),
                               str(folder / "compiled.json"), "--group-by", "module",
                               "-o", str(by_module))
    assert status == 0, err
    assert "Modules by call path" in out and "Ops, by absolute" not in out
    assert _module_rows_of_page(by_module) == _module_rows_of_page(page)


def test_diff_by_module_reads_a_store(windows, tmp_path, capsys):
    pytest.importorskip("duckdb")
    pytest.importorskip("pyarrow")
    from opscope.analysis.build import load_session
    from opscope.store.write import StoreWriter

    folder = windows[2]
    store = tmp_path / "compiled.store"
    with StoreWriter(str(store)) as writer:
        for _ in range(2):
            writer.write_window(load_session(str(folder / "compiled.json")), rank=0)
    args = ("diff", str(folder / "eager.json"), "--group-by", "module")
    status, expected, err = run_cli(capsys, *args[:2], str(folder / "compiled.json"), *args[2:])
    assert status == 0, err
    status, out, err = run_cli(capsys, *args[:2], str(store), *args[2:])
    assert status == 0, err
    assert out.splitlines()[2:] == expected.splitlines()[2:]  # below the two names
    status, out, err = run_cli(capsys, *args[:2], str(store), *args[2:], "--window", "all")
    assert status == 2 and out == "" and len(err.splitlines()) == 1, err
    assert "expected one window" in err
