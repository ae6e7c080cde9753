"""torch.compile'd code shows the same ranges under opscope as under torch.profiler.

Compiled code opens ranges of its own (``## Call CompiledFxGraph <key> ##``,
``AOTDispatcher Runtime Wrapper Prologue``, ``Pregraph bytecode``; which ones
depends on the torch version) only while ``torch.autograd.profiler._is_profiler_enabled``
is set, through ``torch._C._profiler._RecordFunctionFast``. opscope holds both up
while it records (opscope/collect/profiler_flag.py) and puts them back after.

The model is compiled once per module (inductor on CPU needs g++); every test
then runs a few warm steps.
"""

from __future__ import annotations

import collections
import os
import shutil
import sys
import textwrap
import warnings

import pytest
import torch
import torch.autograd.profiler as autograd_profiler

import opscope
from subprocesses import run_in_group

STEPS = 3
# Ranges torch.compile'd code opens only while torch believes a profiler is on
COMPILE_RANGES = ("## Call CompiledFxGraph", "AOTDispatcher Runtime Wrapper Prologue",
                  "Pregraph bytecode")
TORCH_FAST_CLASS = torch._C._profiler._RecordFunctionFast


@pytest.fixture(scope="module")
def compiled_step():
    """One training step of a tiny inductor-compiled model, warmed up (compiled)."""
    if shutil.which("g++") is None and shutil.which("c++") is None:
        pytest.skip("inductor on CPU needs a C++ compiler (g++), none found")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    compiled = torch.compile(model)
    x = torch.randn(2, 8)

    def step():
        compiled(x).sum().backward()

    for _ in range(3):  # compile, then settle (the first calls may differ)
        step()
    yield step
    torch._dynamo.reset()


def counts(prof) -> collections.Counter:
    """Row name -> count. A name in both a user range and an op row counts in both."""
    table: collections.Counter = collections.Counter()
    for row in prof.key_averages():
        table[row.key] += row.count
    return table


def rows(prof) -> dict:
    """(name, is_user_annotation) -> count: torch keeps a user range and a function
    range of one name apart, so the scope of each compile range is compared too."""
    return {(row.key, bool(getattr(row, "is_user_annotation", False))): row.count
            for row in prof.key_averages()}


def profile_steps(prof, step, steps: int = STEPS) -> collections.Counter:
    with prof:
        for _ in range(steps):
            step()
    return counts(prof)


def torch_profile():
    return torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])


def compile_ranges(table: collections.Counter) -> dict:
    return {name: n for name, n in table.items() if name.startswith(COMPILE_RANGES)}


def assert_nothing_held():
    """opscope leaves torch exactly as torch.profiler left it: nothing on."""
    assert autograd_profiler._is_profiler_enabled is False
    assert autograd_profiler._run_on_profiler_stop.__module__ == "torch.autograd.profiler"
    assert torch._C._profiler._RecordFunctionFast is TORCH_FAST_CLASS


def profile_rows(prof, step) -> dict:
    with prof:
        for _ in range(STEPS):
            step()
    return rows(prof)


@pytest.mark.parametrize("record_shapes", [False, True])
def test_compiled_model_names_and_counts_equal_torch_profiler(compiled_step, native_only,
                                                              record_shapes):
    """Every row, by name and scope, with its count. torch opens
    ``## Call CompiledFxGraph`` as a user range only when it records shapes."""
    def torch_run():
        return torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                      record_shapes=record_shapes)

    first = profile_rows(torch_run(), compiled_step)
    ours = profile_rows(opscope.profile(record_shapes=record_shapes), compiled_step)
    second = profile_rows(torch_run(), compiled_step)
    assert_nothing_held()
    # Only what torch.profiler itself counts differently between two runs of the same
    # steps is left out (none seen so far); everything else must be equal.
    unsteady = {name for name in first | second if first[name] != second[name]}
    assert len(unsteady) <= 2, f"torch.profiler itself is unsteady here: {unsteady}"
    theirs = {k: v for k, v in first.items() if k not in unsteady}
    mine = {k: v for k, v in ours.items() if k not in unsteady}
    assert mine == theirs
    names: collections.Counter = collections.Counter()
    for (name, _), n in ours.items():
        names[name] += n
    assert any(name.startswith("Torch-Compiled Region") for name in names), sorted(names)
    # Which compile ranges exist depends on the version (2.4: none; 2.8: no
    # "## Call CompiledFxGraph"): torch's own rows above are the measure. Since 2.8
    # some exist, so the comparison covers them. (torch.__version__ is a
    # TorchVersion: it compares as a version, not as a str.)
    if torch.__version__ >= "2.8":
        assert compile_ranges(names), sorted(names)


def test_python_collector_records_the_compile_ranges(compiled_step, monkeypatch):
    """The Python fallback sees fewer ops in compiled code (no dispatcher hook for
    inductor's kernels), but the compile ranges are opened on it like on the native one."""
    monkeypatch.setenv("OPSCOPE_COLLECTOR", "python")
    theirs = profile_steps(torch_profile(), compiled_step)
    ours = profile_steps(opscope.profile(), compiled_step)
    assert compile_ranges(ours) == compile_ranges(theirs)
    assert_nothing_held()


def test_torch_sees_a_profiler_only_while_opscope_records(compiled_step, native_only):
    assert_nothing_held()
    with opscope.profile():
        assert autograd_profiler._is_profiler_enabled is True
        # torch.profiler itself does not believe it runs
        assert torch._C._autograd._profiler_enabled() is False
        compiled_step()
    assert_nothing_held()


