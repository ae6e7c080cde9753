"""opscope.dynamo: Dynamo coverage on real compiled models, metrics, report, MISSING lines.

torch.compile is slow here, so each model is compiled once in a module fixture
that profiles it every way the tests need (opscope native and Python
collectors, torch.profiler), with ``torch._dynamo.reset()`` between models.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch
import torch._dynamo.profiler as torch_dynamo_profiler

import opscope
from opscope.dynamo import (CaptureMasks, ProfileMetrics, ProfileResult, Profiler,
                            capture_result, find_captured, format_report,
                            fx_insert_profiling, missing_line, uncaptured_ops)
from opscope.dynamo import report as dynamo_report
from opscope.dynamo.report import missing_lines
from synthetic import SCOPE_BACKWARD_FUNCTION, SCOPE_USER, Op, make_session

# Ranges Dynamo 2.13 opens around compiled code. torch's own Dynamo profiler
# counts them as ops (so on torch 2.13 it reports 0 captured ops); the
# comparison below drops them from torch's events first.
DYNAMO_BOOKKEEPING = ("TorchDynamo Cache Lookup", "Torch-Compiled Region", "Pregraph bytecode")

double_eagerly = torch._dynamo.disable(lambda t: t * 2)


class TinyNet(torch.nn.Module):
    """Linear -> relu -> [graph break] -> Linear -> sum."""

    def __init__(self, graph_break: str = ""):
        super().__init__()
        self.first = torch.nn.Linear(8, 8)
        self.second = torch.nn.Linear(8, 4)
        self.graph_break = graph_break

    def forward(self, x):
        x = torch.relu(self.first(x))
        if self.graph_break == "item":
            if x.sum().item() > -1e9:  # always true; .item() breaks the graph
                x = x * 2
        elif self.graph_break == "disable":
            x = double_eagerly(x)  # runs eagerly, between two graphs
        elif self.graph_break == "print":
            print("", end="")
        return self.second(x).sum()


def profile_ours(compiled, x, collector, train=None):
    old = os.environ.get("OPSCOPE_COLLECTOR")
    os.environ["OPSCOPE_COLLECTOR"] = collector
    try:
        profiler = Profiler(with_stack=True)
        with profiler.prof:
            out = compiled(x)
            if train is not None:
                train(out)
        result = profiler.results()
        return profiler, result
    finally:
        if old is None:
            os.environ.pop("OPSCOPE_COLLECTOR", None)
        else:
            os.environ["OPSCOPE_COLLECTOR"] = old


def profile_torch(compiled, x):
    """torch's own Dynamo profiler on the same compiled model, bookkeeping ranges dropped."""
    profiler = torch_dynamo_profiler.Profiler()
    with profiler.prof:
        compiled(x)
    events = [e for e in profiler.prof.events() if not e.name.startswith(DYNAMO_BOOKKEEPING)]
    profiler.prof.events = lambda: events
    return profiler.results()


@pytest.fixture(scope="module")
def runs():
    """Per model: compiled once, then profiled by opscope (both collectors) and torch."""
    if not opscope.kineto_available():
        pytest.skip("opscope's native collector is not available")
    torch.manual_seed(0)
    x = torch.randn(2, 8)
    out = {}
    for kind in ("none", "item", "disable", "print"):
        torch._dynamo.reset()
        Profiler.unique_graphs = 0
        model = TinyNet(kind)
        compiled = torch.compile(model, backend=fx_insert_profiling)
        eager = model(x)
        assert torch.allclose(compiled(x), eager)
        native, native_result = profile_ours(compiled, x, "native")
        python, python_result = profile_ours(compiled, x, "python")
        out[kind] = {
            "native": (native, native_result),
            "python": (python, python_result),
            "torch": profile_torch(compiled, x),
        }
        if kind == "item":
            optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

            def train(loss):
                loss.backward()
                optimizer.step()
                optimizer.zero_grad()

            out["train"] = {"native": profile_ours(compiled, x, "native", train)}
    torch._dynamo.reset()
    Profiler.unique_graphs = 0
    return out


# -- real compiled models ------------------------------------------------------------

