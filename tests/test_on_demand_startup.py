"""`OPSCOPE_ON_DEMAND=1 python train.py` for a script that never imports opscope (the start-up hook).

The children here run this checkout. Its .pth file is put where Python reads it at
start-up: a temporary user site-packages (``PYTHONUSERBASE``), else a temporary
site folder that a ``sitecustomize`` adds. ``test_installed_*`` check the .pth that
pip installed, in this interpreter and in fresh venvs.
"""

from __future__ import annotations

import collections
import json
import os
import signal
import site
import subprocess
import sys
import sysconfig
import textwrap
import time
from pathlib import Path

import pytest

import _opscope_startup
from opscope.analysis.build import load_session
from opscope.analysis.steps import step_breakdown
from opscope.cli.main import main as cli_main
from opscope.on_demand import control
from subprocesses import run_in_group

REPO = Path(__file__).resolve().parents[1]

# An unmodified training script: it never imports opscope. It trains until the stop file exists.
TRAIN = textwrap.dedent("""
    import os, sys, time
    print("before torch:", sorted(m for m in sys.modules if m.startswith(("opscope", "_opscope"))),
          flush=True)
    import torch
    model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(8, 16), torch.randint(0, 4, (8,))
    deadline = time.time() + 120
    while not os.path.exists(sys.argv[1]) and time.time() < deadline:
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        time.sleep(0.005)
""")


def hooked_env(tmp_path: Path, value, pythonpath=(REPO,)) -> dict:
    """The environment of a child that reads this checkout's .pth at start-up."""
    env = {k: v for k, v in os.environ.items()
           if k not in (_opscope_startup.ENABLE_ENV, "PYTHONUSERBASE", "PYTHONNOUSERSITE")}
    paths = [str(p) for p in pythonpath]
    if site.ENABLE_USER_SITE:  # the interpreter reads it while starting, as site-packages
        base = tmp_path / "userbase"
        folder = Path(sysconfig.get_path("purelib", f"{os.name}_user", {"userbase": str(base)}))
        env["PYTHONUSERBASE"] = str(base)
    else:
        folder, custom = tmp_path / "site", tmp_path / "sitecustomize"
        custom.mkdir(exist_ok=True)
        (custom / "sitecustomize.py").write_text(f"import site; site.addsitedir({str(folder)!r})\n")
        paths.append(str(custom))
    folder.mkdir(parents=True, exist_ok=True)
    (folder / _opscope_startup.PTH_NAME).write_text(_opscope_startup.PTH_LINE + "\n")
    env["PYTHONPATH"] = os.pathsep.join(paths)
    env[control.CONTROL_DIR_ENV] = str(tmp_path / "control")
    (tmp_path / "control-cwd").mkdir(exist_ok=True)
    if value is not None:
        env[_opscope_startup.ENABLE_ENV] = value
    return env


def run_python(code: str, env: dict, *args: str, timeout: float = 120):
    """``python ARGS -c CODE`` in a folder of its own (``-c`` puts the folder first on sys.path)."""
    return run_in_group([sys.executable, *args, "-c", code], env=env, timeout=timeout,
                        cwd=env[control.CONTROL_DIR_ENV] + "-cwd")


# opscope's modules and the hook's (not setuptools' finder of an editable install)
MODULES = ("import sys, json; print(json.dumps(sorted(m for m in sys.modules "
           "if m.startswith(('opscope', '_opscope')))))")


@pytest.mark.parametrize("value", [None, "", "0", " off "])
def test_without_the_variable_nothing_is_imported(tmp_path, value):
    done = run_python(MODULES, hooked_env(tmp_path, value), "-X", "importtime")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == []
    imported = [line for line in done.stderr.splitlines() if "opscope" in line]  # -X importtime
    assert all("__editable__" in line for line in imported), imported


def test_with_the_variable_only_the_hook_module_waits_for_torch(tmp_path):
    done = run_python(MODULES, hooked_env(tmp_path, "1"))
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == ["_opscope_startup"]  # no torch, no opscope
    assert done.stderr == ""


def wait_for_registration(proc: subprocess.Popen, timeout: float = 120.0) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()
        registration = control.read_registration(proc.pid)
        if registration is not None:
            return registration
        time.sleep(0.1)
    pytest.fail(f"the training process did not enable on-demand profiling in {timeout} s")


def trigger_and_stop(proc, stop: Path, args, capsys):
    """Trigger ``proc`` with the CLI's own code; stop it; return (exit code, stdout, stderr)."""
    try:
        with pytest.raises(SystemExit) as ended:
            cli_main(["trigger", str(proc.pid), *args])
        out, err = capsys.readouterr()
        stop.write_text("stop")
        child_out, child_err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    assert proc.returncode == 0, child_err
    return ended.value.code, out, err, child_out


def check_two_step_trace(path: str) -> None:
    doc = json.load(open(path))
    assert doc["onDemand"]["steps"] == 2
    names = collections.Counter(e["name"] for e in doc["traceEvents"] if e.get("ph") == "X")
    # two whole iterations: zero_grad, forward (2 Linear), backward, step
    assert names["Optimizer.step#SGD.step"] == 2
    assert names["Optimizer.zero_grad#SGD.zero_grad"] == 2
    assert names["aten::linear"] == 4
    assert names["autograd::engine::evaluate_function: AddmmBackward0"] == 4
    steps = step_breakdown(load_session(path))
    assert steps.source == "optimizer.step" and steps.names == ["step 1", "step 2"]


