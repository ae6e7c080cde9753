"""What a newcomer trips on in the CLI (issue 27): each test fails without its fix."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

TIMEOUT_S = 300
TRAIN = """\
import sys
import torch

steps = int(sys.argv[1])
model = torch.nn.Linear(8, 4)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(steps):
    model(torch.randn(16, 8)).sum().backward()
    opt.step()
    opt.zero_grad()
"""


def cli(*args: str, cwd: Path, env: dict = None, warm=None) -> subprocess.CompletedProcess:
    """``python -m opscope ARGS``; in a fork of ``warm`` (tests/warm_python.py: torch is
    imported already) when given. The module's fixture run starts a real interpreter."""
    environ = {k: v for k, v in os.environ.items() if k != "OPSCOPE_COLLECTOR"}
    environ.update(env or {})
    if warm is not None:
        return warm.run(["-m", "opscope", *args], cwd=cwd, env=environ, timeout=TIMEOUT_S)
    return subprocess.run([sys.executable, "-m", "opscope", *args], cwd=cwd, env=environ,
                          capture_output=True, text=True, timeout=TIMEOUT_S)


def write(folder: Path, name: str, body: str) -> Path:
    path = folder / name
    path.write_text(textwrap.dedent(body))
    return path


def table_rows(stdout: str) -> list:
    """Row names of the printed key_averages table."""
    lines = stdout.splitlines()
    header = next(i for i, line in enumerate(lines) if line.split()[:1] == ["Name"])
    rows = []
    for line in lines[header + 2:]:
        if line.startswith("---"):
            break
        rows.append(line.split("  ")[0].strip() or line.split()[0])
    return rows


# -- item 4: a schedule ending between two windows -------------------------------------

@pytest.fixture(scope="module")
def run_ending_between_windows(tmp_path_factory):
    """``opscope run --schedule 1,1,3 train.py 6``, run once for the tests that read it:
    steps 2-4 are recorded, and a second cycle begins (step 6 warms up when the script
    ends). Its CompletedProcess; its folder is not to be written into."""
    folder = tmp_path_factory.mktemp("between_windows")
    write(folder, "train.py", TRAIN)
    return cli("run", "-o", "out", "--schedule", "1,1,3", "train.py", "6", cwd=folder)


def test_run_ending_between_windows_prints_the_last_complete_window(
        run_ending_between_windows):
    """1,1,3 over 6 steps: steps 2-4 are recorded, step 6 warms up when the script ends."""
    result = run_ending_between_windows
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[0] == "opscope: table of steps 2-4 (complete window)"
    rows = table_rows(result.stdout)
    assert "ProfilerStep*" in rows and "aten::addmm" in rows


def test_run_prefers_the_complete_window_to_the_partial_one(tmp_path, warm_python):
    """0,0,2 over 3 steps: steps 0-1 whole, steps 2-3 cut by the end (written as partial)."""
    write(tmp_path, "train.py", TRAIN)
    result = cli("run", "-o", "out", "--schedule", "0,0,2", "train.py", "3", cwd=tmp_path,
                 warm=warm_python)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[0] == "opscope: table of steps 0-1 (complete window)"
    assert "train.step3.partial.pt.trace.json" in result.stderr


def test_run_labels_a_partial_window_when_it_is_the_only_one(tmp_path, warm_python):
    write(tmp_path, "train.py", TRAIN)
    result = cli("run", "-o", "out", "--schedule", "0,1,5", "train.py", "3", cwd=tmp_path,
                 warm=warm_python)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[0] == (
        "opscope: table of steps 1-3 (partial window: the program ended during step 3)")
    assert "aten::addmm" in table_rows(result.stdout)


def test_run_without_schedule_labels_the_whole_run(tmp_path, warm_python):
    write(tmp_path, "train.py", TRAIN)
    result = cli("run", "-o", "out", "train.py", "1", cwd=tmp_path, warm=warm_python)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[0] == "opscope: table of the whole run"


# -- item 5: convert orders a rank's windows by absolute time ---------------------------