# (unique graphs, graph calls, captured ops, total ops) under the native collector:
# the graphs hold linear, relu (and sum for "item"), then (mul,) linear, sum.
NATIVE_COUNTS = {
    "none": (1, 1, 4, 4),
    "item": (2, 2, 6, 7),      # aten::item runs between the graphs
    "disable": (2, 2, 4, 5),   # aten::mul runs between the graphs
    "print": (2, 2, 4, 4),     # the break runs no op: nothing is missed
}


@pytest.mark.parametrize("kind", sorted(NATIVE_COUNTS))
def test_native_counts_are_exact(runs, kind):
    _, result = runs[kind]["native"]
    assert (result.unique_graphs, result.captured.graphs, result.captured.operators,
            result.total.operators) == NATIVE_COUNTS[kind]
    assert result.captured.fusions == result.captured.operators - result.captured.graphs
    assert result.total.fusions == result.total.operators - 1
    assert result.tocsv()[:4] == list(NATIVE_COUNTS[kind])


def test_captured_share_drops_with_a_graph_break(runs):
    full = runs["none"]["native"][1].percent()
    assert (full.operators, full.microseconds) == (1.0, 1.0)
    for kind in ("item", "disable"):
        for collector in ("native", "python"):
            share = runs[kind][collector][1].percent()
            assert share.operators < 1.0 and share.microseconds < 1.0, (kind, collector)
    assert runs["none"]["python"][1].percent().operators == 1.0
    assert runs["print"]["native"][1].percent().operators == 1.0


@pytest.mark.parametrize("kind", sorted(NATIVE_COUNTS))
def test_same_counts_as_torch_dynamo_profiler(runs, kind):
    ours = runs[kind]["native"][1]
    theirs = runs[kind]["torch"]
    assert ours.captured.operators == theirs.captured.operators
    assert ours.captured.graphs == theirs.captured.graphs
    # torch subtracts one op per graph call and one more for setup ops that
    # torch 2.13 no longer records (record_function's torch.zeros handle);
    # opscope counts only what ran.
    assert ours.total.operators == theirs.total.operators + ours.captured.graphs + 1


@pytest.mark.parametrize("kind,missing,function", [("item", "aten::item", "forward"),
                                                   ("disable", "aten::mul", "<lambda>")])
def test_uncaptured_ops_are_the_graph_break(runs, kind, missing, function):
    profiler, result = runs[kind]["native"]
    ops = profiler.uncaptured()
    assert [(op.name, op.calls) for op in ops] == [(missing, 1)]
    stacks = profiler.prof.session.stacks
    if stacks is not None and any(stacks):  # the source line is in this file
        # paths are shown relative to their sys.path folder, as torch shows them
        assert __file__.endswith("/" + ops[0].source.split("(")[0])
        assert ops[0].source.endswith(f"): {function}")
    else:
        assert ops[0].source == ""
    table = profiler.prof.session.table
    masks = find_captured(table)
    # captured time is exactly the time of the captured top-level ops
    assert result.captured.microseconds == pytest.approx(
        float(table.duration_ns[masks.captured].sum()) / 1000)
    assert result.total.microseconds == pytest.approx(
        result.captured.microseconds + ops[0].microseconds)
    # every captured op has a TORCHDYNAMO ancestor and no op ancestor
    for i in np.flatnonzero(masks.captured).tolist():
        chain, p = [], int(table.parent[i])
        while p >= 0:
            chain.append(table.name(p))
            p = int(table.parent[p])
        assert "TORCHDYNAMO" in chain and not any("::" in n for n in chain)
    report = profiler.report()
    assert "Dynamo profile: 2 graphs, 2 graph calls" in report
    assert missing in report.split("Top uncaptured ops")[1]


def test_python_collector_sees_the_same_break(runs):
    for kind, missing in (("item", "aten::_local_scalar_dense"), ("disable", "aten::mul")):
        profiler, result = runs[kind]["python"]
        assert result.captured.graphs == 2
        assert [op.name for op in profiler.uncaptured()] == [missing]
        assert result.total.operators == result.captured.operators + 1