def test_an_unmodified_script_is_triggered(tmp_path, monkeypatch, capsys):
    env = hooked_env(tmp_path, "1")
    monkeypatch.setenv(control.CONTROL_DIR_ENV, env[control.CONTROL_DIR_ENV])
    (tmp_path / "train.py").write_text(TRAIN)
    proc = subprocess.Popen([sys.executable, str(tmp_path / "train.py"), str(tmp_path / "stop")],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        wait_for_registration(proc)
    except BaseException:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise
    code, out, err, child_out = trigger_and_stop(
        proc, tmp_path / "stop", ["--steps", "2", "-o", str(tmp_path / "traces"),
                                  "--timeout", "90"], capsys)
    assert code == 0, err
    assert child_out.splitlines()[0] == "before torch: ['_opscope_startup']"
    check_two_step_trace(out.strip())


def test_a_failing_hook_is_one_line_and_start_up_goes_on(tmp_path):
    broken = tmp_path / "broken"
    (broken / "opscope").mkdir(parents=True)
    (broken / "_opscope_startup.py").write_text("raise RuntimeError('boom')\n")
    done = run_python("print('alive')", hooked_env(tmp_path, "1", pythonpath=(broken, REPO)))
    assert (done.returncode, done.stdout) == (0, "alive\n")
    assert done.stderr.count("\n") == 1 and "start-up hook failed" in done.stderr
    assert "boom" in done.stderr

    # the hook is fine but opscope cannot be imported: the program's import of torch still works
    (broken / "_opscope_startup.py").unlink()
    (broken / "opscope" / "__init__.py").write_text("raise ImportError('no opscope here')\n")
    done = run_python("import torch; print('alive', torch.ones(2).sum().item())",
                      hooked_env(tmp_path, "1", pythonpath=(broken, REPO)))
    assert (done.returncode, done.stdout) == (0, "alive 2.0\n")
    assert done.stderr == ("opscope: warning: OPSCOPE_ON_DEMAND: on-demand profiling is not "
                           "enabled: importing opscope failed: ImportError: no opscope here\n")

    done = run_python("print('alive')", hooked_env(tmp_path, "maybe"))
    assert (done.returncode, done.stdout) == (0, "alive\n")
    assert done.stderr == ("opscope: warning: OPSCOPE_ON_DEMAND: the value 'maybe' is not "
                           "understood; expected 1 or 0\n")


SPAWNS = textwrap.dedent("""
    import json, multiprocessing, os, sys
    import torch
    if os.environ.get("IMPORT_OPSCOPE"):
        import opscope

    def report(queue):
        on_demand = sys.modules.get("opscope.on_demand")
        queue.put({"opscope": "opscope" in sys.modules,
                   "enabled": bool(on_demand and on_demand.is_enabled())})

    if __name__ == "__main__":
        import opscope.on_demand
        context = multiprocessing.get_context("spawn")
        queue = context.Queue()
        child = context.Process(target=report, args=(queue,))
        child.start()
        print(json.dumps({"enabled": opscope.on_demand.is_enabled(), "child": queue.get()}))
        child.join()
""")


@pytest.mark.parametrize("imports_opscope", [False, True])
def test_multiprocessing_children_get_no_agent(tmp_path, imports_opscope):
    """A spawned child (a DataLoader worker, say) imports the main module again, torch with it."""
    (tmp_path / "spawns.py").write_text(SPAWNS)
    env = dict(hooked_env(tmp_path, "1"), **({"IMPORT_OPSCOPE": "1"} if imports_opscope else {}))
    done = run_in_group([sys.executable, str(tmp_path / "spawns.py")], env=env, timeout=180)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {
        "enabled": True, "child": {"opscope": imports_opscope, "enabled": False}}


WORKER = textwrap.dedent("""
    import json, os
    import torch
    import opscope.on_demand
    from opscope.on_demand import control
    print(json.dumps({"rank": int(os.environ["RANK"]), "enabled": opscope.on_demand.is_enabled(),
                      "launcher": control.read_registration(os.getppid()) is not None}))
""")


def test_torchrun_workers_get_an_agent_each_and_the_launcher_none(tmp_path):
    (tmp_path / "worker.py").write_text(WORKER)
    done = run_in_group([sys.executable, "-m", "torch.distributed.run", "--standalone",
                         "--nproc-per-node", "2", str(tmp_path / "worker.py")],
                        env=hooked_env(tmp_path, "1"), timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    reports = sorted((json.loads(line) for line in done.stdout.splitlines()
                      if line.startswith("{")), key=lambda report: report["rank"])
    assert reports == [{"rank": 0, "enabled": True, "launcher": False},
                       {"rank": 1, "enabled": True, "launcher": False}]


def test_a_program_that_imports_opscope_is_enabled_by_that_import(tmp_path):
    code = ("import opscope, os, _opscope_startup as s\n"
            "print(opscope.on_demand.is_enabled(), s.AfterTorchImport in map(type, "
            "__import__('sys').meta_path), sorted(os.listdir(os.environ['OPSCOPE_ON_DEMAND_DIR'])))")
    done = run_python(code, hooked_env(tmp_path, "1"))
    assert done.returncode == 0, done.stderr
    enabled, watching, files = done.stdout.split(" ", 2)
    assert (enabled, watching) == ("True", "False") and files.count(".json") == 1