def synthetic_window(path: Path, *, rank: int, base_ns: int, ts_us: float, step: int) -> None:
    """A rank's window as opscope writes it: ``ts`` counts from the file's own base."""
    events = [
        {"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{step}", "pid": 1,
         "tid": 1, "ts": ts_us, "dur": 100.0},
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1,
         "ts": ts_us + 10.0, "dur": 50.0},
    ]
    path.write_text(json.dumps({
        "baseTimeNanoseconds": base_ns,
        "distributedInfo": {"rank": rank, "world_size": 2, "backend": "gloo"},
        "traceEvents": events}))


def cli_in_process(capsys, *argv: str) -> str:
    from opscope.cli.main import main

    with pytest.raises(SystemExit) as exit_info:
        main(list(argv))
    out, err = capsys.readouterr()
    assert exit_info.value.code == 0, err
    return out


def test_convert_orders_windows_by_absolute_time_not_raw_ts(tmp_path, capsys):
    """Step 3's window starts at base 1 s + 900 ms; step 7's at base 2 s + 100 ms: its raw
    ``ts`` is smaller, yet it is the later window."""
    pytest.importorskip("pyarrow")
    pytest.importorskip("duckdb")
    folder = tmp_path / "job"
    folder.mkdir()
    second = 10 ** 9
    for rank in (0, 1):
        synthetic_window(folder / f"t.rank{rank}.step3.pt.trace.json", rank=rank,
                         base_ns=1_700_000_001 * second, ts_us=900_000.0, step=3)
        synthetic_window(folder / f"t.rank{rank}.step7.pt.trace.json", rank=rank,
                         base_ns=1_700_000_002 * second, ts_us=100_000.0, step=7)
    store = tmp_path / "job.store"
    cli_in_process(capsys, "convert", str(folder), "-o", str(store))
    out = cli_in_process(capsys, "query", str(store),
                         'SELECT DISTINCT rank, "window", name FROM events '
                         "WHERE name LIKE 'ProfilerStep#%' ORDER BY 1, 2", "--format", "csv")
    assert [line.split(",")[2] for line in out.splitlines()[1:]] == [
        "ProfilerStep#3", "ProfilerStep#7"] * 2
    assert cli_in_process(capsys, "ranks", str(store), "--json") == \
        cli_in_process(capsys, "ranks", str(folder), "--json")


def test_ranks_of_a_folder_lists_windows_in_time_order_not_name_order(tmp_path, capsys):
    folder = tmp_path / "job"
    folder.mkdir()
    for step, ts in ((7, 100.0), (11, 900.0)):  # "step11" sorts before "step7" by name
        synthetic_window(folder / f"t.rank0.step{step}.pt.trace.json", rank=0,
                         base_ns=1_700_000_000 * 10 ** 9, ts_us=ts, step=step)
    files = json.loads(cli_in_process(capsys, "ranks", str(folder), "--json"))["ranks"][0]["files"]
    assert [os.path.basename(f) for f in files] == ["t.rank0.step7.pt.trace.json",
                                                    "t.rank0.step11.pt.trace.json"]


# -- item 7: merged traces are for viewers; no verb reads one as a rank ----------------

@pytest.fixture
def rank_folder(tmp_path):
    folder = tmp_path / "job"
    folder.mkdir()
    for rank in (0, 1):
        synthetic_window(folder / f"t.rank{rank}.pt.trace.json", rank=rank,
                         base_ns=1_700_000_000 * 10 ** 9, ts_us=100.0 * (rank + 1), step=1)
    return folder


def cli_status(capsys, *argv: str):
    from opscope.cli.main import main

    with pytest.raises(SystemExit) as exit_info:
        main(list(argv))
    out, err = capsys.readouterr()
    return exit_info.value.code, out, err


def test_merge_without_output_writes_beside_the_folder(rank_folder, capsys):
    status, _, err = cli_status(capsys, "merge", str(rank_folder))
    assert status == 0, err
    assert sorted(os.listdir(rank_folder)) == ["t.rank0.pt.trace.json", "t.rank1.pt.trace.json"]
    assert (rank_folder.parent / "job.merged.pt.trace.json").is_file()


