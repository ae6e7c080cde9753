"""The command line, run as users run it: ``python -m opscope ...`` in a subprocess.

The tool's own outputs are the oracle: the printed table and the trace JSON.
Every run uses the native collector (``OPSCOPE_COLLECTOR`` unset).
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

TIMEOUT_S = 600

TRAIN_SCRIPT = """\
import sys
import torch

steps = int(sys.argv[1]) if len(sys.argv) > 1 else 2
model = torch.nn.Linear(8, 4)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(steps):
    loss = model(torch.randn(16, 8)).sum()
    opt.zero_grad()
    loss.backward()
    opt.step()
"""


def opscope_cli(warm, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    """``python -m opscope ARGS``: in a fork of ``warm`` (tests/warm_python.py, torch imported
    already) unless it is None; this file's plain run and ``--help`` start a real one."""
    env = {k: v for k, v in os.environ.items() if k != "OPSCOPE_COLLECTOR"}
    if warm is not None:
        return warm.run(["-m", "opscope", *args], cwd=cwd, env=env, timeout=TIMEOUT_S)
    return subprocess.run([sys.executable, "-m", "opscope", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=TIMEOUT_S)


def write_script(folder: Path, name: str, body: str) -> Path:
    path = folder / name
    path.write_text(textwrap.dedent(body))
    return path


def table_names(stdout: str) -> list:
    """Row names of the key_averages table printed on stdout."""
    lines = stdout.splitlines()
    header = next(i for i, line in enumerate(lines) if line.split()[:1] == ["Name"])
    names = []
    for line in lines[header + 2:]:
        if line.startswith("---"):
            break
        names.append(line.split("  ")[0].strip() or line.split()[0])
    return names


def trace_names(path: Path) -> set:
    with open(path) as f:
        doc = json.load(f)
    assert isinstance(doc["traceEvents"], list)
    return {e["name"] for e in doc["traceEvents"] if e.get("ph") == "X"}


def assert_usage_error(result: subprocess.CompletedProcess, *words: str) -> None:
    assert result.returncode == 2, result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("opscope: error: "), lines[0]
    assert "Traceback" not in result.stderr
    for word in words:
        assert word in lines[0], (word, lines[0])


# -- run ------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def plain_run(tmp_path_factory):
    """``opscope run -o out --row-limit 50 train.py``, no schedule and no record flags, run
    once for the tests that read it: (its CompletedProcess, its folder). Read it, never
    write into it."""
    folder = tmp_path_factory.mktemp("plain_run")
    write_script(folder, "train.py", TRAIN_SCRIPT)
    result = opscope_cli(None, "run", "-o", "out", "--row-limit", "50", "train.py", cwd=folder)
    return result, folder


def test_run_prints_table_and_writes_trace(plain_run):
    result, folder = plain_run
    assert result.returncode == 0, result.stderr
    names = table_names(result.stdout)
    assert "aten::addmm" in names
    trace = folder / "out" / "train.pt.trace.json"
    assert "aten::addmm" in trace_names(trace)
    assert os.path.join("out", "train.pt.trace.json") in result.stderr
    assert sorted(os.listdir(folder / "out")) == ["train.pt.trace.json"]


@pytest.mark.parametrize("launch", [[], ["--nproc-per-node", "2"]], ids=["run", "nproc"])
def test_run_script_with_a_syntax_error_writes_nothing(tmp_path, launch, warm_python):
    """Python's own message, exit 1, no trace, no table: there was nothing to profile."""
    write_script(tmp_path, "bad.py", "import torch\nx = (\n")
    result = opscope_cli(warm_python, "run", "-o", "out", *launch, "bad.py", cwd=tmp_path)
    assert result.returncode == 1
    assert result.stdout == ""
    assert result.stderr.splitlines()[-1] == "SyntaxError: '(' was never closed"
    assert 'bad.py", line 2' in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "out").exists()


