"""Every verb ends quietly when its reader closes the pipe (``opscope query ... | head``).

Each verb runs as a subprocess whose stdout (or stdout and stderr) is a pipe
whose reading end is already closed, so its first write fails with EPIPE. A
quiet end is status 0 or 141 (as a process stopped by SIGPIPE) and nothing on
stderr about the pipe; a traceback would be status 1, and Python's failed
flush at exit status 120.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

import opscope
from opscope.cli.main import VERBS
from opscope.cli.terminal import CLOSED_PIPE_EXIT

QUIET = (0, CLOSED_PIPE_EXIT)
SCRIPT = "import torch\n_ = torch.ones(3) + 1\n"
TARGET = textwrap.dedent("""
    import os, sys, time
    import torch
    import opscope
    opscope.enable_on_demand()
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    print("ready", flush=True)
    deadline = time.time() + 60
    while not os.path.exists(sys.argv[1]) and time.time() < deadline:
        model(torch.ones(2, 4)).sum().backward()
        opt.step()
        time.sleep(0.01)
""")


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """A trace, a folder of two rank traces, a store and a script."""
    root = tmp_path_factory.mktemp("closed_pipe")
    with opscope.profile() as prof:
        torch.nn.Linear(4, 2)(torch.ones(3, 4)).sum().backward()
    trace = root / "t.pt.trace.json"
    prof.export_chrome_trace(str(trace))
    ranks = root / "ranks"
    ranks.mkdir()
    for rank in (0, 1):
        shutil.copy(trace, ranks / f"job.rank{rank}.pt.trace.json")
    prof.export_store(str(root / "store"))
    (root / "script.py").write_text(SCRIPT)
    return root


def verb_commands(root) -> dict:
    """One command per verb that writes output (trigger's target is added by its test)."""
    return {
        "run": ["run", "-o", str(root / "run_out"), str(root / "script.py")],
        "demo": ["demo", "--steps", "3", "-o", str(root / "demo_out")],
        "report": ["report", str(root / "t.pt.trace.json"), "-o", str(root / "r.html")],
        "table": ["table", str(root / "t.pt.trace.json")],
        "diff": ["diff", str(root / "t.pt.trace.json"), str(root / "t.pt.trace.json")],
        "trigger": ["trigger", "--timeout", "0", str(2 ** 22 + 1)],  # no such process
        "ranks": ["ranks", str(root / "ranks")],
        "merge": ["merge", str(root / "ranks"), "-o", str(root / "merged.json")],
        "convert": ["convert", str(root / "t.pt.trace.json"), "-o", str(root / "store2")],
        "query": ["query", str(root / "store"), "SELECT name FROM events"],
    }


def run_into_closed_pipe(argv, *, stderr_too: bool, cwd, **popen):
    """Run ``python -m opscope argv`` writing into a pipe nobody reads; (status, stderr)."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    err_path = os.path.join(cwd, "stderr.txt")
    with open(err_path, "wb") as err:
        try:
            proc = subprocess.run([sys.executable, "-m", "opscope", *argv], cwd=cwd,
                                  stdin=subprocess.DEVNULL, stdout=write_end,
                                  stderr=write_end if stderr_too else err, timeout=300,
                                  **popen)
        finally:
            os.close(write_end)
    with open(err_path, encoding="utf-8", errors="replace") as err:
        return proc.returncode, err.read()


def test_every_verb_has_a_command():
    assert sorted(verb_commands(Path("/x"))) == sorted(v.__name__.rsplit(".", 1)[1] for v in VERBS)


@pytest.mark.parametrize("verb", sorted(verb_commands(Path("/x"))))
@pytest.mark.parametrize("stderr_too", [False, True], ids=["stdout", "stdout+stderr"])
def test_verb_ends_quietly_on_a_closed_pipe(files, tmp_path, verb, stderr_too):
    status, err = run_into_closed_pipe(verb_commands(files)[verb], stderr_too=stderr_too,
                                       cwd=str(tmp_path))
    expected = QUIET + ((2,) if verb == "trigger" and not stderr_too else ())
    assert status in expected, (status, err)
    assert "Traceback" not in err and "BrokenPipe" not in err and "Exception ignored" not in err


def test_help_ends_quietly_on_a_closed_pipe(tmp_path):
    status, err = run_into_closed_pipe(["--help"], stderr_too=False, cwd=str(tmp_path))
    assert status in QUIET, (status, err)
    assert err == ""


def test_run_keeps_the_scripts_status_when_stdout_closes(tmp_path):
    script = tmp_path / "fails.py"
    script.write_text("import sys, torch\n_ = torch.ones(2) * 2\nsys.exit(3)\n")
    status, err = run_into_closed_pipe(["run", "-o", str(tmp_path / "o"), str(script)],
                                       stderr_too=False, cwd=str(tmp_path))
    assert status == 3, err
    assert "Traceback" not in err and "wrote trace" in err


def test_trigger_ends_quietly_when_its_answer_cannot_be_printed(tmp_path):
    (tmp_path / "target.py").write_text(TARGET)
    stop = tmp_path / "stop"
    env = dict(os.environ, OPSCOPE_COLLECTOR="python")
    target = subprocess.Popen([sys.executable, str(tmp_path / "target.py"), str(stop)],
                              stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert target.stdout.readline().strip() == "ready"
        status, err = run_into_closed_pipe(
            ["trigger", str(target.pid), "--steps", "1", "--timeout", "120",
             "-o", str(tmp_path / "traces")], stderr_too=False, cwd=str(tmp_path), env=env)
    finally:
        stop.write_text("")
        target.wait(timeout=60)
    assert status in QUIET, (status, err)
    assert "Traceback" not in err and "BrokenPipe" not in err
    deadline = time.time() + 5
    while not os.listdir(tmp_path / "traces") and time.time() < deadline:
        time.sleep(0.1)
    assert os.listdir(tmp_path / "traces")