def test_every_verb_skips_a_merged_trace_in_a_folder_and_refuses_it_named(
        rank_folder, tmp_path, capsys):
    merged = rank_folder / "all.pt.trace.json"  # -o into the folder, and the newest file
    assert cli_status(capsys, "merge", str(rank_folder), "-o", str(merged))[0] == 0
    os.utime(merged, (2 ** 31, 2 ** 31))
    status, out, err = cli_status(capsys, "table", str(rank_folder))
    assert status == 0 and "aten::mm" in out, err
    assert "(opscope merge)" not in err
    status, out, _ = cli_status(capsys, "ranks", str(rank_folder), "--json")
    assert status == 0 and len(json.loads(out)["ranks"]) == 2
    if importlib.util.find_spec("pyarrow") is not None:
        store = tmp_path / "s"
        status, _, err = cli_status(capsys, "convert", str(rank_folder), "-o", str(store))
        assert status == 0 and "2 window(s) of 2 rank(s)" in err, err
    for argv in (["table", str(merged)], ["report", str(merged), "-o", str(tmp_path / "r.html")],
                 ["diff", str(merged), str(merged)],
                 ["convert", str(merged), "-o", str(tmp_path / "s2")]):
        status, _, err = cli_status(capsys, *argv)
        assert status == 2, (argv, err)
        assert "merged trace of ranks 0, 1 (opscope merge)" in err, (argv, err)
        assert len(err.splitlines()) == 1, err


# -- item 17: a script that profiles itself under opscope run ---------------------------

OWN_PROFILER = """\
import torch, opscope
model = torch.nn.Linear(8, 4)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
with opscope.profile() as prof:
    for _ in range(2):
        model(torch.ones(2, 8)).sum().backward()
        opt.step()
print("own table rows:", len(prof.key_averages()))
"""


def test_run_lets_the_scripts_own_profiler_win_with_one_line(tmp_path, warm_python):
    write(tmp_path, "own.py", OWN_PROFILER)
    result = cli("run", "-o", "out", "--schedule", "0,1,1", "own.py", cwd=tmp_path,
                 warm=warm_python)
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    assert result.stderr.count("starts its own opscope.profile") == 1, result.stderr
    rows = int(result.stdout.split("own table rows:")[1].split()[0])
    assert rows > 0
    assert os.listdir(tmp_path / "out") == []


def test_a_second_profiler_in_a_program_still_raises():
    import opscope

    with opscope.profile():
        with pytest.raises(RuntimeError, match="not reentrant"):
            opscope.profile().start()


# -- item 31: a NUL in a range name, accepted as torch accepts it -----------------------

def test_record_function_with_a_nul_records_the_whole_name_escaped(collector_name, tmp_path):
    import torch

    import opscope

    with opscope.record_function("idle\x00range"):  # no profiler: torch accepts it too
        pass
    with opscope.profile() as prof:
        with opscope.record_function("a\x00b", "x\x00y") as rf:
            torch.ones(2).add_(1)
        opscope.itt.range_push("i\x00t")  # torch.profiler.itt accepts a NUL too
        opscope.itt.mark("m\x00k")
        opscope.itt.range_pop()
    assert rf.name == "a\x00b"  # the attribute is the user's, as torch keeps it
    names = [row.key for row in prof.key_averages()]
    assert "a\\x00b" in names and "i\\x00t" in names
    assert [m for _, _, m in prof.session.marks] == ["m\\x00k"]
    assert "a\\x00b" in prof.key_averages().table()
    path = tmp_path / "t.pt.trace.json"
    prof.export_chrome_trace(str(path))
    doc = json.loads(path.read_text())
    assert "a\\x00b" in {e.get("name") for e in doc["traceEvents"]}
    assert "\x00" not in path.read_text(encoding="utf-8")


# -- item 11: a new cycle drops the last one's events, as torch says; acc_events keeps them