def test_training_step_backward_and_optimizer_are_uncaptured(runs):
    profiler, result = runs["train"]["native"]
    forward_only = runs["item"]["native"][1]
    assert result.captured.operators == forward_only.captured.operators
    assert result.captured.graphs == 2
    names = {op.name for op in profiler.uncaptured()}
    assert "aten::item" in names
    assert "autograd::engine::evaluate_function: AddmmBackward0" in names
    assert any(n.startswith("aten::add_") or n.startswith("aten::_foreach") for n in names)
    assert result.percent().operators < forward_only.percent().operators


def test_results_before_profiling_is_a_clear_error():
    with pytest.raises(RuntimeError, match="nothing was recorded"):
        Profiler().results()


def test_wrapper_without_a_profiler_just_runs():
    torch._dynamo.reset()
    Profiler.unique_graphs = 0
    f = torch.compile(lambda t: t + 1, backend=fx_insert_profiling)
    assert f(torch.zeros(3)).tolist() == [1.0, 1.0, 1.0]
    assert Profiler.unique_graphs == 1
    torch._dynamo.reset()
    Profiler.unique_graphs = 0
    with pytest.raises(TypeError, match="gm must be"):
        fx_insert_profiling(object(), [])


def test_print_missing_is_silent_by_default(runs, capsys, monkeypatch):
    monkeypatch.delenv("OPSCOPE_PRINT_MISSING", raising=False)
    monkeypatch.delenv("TORCHDYNAMO_PRINT_MISSING", raising=False)
    runs["item"]["native"][0].results()
    assert "MISSING" not in capsys.readouterr().out


def test_torchdynamo_print_missing_is_honoured(runs, capsys, monkeypatch):
    monkeypatch.delenv("OPSCOPE_PRINT_MISSING", raising=False)
    monkeypatch.setenv("TORCHDYNAMO_PRINT_MISSING", "1")
    monkeypatch.setattr(dynamo_report, "_printed", set())  # forget earlier prints
    profiler = runs["disable"]["native"][0]
    profiler.results()
    profiler.results()
    missing = [line for line in capsys.readouterr().out.splitlines()
               if line.startswith("MISSING")]
    assert len(missing) == 1 and missing[0].startswith("MISSING aten::mul: "), missing


MISSING_SCRIPT = textwrap.dedent("""\
    import torch
    from opscope.dynamo import Profiler, fx_insert_profiling

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 4)

        def forward(self, x):
            x = self.lin(x)
            if x.sum().item() > -1e9:  # BREAK
                x = x * 2
            return x.sum()

    model = torch.compile(Net(), backend=fx_insert_profiling)
    x = torch.randn(2, 4)
    model(x)
    for _ in range(2):
        profiler = Profiler()
        with profiler.prof:
            model(x)
        print("RESULT", profiler.results())
        stacks = profiler.prof.session.stacks
        print("STACKS", stacks is not None and any(stacks))
    """)


def test_print_missing_in_a_subprocess(tmp_path):
    script = tmp_path / "break_model.py"
    script.write_text(MISSING_SCRIPT)
    env = {k: v for k, v in os.environ.items()
           if k not in ("OPSCOPE_PRINT_MISSING", "TORCHDYNAMO_PRINT_MISSING")}
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env.update({"OPSCOPE_PRINT_MISSING": "1", "OPSCOPE_COLLECTOR": "native",
                "PYTHONPATH": os.pathsep.join(filter(None, [repo, env.get("PYTHONPATH")]))})
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.splitlines()
    missing = [line for line in lines if line.startswith("MISSING")]
    # one uncaptured op, printed once although two runs missed it
    assert len(missing) == 1, proc.stdout
    assert missing[0].startswith("MISSING aten::item: ")
    assert [line.split()[1:3] for line in lines if line.startswith("RESULT")] == \
        [["2", "graphs"], ["0", "graphs"]]
    break_line = MISSING_SCRIPT.splitlines().index(
        next(line for line in MISSING_SCRIPT.splitlines() if "# BREAK" in line)) + 1
    if "STACKS True" in lines:
        assert missing[0].endswith(f"{os.path.basename(script)}({break_line}): forward"), \
            missing[0]
        assert "torch/" not in missing[0], missing[0]  # the user's frames only
    else:
        assert missing[0] == "MISSING aten::item: (no Python stack recorded)"