def test_schedule_holds_the_flag_in_active_steps_only(compiled_step, native_only):
    seen = []
    sched = opscope.schedule(wait=1, warmup=1, active=1)
    with opscope.profile(schedule=sched) as prof:
        for _ in range(3):
            seen.append(autograd_profiler._is_profiler_enabled)
            compiled_step()
            prof.step()
    assert seen == [False, False, True]  # torch.profiler too sets it at the active step only
    assert_nothing_held()
    one_step = profile_steps(torch_profile(), compiled_step, 1)
    assert compile_ranges(counts(prof)) == compile_ranges(one_step)


def test_torch_profiler_inside_opscope(compiled_step, native_only):
    with opscope.profile() as outer:
        with torch_profile() as inner:
            compiled_step()
        # torch.profiler's exit clears the flag; opscope still records, so it is set back
        assert autograd_profiler._is_profiler_enabled is True
        compiled_step()
    assert_nothing_held()
    inner_ranges, outer_ranges = compile_ranges(counts(inner)), compile_ranges(counts(outer))
    assert outer_ranges == {name: 2 * n for name, n in inner_ranges.items()}


def test_opscope_inside_torch_profiler(compiled_step, native_only):
    alone = profile_steps(torch_profile(), compiled_step, 2)
    with torch_profile() as outer:
        with opscope.profile() as inner:
            compiled_step()
        # torch.profiler still runs: the flag stays as it set it
        assert autograd_profiler._is_profiler_enabled is True
        assert torch._C._profiler._RecordFunctionFast is TORCH_FAST_CLASS
        compiled_step()
    assert_nothing_held()
    assert counts(outer) == alone  # opscope inside changed nothing torch.profiler saw
    assert compile_ranges(counts(inner)) == {name: n // 2 for name, n in
                                             compile_ranges(alone).items()}


def test_a_fast_range_is_recorded_once_with_both_profilers(native_only):
    with torch_profile() as outer:
        with opscope.profile() as inner:
            with torch._C._profiler._RecordFunctionFast("both see me"):
                pass
    assert counts(outer)["both see me"] == 1
    assert counts(inner)["both see me"] == 1
    with opscope.profile():
        # torch's own class aborts the process on a bad name (an unhandled C++ error)
        assert torch._C._profiler._RecordFunctionFast is not TORCH_FAST_CLASS
        with pytest.raises(TypeError, match="must be a string"):
            torch._C._profiler._RecordFunctionFast(3)


# the child only reads two attributes and writes to a pipe: no lock it could need
@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")
def test_forked_child_sees_no_profiler(native_only):
    if not hasattr(os, "fork"):
        pytest.skip("no os.fork on this platform")
    with opscope.profile():
        read_end, write_end = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: report what torch sees, then leave at once
            state = (autograd_profiler._is_profiler_enabled,
                     torch._C._profiler._RecordFunctionFast is TORCH_FAST_CLASS)
            os.write(write_end, repr(state).encode())
            os._exit(0)
        os.close(write_end)
        report = os.read(read_end, 100).decode()
        os.close(read_end)
        os.waitpid(pid, 0)
        assert autograd_profiler._is_profiler_enabled is True  # the parent still records
    assert report == "(False, True)"


TORCH_ONLY_SCRIPT = textwrap.dedent("""
    import sys, torch
    if sys.argv[1] == "with-opscope":
        import opscope
        with opscope.profile():  # started and stopped before torch.profiler runs
            torch.ones(2) + 1
    def step():
        with torch._C._profiler._RecordFunctionFast("fast range"):
            torch.nn.functional.relu(torch.ones(3, 3) @ torch.ones(3, 3))
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as p:
        for _ in range(2):
            step()
    print(sorted((row.key, row.count) for row in p.key_averages()))
""")


def test_torch_profiler_is_the_same_with_opscope_imported():
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    tables = [run_in_group([sys.executable, "-c", TORCH_ONLY_SCRIPT, mode], timeout=300,
                           env=env) for mode in ("without", "with-opscope")]
    for result in tables:
        assert result.returncode == 0, result.stderr[-2000:]
    without, with_opscope = (result.stdout.strip().splitlines()[-1] for result in tables)
    assert "fast range" in without
    assert with_opscope == without


class _TwoLayers(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(8, 8)
        self.b = torch.nn.Linear(8, 8)

    def forward(self, x):
        return self.b(torch.relu(self.a(x)))


@pytest.mark.parametrize("make", [_TwoLayers, lambda: torch.nn.Sequential(
    torch.nn.Linear(8, 8), torch.nn.ReLU())], ids=["custom", "sequential"])
def test_with_modules_on_a_compiled_module(make):
    """One range named as the compiled module, no OptimizedModule range, no warning about
    global hooks, and the compiled graph is not broken by the hooks (dynamo traces them as
    no-ops). Before, a custom module crashed dynamo with an AssertionError."""
    from torch._dynamo.utils import counters

    if shutil.which("g++") is None and shutil.which("c++") is None:
        pytest.skip("inductor on CPU needs a C++ compiler (g++), none found")
    model = torch.compile(make())
    x = torch.randn(2, 8)
    model(x)
    counters.clear()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with opscope.profile(with_modules=True) as prof:
            model(x).sum().backward()
    assert not [w for w in caught if "global hooks" in str(w.message)]
    root = type(model._orig_mod).__name__
    assert root in prof.session.modules
    # the modules inside the graph come from its nodes (analysis.compiled_modules): only
    # submodules of the compiled one, none named OptimizedModule
    inner = {name.split(" (")[0] for name in prof.session.modules if name != root}
    assert inner <= set(dict(model._orig_mod.named_modules())), inner
    assert not dict(counters["graph_break"])
    assert "aten::addmm" in [row.key for row in prof.key_averages()]
    assert not [f for f in warnings.filters if "global hooks" in str(f[1] and f[1].pattern)]