def _cycles(prof, model, steps: int) -> None:
    import torch

    for _ in range(steps):
        model(torch.ones(2, 4))
        prof.step()


def test_a_new_cycle_warns_as_torch_does_and_acc_events_keeps_every_cycle(monkeypatch):
    import warnings

    import torch

    import opscope

    schedule_module = sys.modules["opscope.schedule"]  # opscope.schedule is the function
    monkeypatch.setattr(schedule_module, "_warned", set())
    model = torch.nn.Linear(4, 2)
    sched = opscope.schedule(wait=0, warmup=1, active=2, repeat=2)  # steps 1-2 and 4-5
    with pytest.warns(UserWarning, match="set acc_events=True") as caught:
        with opscope.profile(schedule=sched) as prof:
            _cycles(prof, model, 7)
    assert sum("acc_events" in str(w.message) for w in caught) == 1
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        with opscope.profile(schedule=sched, acc_events=True) as acc:
            _cycles(acc, model, 7)
    counts = {row.key: row.count for row in acc.key_averages()}
    assert counts["aten::linear"] == 4 and counts["ProfilerStep*"] == 4
    assert sum(e.name == "aten::linear" for e in acc.events()) == 4
    assert {row.key: row.count for row in prof.key_averages()}["aten::linear"] == 2


def test_run_with_a_schedule_does_not_print_the_cycle_warning(run_ending_between_windows):
    """The run's second cycle warms up after a window was recorded: where torch warns."""
    result = run_ending_between_windows
    assert result.returncode == 0, result.stderr
    assert "acc_events" not in result.stderr


# -- item 12: opscope.load, a saved trace or store window with a live profile's API -------

def test_opscope_load_gives_a_saved_trace_the_live_results_api(tmp_path):
    import torch

    import opscope

    model = torch.nn.Linear(4, 2)
    with opscope.profile(record_shapes=True) as prof:
        model(torch.ones(3, 4)).sum().backward()
    path = tmp_path / "t.pt.trace.json"
    prof.export_chrome_trace(str(path))
    loaded = opscope.load(str(path))
    live = {(r.key, r.count) for r in prof.key_averages()}
    assert {(r.key, r.count) for r in loaded.key_averages()} == live
    assert "aten::addmm" in loaded.table(sort_by="count", row_limit=-1)
    assert len(loaded.events()) == len(prof.events())
    assert loaded.key_averages(group_by_input_shape=True)
    again = tmp_path / "again.pt.trace.json"
    loaded.export_chrome_trace(str(again))
    assert {(r.key, r.count) for r in opscope.load(str(again)).key_averages()} == live
    assert opscope.load(str(tmp_path)).label.startswith("trace ")  # a folder: its newest
    from opscope.load import read_trace  # the package is still the package

    assert opscope.load.read_trace is read_trace
    with pytest.raises(ValueError, match="choose a store's windows"):
        opscope.load(str(path), rank=1)


def test_opscope_load_reads_a_store_window(tmp_path):
    pytest.importorskip("pyarrow")
    import torch

    import opscope
    from opscope.store import StoreError

    store = str(tmp_path / "s")
    for n in (1, 2):
        with opscope.profile() as prof:
            for _ in range(n):
                torch.ones(2).add_(1)
        prof.export_store(store)
    newest = opscope.load(store)
    assert newest.label == f"store {store!r}, rank 0, window 1"
    assert {r.key: r.count for r in newest.key_averages()}["aten::add_"] == 2
    first = opscope.load(store, rank=0, window=0)
    assert {r.key: r.count for r in first.key_averages()}["aten::add_"] == 1
    with pytest.raises(StoreError, match="has no window 5 of rank 0"):
        opscope.load(store, window=5)


# -- item 24: a JSON list that holds no trace events is not a trace --------------------

@pytest.mark.parametrize("text", ["[1, 2, 3]", "[]", '[{"a": 1}]', '["x"]'])
def test_table_of_a_json_list_without_events_is_a_usage_error(tmp_path, capsys, text):
    path = tmp_path / "arr.json"
    path.write_text(text)
    status, out, err = cli_status(capsys, "table", str(path))
    assert status == 2 and out == "", err
    assert err.startswith("opscope: error: trace ") and "not a trace" in err
    assert len(err.splitlines()) == 1