# -- metrics arithmetic and text ---------------------------------------------------------

def test_metrics_add_and_iadd():
    a = ProfileMetrics(10.0, 4, 3, 1)
    b = ProfileMetrics(5.5, 2, 1, 2)
    assert a + b == ProfileMetrics(15.5, 6, 4, 3)
    assert a == ProfileMetrics(10.0, 4, 3, 1)  # + leaves both operands alone
    same = a
    a += b
    assert a is same and a == ProfileMetrics(15.5, 6, 4, 3)
    with pytest.raises(TypeError):
        _ = a + 1
    with pytest.raises(TypeError):
        a += "x"


def test_metrics_divide_by_int_and_by_metrics():
    m = ProfileMetrics(30.0, 6, 4, 2)
    assert m / 2 == ProfileMetrics(15.0, 3.0, 2.0, 1.0)
    assert m / 0 == ProfileMetrics(30.0, 6.0, 4.0, 2.0)  # never divides by less than 1
    assert m / ProfileMetrics(60.0, 8, 0, 4) == ProfileMetrics(0.5, 0.75, 4.0, 0.5)
    assert ProfileMetrics() / ProfileMetrics() == ProfileMetrics(0.0, 0.0, 0.0, 0.0)
    with pytest.raises(TypeError):
        _ = m / 2.5
    with pytest.raises(TypeError):
        _ = m / True


def test_metrics_str_and_tocsv():
    assert str(ProfileMetrics(0.5, 0.75)) == " 75% ops  50% time"
    assert str(ProfileMetrics(1.0, 1.0)) == "100% ops 100% time"
    assert str(ProfileMetrics(0.0, 0.054)) == "  5% ops   0% time"
    assert ProfileMetrics(0.5, 0.75, 9, 9).tocsv() == [0.75, 0.5]
    assert ProfileMetrics().tocsv() == [0, 0.0]


def test_result_percent_str_tocsv_and_iadd():
    r = ProfileResult(ProfileMetrics(30.0, 3, 2, 1), ProfileMetrics(40.0, 4, 3, 1), 1)
    assert r.percent() == ProfileMetrics(0.75, 0.75, 2 / 3, 1.0)
    assert str(r) == " 1 graphs  1 graph calls    3/   4 =  75% ops  75% time"
    assert r.tocsv() == [1, 1, 3, 4, 0.75, 0.75]
    r += ProfileResult(ProfileMetrics(10.0, 1, 0, 1), ProfileMetrics(60.0, 6, 5, 1), 2)
    assert str(r) == " 3 graphs  2 graph calls    4/  10 =  40% ops  40% time"
    assert r.tocsv() == [3, 2, 4, 10, 0.4, 0.4]
    empty = ProfileResult(None, None, 0)
    assert str(empty) == " 0 graphs  0 graph calls    0/   0 =   0% ops   0% time"
    with pytest.raises(TypeError, match="captured must be a ProfileMetrics"):
        ProfileResult(3, None, 0)


# -- synthetic sessions: exact analysis and report text --------------------------------

def synthetic_session():
    """Two graph calls, a break with .item(), a user range, and a backward op."""
    stack = ["<built-in method item of Tensor object at 0x1>", "/src/net.py(12): forward",
             torch.__file__.replace("__init__.py", "nn/modules/module.py(1700): _call_impl"),
             "/src/train.py(40): step", "/src/train.py(50): <module>"]
    ops = [
        Op("Torch-Compiled Region: 0/0", -5, 105),
        Op("TORCHDYNAMO", 0, 100, scope=SCOPE_USER),
        Op("aten::linear", 10, 50),
        Op("aten::addmm", 20, 45),
        Op("aten::relu", 55, 60),
        Op("aten::item", 110, 120, stack=stack),
        Op("aten::_local_scalar_dense", 112, 118),
        Op("my_range", 125, 160, scope=SCOPE_USER),
        Op("aten::mul", 130, 150, stack=["/src/net.py(14): forward"]),
        Op("TORCHDYNAMO", 170, 200, scope=SCOPE_USER),
        Op("aten::sum", 175, 195),
        Op("autograd::engine::evaluate_function: MulBackward0", 300, 320, thread=1),
        Op("MulBackward0", 301, 319, thread=1, scope=SCOPE_BACKWARD_FUNCTION),
        Op("aten::mul", 302, 318, thread=1, stack=["/src/net.py(14): forward"]),
    ]
    return make_session(ops, thread_ids=(11, 12))