def test_run_default_output_dir_and_row_limit(tmp_path, warm_python):
    write_script(tmp_path, "train.py", TRAIN_SCRIPT)
    result = opscope_cli(warm_python, "run", "--row-limit", "3", "--sort", "count", "train.py",
                         cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert len(table_names(result.stdout)) == 3
    assert (tmp_path / "opscope-out" / "train.pt.trace.json").is_file()


def test_run_passes_script_args_and_path_through(tmp_path, warm_python):
    scripts = tmp_path / "scripts"
    scripts.mkdir()
    write_script(scripts, "helper.py", "VALUE = 'from-the-script-folder'\n")
    write_script(scripts, "show.py", """\
        import json, sys
        import helper
        with open(sys.argv[1], "w") as f:
            json.dump({"argv": sys.argv, "name": __name__, "helper": helper.VALUE}, f)
        """)
    seen = tmp_path / "seen.json"
    script_args = [str(seen), "-o", "elsewhere", "--schedule", "nonsense", "--help", "--", "x y"]
    result = opscope_cli(warm_python, "run", "-o", "out", "scripts/show.py", *script_args,
                         cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    got = json.loads(seen.read_text())
    assert got == {"argv": ["scripts/show.py", *script_args], "name": "__main__",
                   "helper": "from-the-script-folder"}
    assert not (tmp_path / "elsewhere").exists()
    assert (tmp_path / "out" / "show.pt.trace.json").is_file()


def test_run_keeps_the_script_exit_code(tmp_path, warm_python):
    write_script(tmp_path, "quit.py", TRAIN_SCRIPT + "sys.exit(3)\n")
    result = opscope_cli(warm_python, "run", "-o", "out", "quit.py", cwd=tmp_path)
    assert result.returncode == 3, result.stderr
    assert "aten::addmm" in trace_names(tmp_path / "out" / "quit.pt.trace.json")


def test_run_exit_with_message_prints_it_and_exits_1(tmp_path, warm_python):
    write_script(tmp_path, "quit.py", "import sys\nsys.exit('stopping-here')\n")
    result = opscope_cli(warm_python, "run", "-o", "out", "quit.py", cwd=tmp_path)
    assert result.returncode == 1
    assert result.stderr.splitlines()[-1] == "stopping-here"


def test_run_uncaught_exception_prints_traceback_and_keeps_trace(tmp_path, warm_python):
    write_script(tmp_path, "boom.py", TRAIN_SCRIPT + textwrap.dedent("""\
        def fail():
            raise ValueError("boom-marker")
        fail()
        """))
    result = opscope_cli(warm_python, "run", "-o", "out", "boom.py", cwd=tmp_path)
    assert result.returncode == 1
    err = result.stderr
    assert "Traceback (most recent call last):" in err
    assert 'File "boom.py", line' in err and "in fail" in err
    assert err.rstrip().endswith("ValueError: boom-marker")
    assert "runpy" not in err and "opscope" not in err.split("Traceback")[1]
    assert "aten::addmm" in table_names(result.stdout)
    assert "aten::addmm" in trace_names(tmp_path / "out" / "boom.pt.trace.json")


def test_run_schedule_steps_on_optimizer_step(tmp_path, warm_python):
    write_script(tmp_path, "train.py", TRAIN_SCRIPT)
    result = opscope_cli(warm_python, "run", "-o", "out", "--schedule", "1,1,2,2",
                         "--row-limit", "-1",
                         "train.py", "8", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "ProfilerStep*" in table_names(result.stdout)
    out = tmp_path / "out"
    assert sorted(os.listdir(out)) == ["train.step3.pt.trace.json", "train.step7.pt.trace.json"]
    first, second = trace_names(out / "train.step3.pt.trace.json"), \
        trace_names(out / "train.step7.pt.trace.json")
    assert {n for n in first if n.startswith("ProfilerStep#")} == {"ProfilerStep#2",
                                                                   "ProfilerStep#3"}
    assert {n for n in second if n.startswith("ProfilerStep#")} == {"ProfilerStep#6",
                                                                    "ProfilerStep#7"}
    assert "Optimizer.step#SGD.step" in first and "aten::addmm" in first
    for name in ("train.step3.pt.trace.json", "train.step7.pt.trace.json"):
        assert os.path.join("out", name) in result.stderr


def test_run_schedule_window_cut_by_the_end_is_named_partial(tmp_path, warm_python):
    """Steps 0-1 make a whole window; step 2 and the end of the script after the third
    optimizer.step() (step 3, never finished) are written at stop as a partial window."""
    write_script(tmp_path, "train.py", TRAIN_SCRIPT)
    result = opscope_cli(warm_python, "run", "-o", "out", "--schedule", "0,0,2", "train.py", "3",
                         cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    out = tmp_path / "out"
    assert sorted(os.listdir(out)) == ["train.step1.pt.trace.json",
                                       "train.step3.partial.pt.trace.json"]
    partial = trace_names(out / "train.step3.partial.pt.trace.json")
    assert {n for n in partial if n.startswith("ProfilerStep#")} == {"ProfilerStep#2",
                                                                     "ProfilerStep#3"}


def test_run_schedule_never_reaching_a_window_says_so(tmp_path, warm_python):
    write_script(tmp_path, "train.py", TRAIN_SCRIPT)
    result = opscope_cli(warm_python, "run", "-o", "out", "--schedule", "5,1,1", "train.py", "2",
                         cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "nothing was recorded" in result.stderr
    assert os.listdir(tmp_path / "out") == []


def test_run_record_flags_reach_the_profiler(tmp_path, plain_run, warm_python):
    write_script(tmp_path, "train.py", TRAIN_SCRIPT)
    flags = {"--record-shapes": "record_shapes", "--memory": "profile_memory",
             "--stack": "with_stack", "--flops": "with_flops", "--modules": "with_modules"}
    result = opscope_cli(warm_python, "run", "-o", "on", *flags, "train.py", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    with open(tmp_path / "on" / "train.pt.trace.json") as f:
        doc = json.load(f)
    assert {doc.get(option) for option in flags.values()} == {1}
    addmm = [e for e in doc["traceEvents"] if e.get("name") == "aten::addmm"]
    assert addmm and "Input Dims" in addmm[0]["args"]
    assert "Self CPU Mem" in result.stdout

    result, folder = plain_run  # the same script without the flags
    assert result.returncode == 0, result.stderr
    with open(folder / "out" / "train.pt.trace.json") as f:
        doc = json.load(f)
    assert not any(option in doc for option in flags.values())
    assert "Self CPU Mem" not in result.stdout


# -- errors ---------------------------------------------------------------------------

@pytest.mark.parametrize("value", ["1,1", "-1,1,1"])
def test_run_bad_schedule_is_one_line_usage_error(tmp_path, value):
    write_script(tmp_path, "train.py", TRAIN_SCRIPT)
    result = opscope_cli(None, "run", "--schedule", value, "train.py", cwd=tmp_path)
    assert_usage_error(result, "--schedule")
    if not value.startswith("-"):
        assert "WAIT,WARMUP,ACTIVE[,REPEAT]" in result.stderr
    assert not (tmp_path / "opscope-out").exists()


def test_run_missing_script_is_usage_error(tmp_path):
    result = opscope_cli(None, "run", "-o", "out", "no_such_script.py", "--arg", cwd=tmp_path)
    assert_usage_error(result, "no_such_script.py", "not found")


def test_run_unwritable_output_dir_is_usage_error(tmp_path):
    write_script(tmp_path, "train.py", TRAIN_SCRIPT)
    (tmp_path / "a_file").write_text("")
    result = opscope_cli(None, "run", "-o", "a_file/sub", "train.py", cwd=tmp_path)
    assert_usage_error(result, "-o/--output-dir", "a_file/sub")


@pytest.mark.parametrize("args, words", [
    (["run", "--schedule", "a,b,c", "train.py"], ["--schedule", "WAIT,WARMUP,ACTIVE[,REPEAT]"]),
    (["run", "--schedule", "1,1,0", "train.py"], ["--schedule", "WAIT,WARMUP,ACTIVE[,REPEAT]"]),
    (["run", "--schedule", "1,1,3,4,5", "train.py"], ["--schedule"]),
    (["run", "--sort", "fastest", "train.py"], ["--sort", "fastest"]),
    (["run", "--row-limit", "0", "train.py"], ["--row-limit"]),
    (["run", "--no-such-flag", "train.py"], ["--no-such-flag"]),
    (["run", "--nproc-per-node", "0", "train.py"], ["--nproc-per-node", "'0'"]),
    (["run", "-o", "a_file", "train.py"], ["-o/--output-dir", "a_file"]),
    (["run", "folder"], ["SCRIPT", "folder"]),
    (["run"], ["SCRIPT"]),
    (["demo", "--steps", "two"], ["--steps"]),
    (["demo", "--steps", "2"], ["--steps", ">= 3"]),
    (["record"], ["record"]),
    ([], ["COMMAND"]),
])
def test_bad_arguments_are_one_line_usage_errors(tmp_path, monkeypatch, capsys, args, words):
    """In-process (fast): each of these fails before anything is profiled."""
    from opscope.cli.main import main

    write_script(tmp_path, "train.py", TRAIN_SCRIPT)
    (tmp_path / "a_file").write_text("")
    (tmp_path / "folder").mkdir()
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exit_info:
        main(args)
    out, err = capsys.readouterr()
    assert out == ""
    assert_usage_error(subprocess.CompletedProcess(args, exit_info.value.code, out, err), *words)
    assert not (tmp_path / "opscope-out").exists()


def test_bad_collector_environment_is_usage_error(tmp_path, monkeypatch, capsys):
    from opscope.cli.main import main

    write_script(tmp_path, "train.py", TRAIN_SCRIPT)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("OPSCOPE_COLLECTOR", "gpu")
    with pytest.raises(SystemExit) as exit_info:
        main(["run", "-o", "out", "train.py"])
    out, err = capsys.readouterr()
    assert_usage_error(subprocess.CompletedProcess([], exit_info.value.code, out, err),
                       "OPSCOPE_COLLECTOR", "gpu")


# -- demo and help --------------------------------------------------------------------

def test_demo_writes_its_trace(tmp_path, warm_python):
    result = opscope_cli(warm_python, "demo", "-o", "out", "--steps", "3", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    names = table_names(result.stdout)
    assert len(names) == 20 and any(n.startswith("aten::") for n in names)
    trace = tmp_path / "out" / "demo.pt.trace.json"
    assert os.path.join("out", "demo.pt.trace.json") in result.stderr
    recorded = trace_names(trace)
    assert {"forward", "backward", "Optimizer.step#SGD.step", "ProfilerStep#2"} <= recorded
    assert "ProfilerStep#1" not in recorded


@pytest.mark.parametrize("verb", [[], ["run"], ["demo"]])
def test_help_for_each_verb(tmp_path, verb):
    result = opscope_cli(None, *verb, "--help", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"usage: {' '.join(['opscope', *verb])}")
    assert result.stderr == ""


def test_console_script_entry_point_is_main():
    from opscope.cli.main import build_parser, main

    assert callable(main)
    verbs = build_parser()._subparsers._group_actions[0].choices
    assert {"run", "demo", "report", "trigger"} <= set(verbs)


# -- progress line --------------------------------------------------------------------

class _Terminal(io.StringIO):
    def __init__(self, tty: bool):
        super().__init__()
        self.tty = tty

    def isatty(self) -> bool:
        return self.tty


def test_progress_draws_only_on_a_terminal():
    import threading

    from opscope.cli.progress import progress

    shown = _Terminal(tty=True)
    with progress("crunching", stream=shown, delay_s=0.0):
        for _ in range(1000):  # until the line is drawn, at most 10 s
            if shown.getvalue():
                break
            threading.Event().wait(0.01)
    assert "opscope: crunching..." in shown.getvalue()
    assert shown.getvalue().endswith("\r\033[K")

    piped = _Terminal(tty=False)
    with progress("crunching", stream=piped, delay_s=0.0):
        threading.Event().wait(0.05)
    assert piped.getvalue() == ""


def test_run_profiler_steps_contain_their_optimizer_step(tmp_path, warm_python):
    """prof.step() runs after optimizer.step() returns, so the ranges nest, never cross."""
    write_script(tmp_path, "train.py", TRAIN_SCRIPT)
    result = opscope_cli(warm_python, "run", "-o", "out", "--schedule", "0,1,3,1", "train.py", "6",
                         cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    (name,) = os.listdir(tmp_path / "out")
    events = json.loads((tmp_path / "out" / name).read_text())["traceEvents"]
    spans = lambda prefix: [(e["ts"], e["ts"] + e["dur"]) for e in events  # noqa: E731
                            if e.get("ph") == "X" and e["name"].startswith(prefix)]
    steps, optim = spans("ProfilerStep#"), spans("Optimizer.step#")
    assert len(steps) == 3 and len(optim) == 3
    for start, end in optim:
        assert any(s <= start and end <= e for s, e in steps), (start, end, steps)


# -- run --report (issue 7) -------------------------------------------------------------

def test_run_report_writes_the_html_beside_each_trace(tmp_path, warm_python):
    write_script(tmp_path, "train.py", TRAIN_SCRIPT)
    result = opscope_cli(warm_python, "run", "-o", "out", "--report", "--schedule", "0,1,1,1",
                         "--modules", "train.py", "3", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert sorted(os.listdir(tmp_path / "out")) == ["train.step1.html",
                                                    "train.step1.pt.trace.json"]
    page = (tmp_path / "out" / "train.step1.html").read_text()
    assert page.startswith("<!DOCTYPE html>") and "aten::addmm" in page
    assert os.path.join("out", "train.step1.html") in result.stderr


def test_run_report_unavailable_is_usage_error(tmp_path, monkeypatch, capsys):
    """Without opscope.report, --report stops before the script runs."""
    from opscope.cli.main import main

    write_script(tmp_path, "train.py", "open('ran', 'w').close()\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setitem(sys.modules, "opscope.report", None)  # import now fails
    with pytest.raises(SystemExit) as exit_info:
        main(["run", "--report", "train.py"])
    out, err = capsys.readouterr()
    assert_usage_error(subprocess.CompletedProcess([], exit_info.value.code, out, err),
                       "--report", "unavailable")
    assert not (tmp_path / "ran").exists()