def test_table_of_an_array_format_trace_still_works(tmp_path, capsys):
    path = tmp_path / "arr.json"
    path.write_text(json.dumps([{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1,
                                 "tid": 1, "ts": 1, "dur": 2}]))
    status, out, err = cli_status(capsys, "table", str(path))
    assert status == 0 and "aten::mm" in out, err


# -- item 26: report shows one window, so its help offers no "all" ----------------------

def test_report_help_offers_no_all_and_refuses_it_at_parse(capsys):
    from opscope.cli.main import build_parser

    verb = build_parser()._subparsers._group_actions[0].choices["report"]
    text = verb.format_help()
    assert "--rank R " in text and "--window W " in text
    assert "|all" not in text and "or all" not in text
    status, _, err = cli_status(capsys, "report", "anything", "--window", "all")
    assert status == 2 and "expected a window number" in err
    table = build_parser()._subparsers._group_actions[0].choices["table"].format_help()
    assert "W|all" in table  # table adds windows up: all stays


# -- item 32: missing build tools are one line, said before any compiling ---------------

BUILD_PROBE = ("from opscope.collect.native.build import load_native\n"
               "print('NATIVE', load_native() is not None)\n")


def _build_without(tmp_path: Path, *, path_dirs: list, no_pip_ninja: bool):
    env = {k: v for k, v in os.environ.items()
           if k not in ("OPSCOPE_QUIET_BUILD", "OPSCOPE_COLLECTOR", "CXX",
                        "OPSCOPE_FORCE_BUILD_FAILURE")}
    env["OPSCOPE_CACHE_DIR"] = str(tmp_path / "cache")
    env["PATH"] = os.pathsep.join(str(d) for d in path_dirs)
    if no_pip_ninja:  # an import of ninja that fails, as where pip's ninja is missing
        fake = tmp_path / "fake"
        fake.mkdir()
        (fake / "ninja.py").write_text("raise ImportError('no ninja here')\n")
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(fake), env.get("PYTHONPATH")]))
    return subprocess.run([sys.executable, "-c", BUILD_PROBE], capture_output=True, text=True,
                          env=env, cwd=str(Path(__file__).resolve().parents[1]),
                          timeout=TIMEOUT_S)


def test_no_compiler_is_one_line_naming_it_and_the_python_collector(tmp_path):
    empty = tmp_path / "bin"
    empty.mkdir()
    proc = _build_without(tmp_path, path_dirs=[empty], no_pip_ninja=False)
    assert "NATIVE False" in proc.stdout, proc.stderr
    assert proc.stderr.splitlines() == [
        "opscope: native collector unavailable (no C++ compiler: 'c++' is not on PATH "
        "(install g++ or clang++, or set CXX)); using the Python fallback collector"]


def test_no_ninja_is_one_line_naming_it(tmp_path):
    import shutil

    tools = tmp_path / "bin"
    tools.mkdir()
    compiler = shutil.which("c++")
    if compiler is None:
        pytest.skip("no C++ compiler on this machine")
    os.symlink(compiler, tools / "c++")
    proc = _build_without(tmp_path, path_dirs=[tools], no_pip_ninja=True)
    assert "NATIVE False" in proc.stdout, proc.stderr
    assert proc.stderr.splitlines() == [
        "opscope: native collector unavailable (ninja is not installed (pip install ninja)); "
        "using the Python fallback collector"]


# -- item 18: the CLI imports torch only where a verb needs it ------------------------

NO_TORCH_PROBE = """
import contextlib, io, sys
from opscope.cli.main import VERBS, main
argvs = [["--help"]] + [[v.__name__.rsplit(".", 1)[1], "--help"] for v in VERBS]
argvs.append(["trigger", "999999999"])
argvs.append(["run", "-o", "README.md/sub", "bench/common.py"])  # a bad -o: one line, no torch
for argv in argvs:
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        try:
            main(argv)
        except SystemExit:
            pass
print("TORCH", "torch" in sys.modules)
"""