def test_synthetic_classification_and_result():
    session = synthetic_session()
    table = session.table
    masks = find_captured(table)
    names = lambda mask: [table.name(i) for i in np.flatnonzero(mask)]  # noqa: E731
    assert names(masks.graph_calls) == ["TORCHDYNAMO", "TORCHDYNAMO"]
    assert names(masks.captured) == ["aten::linear", "aten::relu", "aten::sum"]
    assert names(masks.uncaptured) == ["aten::item", "aten::mul",
                                       "autograd::engine::evaluate_function: MulBackward0"]
    result = capture_result(table, masks, unique_graphs=2)
    assert result.captured == ProfileMetrics(65.0, 3, 1, 2)
    assert result.total == ProfileMetrics(115.0, 6, 5, 2)
    assert str(result) == " 2 graphs  2 graph calls    3/   6 =  50% ops  57% time"


def test_synthetic_uncaptured_and_report_text():
    session = synthetic_session()
    masks = find_captured(session.table)
    ops = uncaptured_ops(session.table, masks, session.stacks)
    assert [(op.name, op.source, op.calls, op.microseconds) for op in ops] == [
        ("aten::mul", "/src/net.py(14): forward", 1, 20.0),
        ("autograd::engine::evaluate_function: MulBackward0", "", 1, 20.0),
        ("aten::item", "/src/net.py(12): forward", 1, 10.0),
    ]
    assert ops[2].stack == ["/src/net.py(12): forward", "/src/train.py(40): step",
                            "/src/train.py(50): <module>"]
    result = capture_result(session.table, masks, unique_graphs=2)
    assert format_report(result, ops, top=2, stacks_recorded=True) == textwrap.dedent("""\
        Dynamo profile: 2 graphs, 2 graph calls
        Captured ops:  3 of 6 top-level ops (50%)
        Captured time: 65.0 of 115.0 us (57%)
        Top uncaptured ops (by time; each ran outside every compiled graph):
          Time (us)  Calls  Op                                                 Source
               20.0      1  aten::mul                                          /src/net.py(14): forward
               20.0      1  autograd::engine::evaluate_function: MulBackward0  -
          ... and 1 more""")
    no_graphs = capture_result(session.table, CaptureMasks(
        np.zeros(len(session.table), bool), masks.top_level,
        np.zeros(len(session.table), bool)))
    text = format_report(no_graphs, [], stacks_recorded=False)
    assert "No compiled graph ran" in text and "No uncaptured ops" in text
    assert format_report(result, ops[:1]).endswith(
        "(no Python stacks recorded: profile with with_stack=True to see source lines)")
    assert format_report(result, ops[:1], stacks_requested=True).endswith(
        "(with_stack was on, but the collector recorded no Python stacks)")
    with pytest.raises(ValueError, match="top must be"):
        format_report(result, ops, top=-1)


def test_missing_lines_from_stacks():
    session = synthetic_session()
    masks = find_captured(session.table)
    rows = np.flatnonzero(masks.uncaptured).tolist()
    lines = missing_lines([session.table.name(i) for i in rows],
                          [session.stacks[i] for i in rows])
    assert lines == [
        "MISSING aten::item: /src/train.py(50): <module> >> /src/train.py(40): step >> "
        "/src/net.py(12): forward",
        "MISSING aten::mul: /src/net.py(14): forward",
        "MISSING autograd::engine::evaluate_function: MulBackward0: "
        "(no Python stack recorded)",
    ]
    profiler_frame = opscope.__file__.replace("__init__.py", "api/profiler.py(200): stop")
    assert missing_line("aten::zeros", [profiler_frame, "/src/train.py(3): <module>"]) is None
    torch_only = torch.__file__.replace("__init__.py", "functional.py(9): f")
    assert missing_line("aten::zeros", [torch_only]) == \
        "MISSING aten::zeros: (no user frame on the stack)"