def test_help_of_every_verb_and_trigger_on_a_missing_pid_import_no_torch(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "OPSCOPE_ON_DEMAND"}
    proc = subprocess.run([sys.executable, "-c", NO_TORCH_PROBE], capture_output=True,
                          text=True, env=env, cwd=str(Path(__file__).resolve().parents[1]),
                          timeout=TIMEOUT_S)
    assert proc.returncode == 0, proc.stderr
    assert "TORCH False" in proc.stdout, proc.stdout + proc.stderr


READING_VERBS_PROBE = """
import contextlib, io, sys
from opscope.cli.main import main
trace, folder = sys.argv[1], sys.argv[2]
argvs = [["table", trace], ["table", trace, "--group-by", "module"],
         ["diff", trace, trace], ["report", trace, "-o", folder + "/r.html"],
         ["convert", trace, "-o", folder + "/s"], ["table", folder + "/s"],
         ["ranks", folder + "/s"], ["query", folder + "/s", "select count(*) from events"]]
for argv in argvs:
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        try:
            main(argv)
        except SystemExit as exc:
            assert not exc.code, (argv, exc.code)
print("TORCH", "torch" in sys.modules)
"""


def test_reading_verbs_on_a_trace_and_a_store_import_no_torch(tmp_path, module_trace):
    """Reading a saved profile needs no torch: each of these ran a 2 s torch import."""
    env = {k: v for k, v in os.environ.items() if k != "OPSCOPE_ON_DEMAND"}
    proc = subprocess.run([sys.executable, "-c", READING_VERBS_PROBE, str(module_trace),
                           str(tmp_path)], capture_output=True, text=True, env=env,
                          cwd=str(Path(__file__).resolve().parents[1]), timeout=TIMEOUT_S)
    assert proc.returncode == 0, proc.stderr
    assert "TORCH False" in proc.stdout, proc.stdout + proc.stderr
    assert (tmp_path / "r.html").is_file() and (tmp_path / "s").is_dir()


@pytest.fixture
def module_trace(tmp_path):
    """A training step's trace with modules and stacks, written by this process."""
    import torch

    import opscope

    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
    with opscope.profile(with_modules=True, with_stack=True) as prof:
        model(torch.randn(2, 4)).sum().backward()
    path = tmp_path / "step.pt.trace.json"
    prof.export_chrome_trace(str(path))
    return path


def test_importing_torch_after_opscope_still_installs_the_step_hook(tmp_path):
    code = ("import sys, opscope\n"
            "assert 'torch' not in sys.modules\n"
            "import torch\n"
            "from opscope.step_tracker import StepTracker\n"
            "opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)\n"
            "before = StepTracker.current_step(); opt.step()\n"
            "print('COUNTED', StepTracker.current_step() - before)\n"
            "print('API', opscope.profile.__name__, opscope.itt.__name__, callable(opscope.load))\n")
    env = {k: v for k, v in os.environ.items() if k != "OPSCOPE_ON_DEMAND"}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                          cwd=str(Path(__file__).resolve().parents[1]), timeout=TIMEOUT_S)
    assert proc.returncode == 0, proc.stderr
    assert "COUNTED 1" in proc.stdout and "API profile opscope.itt True" in proc.stdout


def test_cli_mirrors_of_defaults_match_their_modules():
    from opscope.analysis import diff as analysis_diff
    from opscope.cli import diff as cli_diff
    from opscope.cli import ranks as cli_ranks
    from opscope.export import ranks_text

    assert cli_diff.DEFAULT_THRESHOLD_PCT == analysis_diff.DEFAULT_THRESHOLD_PCT
    assert cli_diff.DEFAULT_NOISE_PCT == analysis_diff.DEFAULT_NOISE_PCT
    assert cli_ranks.DEFAULT_COLLECTIVE_LIMIT == ranks_text.DEFAULT_COLLECTIVE_LIMIT
