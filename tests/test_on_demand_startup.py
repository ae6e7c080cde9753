"""The start-up hook: `OPSCOPE_ON_DEMAND=1 python train.py` for a script that never imports opscope.

The children here run this checkout. Its .pth file is put where Python reads it at
start-up: a temporary user site-packages (``PYTHONUSERBASE``), else a temporary
site folder that a ``sitecustomize`` adds. ``test_installed_*`` check the .pth that
pip installed, in this interpreter and in fresh venvs.
"""

from __future__ import annotations

import collections
import importlib.metadata
import json
import os
import shutil
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
from venvs import make_venv

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
    print("opscope from", getattr(sys.modules.get("opscope"), "__file__", None), flush=True)
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
    (tmp_path / "cwd").mkdir(exist_ok=True)  # run_python's
    if value is not None:
        env[_opscope_startup.ENABLE_ENV] = value
    return env


def run_python(code: str, env: dict, *args: str, timeout: float = 120):
    """``python ARGS -c CODE`` in a folder of its own (``-c`` puts the folder first on sys.path)."""
    return run_in_group([sys.executable, *args, "-c", code], env=env, timeout=timeout,
                        cwd=Path(env[control.CONTROL_DIR_ENV]).parent / "cwd")


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


def test_the_hook_module_examples():
    import doctest

    result = doctest.testmod(_opscope_startup)
    assert result.attempted > 0 and result.failed == 0


@pytest.mark.parametrize("argv, skipped", [
    (["python", "train.py"], False),
    (["python", "-u", "-X", "importtime", "train.py", "-m", "torch.distributed.run"], False),
    (["python", "-c", "import torch"], False),
    (["python", "-m", "mypackage.train"], False),
    (["/usr/bin/python3", "/venv/bin/torchrun", "--nproc-per-node", "2", "train.py"], True),
    (["python", "-m", "torch.distributed.launch", "train.py"], True),
    (["python", "-Wignore", "-mtorch.distributed.run", "train.py"], True),
    (["python", "-c", "from multiprocessing.forkserver import main; main(5, 6, ['__main__'])"],
     True),
    (["python", "-c", "from multiprocessing.resource_tracker import main;main(7)"], True),
    (["python", "-s", "-c", "from multiprocessing.spawn import spawn_main; spawn_main(5)",
      "--multiprocessing-fork"], True),
])
def test_which_processes_get_no_agent(argv, skipped):
    assert (_opscope_startup.skip_reason(argv) is not None) == skipped


def test_the_native_build_worker_gets_no_agent(tmp_path):
    """It imports torch to build the collector; on-demand there would build it again inside."""
    from opscope.collect.native import build as native_build

    worker = [native_build._RUN_WORKER, str(native_build._WORKER), str(tmp_path / "missing.cpp"),
              str(tmp_path), "x", str(os.getpid())]
    assert _opscope_startup.skip_reason(["python", "-c", *worker]) is not None
    done = run_in_group([sys.executable, "-X", "importtime", "-c", *worker],
                        env=hooked_env(tmp_path, "1"), cwd=tmp_path / "cwd", timeout=300)
    assert done.returncode == 1  # the missing source
    imported = [line.rsplit("|", 1)[-1].strip() for line in done.stderr.splitlines()
                if line.startswith("import time:")]
    assert "torch" in imported and "opscope" not in imported


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
    import json, os, sys
    from pathlib import Path
    import torch
    import opscope.on_demand
    from opscope.on_demand import control
    rank = int(os.environ["RANK"])
    # a file per rank: the ranks share one stdout, where their lines can interleave
    Path(sys.argv[1], f"report.{rank}.json").write_text(json.dumps({
        "rank": rank, "enabled": opscope.on_demand.is_enabled(),
        "launcher": control.read_registration(os.getppid()) is not None}))
""")


def test_torchrun_workers_get_an_agent_each_and_the_launcher_none(tmp_path):
    (tmp_path / "worker.py").write_text(WORKER)
    done = run_in_group([sys.executable, "-m", "torch.distributed.run", "--standalone",
                         "--nproc-per-node", "2", str(tmp_path / "worker.py"), str(tmp_path)],
                        env=hooked_env(tmp_path, "1"), timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    reports = [json.loads((tmp_path / f"report.{rank}.json").read_text()) for rank in (0, 1)]
    assert reports == [{"rank": 0, "enabled": True, "launcher": False},
                       {"rank": 1, "enabled": True, "launcher": False}]


def test_a_program_that_imports_opscope_is_enabled_by_that_import(tmp_path):
    code = ("import opscope, os, sys, _opscope_startup as s\n"
            "print(opscope.on_demand.is_enabled(), s.AfterTorchImport in map(type, sys.meta_path),"
            " sorted(os.listdir(os.environ['OPSCOPE_ON_DEMAND_DIR'])))")
    done = run_python(code, hooked_env(tmp_path, "1"))
    assert done.returncode == 0, done.stderr
    enabled, watching, files = done.stdout.split(" ", 2)
    assert (enabled, watching) == ("True", "False") and files.count(".json") == 1


# -- the .pth as pip installs it ----------------------------------------------------------------
def test_installed_opscope_has_the_pth_in_site_packages():
    # installed by pip: a RECORD (a checkout's opscope.egg-info has none)
    installed = [d for d in importlib.metadata.distributions(name="opscope")
                 if d.read_text("RECORD") is not None]
    if not installed:
        pytest.skip("opscope is not installed in this interpreter (the tests run the checkout)")
    dist = installed[0]
    if "_opscope_startup" not in (dist.read_text("top_level.txt") or "").split():
        pytest.skip("the installed opscope predates the start-up hook; reinstall it "
                    "(pip install -e .) to check its .pth")
    listed = [f for f in dist.files or () if f.name == _opscope_startup.PTH_NAME]
    assert [str(f) for f in listed] == [_opscope_startup.PTH_NAME], "not at the wheel's root"
    path = Path(dist.locate_file(listed[0]))
    assert str(path) in _opscope_startup.installed_pth_files()  # in a site-packages folder
    assert path.read_text() == _opscope_startup.PTH_LINE + "\n", f"{path} is stale: reinstall"


def fresh_venv(tmp_path: Path, editable: bool) -> Path:
    """A venv that sees this interpreter's packages (torch), with this checkout pip-installed.

    The venv builds with this interpreter's setuptools (tests/venvs.py), so that is the one
    the skip reads."""
    setuptools = _version("setuptools") or ()
    if setuptools < (64,) or (setuptools < (70, 1) and _version("wheel") is None):
        pytest.skip(f"setuptools {setuptools} cannot build the wheel offline (64, and 70.1 or "
                    f"wheel, are needed)")
    if _version("pip") is None:
        pytest.skip("pip is not installed in this interpreter")
    source = tmp_path / "source"  # a copy: the build writes build/ and egg-info beside it
    shutil.copytree(REPO / "opscope", source / "opscope",
                    ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "setup.py", "_opscope_startup.py", "README.md"):
        shutil.copy2(REPO / name, source / name)
    venv = tmp_path / "venv"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "OPSCOPE"))}
    make_venv(venv, env=env)  # sees this interpreter's torch, pip and setuptools
    done = run_in_group([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--no-deps",
                         "--no-build-isolation", "--no-index", *(["-e"] if editable else []),
                         str(source)], env=env, cwd=tmp_path, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    return venv


def _version(name: str):
    """The installed version of ``name`` as a tuple of ints; () when unreadable, None if absent."""
    try:
        text = importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None
    parts = []
    for part in text.split(".")[:3]:
        if not part.isdigit():
            break
        parts.append(int(part))
    return tuple(parts)


def venv_site_packages(venv: Path) -> Path:
    done = run_in_group([str(venv / "bin" / "python"), "-c",
                         "import sysconfig; print(sysconfig.get_path('purelib'))"], timeout=60)
    return Path(done.stdout.strip())


def check_pth_installed(venv: Path) -> Path:
    folder = venv_site_packages(venv)
    assert (folder / _opscope_startup.PTH_NAME).read_text() == _opscope_startup.PTH_LINE + "\n"
    record = next(folder.glob("opscope-*.dist-info")) / "RECORD"
    assert any(line.startswith(_opscope_startup.PTH_NAME + ",")
               for line in record.read_text().splitlines())  # so uninstall removes it
    return folder


def test_pip_install_puts_the_pth_in_site_packages_and_it_works(tmp_path, monkeypatch):
    venv = fresh_venv(tmp_path, editable=False)
    folder = check_pth_installed(venv)
    assert (folder / "_opscope_startup.py").is_file()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "OPSCOPE"))}
    env.update({_opscope_startup.ENABLE_ENV: "1",
                control.CONTROL_DIR_ENV: str(tmp_path / "control")})
    monkeypatch.setenv(control.CONTROL_DIR_ENV, env[control.CONTROL_DIR_ENV])
    (tmp_path / "train.py").write_text(TRAIN)
    stop = tmp_path / "stop"
    proc = subprocess.Popen([str(venv / "bin" / "python"), str(tmp_path / "train.py"), str(stop)],
                            env=env, cwd=tmp_path, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        wait_for_registration(proc)
        # the installed CLI, with the variable set as well (a user who exported it)
        done = run_in_group([str(venv / "bin" / "opscope"), "trigger", str(proc.pid), "--steps",
                             "2", "-o", str(tmp_path / "traces"), "--timeout", "90"],
                            env=env, cwd=tmp_path, timeout=180)
        stop.write_text("stop")
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    assert done.returncode == 0, done.stderr
    assert proc.returncode == 0, err
    check_two_step_trace(done.stdout.strip())
    assert out.splitlines()[-1] == f"opscope from {folder / 'opscope' / '__init__.py'}"

    done = run_in_group([str(venv / "bin" / "python"), "-m", "pip", "uninstall", "-y", "-q",
                         "opscope"], env=env, cwd=tmp_path, timeout=120)
    assert done.returncode == 0, done.stderr
    assert not (folder / _opscope_startup.PTH_NAME).exists()
    assert not (folder / "_opscope_startup.py").exists()


def test_pip_install_editable_puts_the_pth_in_site_packages(tmp_path):
    venv = fresh_venv(tmp_path, editable=True)
    check_pth_installed(venv)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "OPSCOPE"))}
    python = str(venv / "bin" / "python")
    done = run_in_group([python, "-c", MODULES], env=env, cwd=tmp_path, timeout=60)
    assert json.loads(done.stdout) == [], done.stderr
    env.update({_opscope_startup.ENABLE_ENV: "1",
                control.CONTROL_DIR_ENV: str(tmp_path / "control")})
    done = run_in_group([python, "-m", "pip", "--version"], env=env, cwd=tmp_path, timeout=60)
    assert (done.returncode, done.stderr) == (0, "")  # pip imports no torch: nothing happens
    done = run_in_group([python, "-c", "import sys, torch, opscope.on_demand as o; print("
                         "o.is_enabled(), sys.modules['_opscope_startup'].__file__, o.__file__)"],
                        env=env, cwd=tmp_path, timeout=120)
    assert done.returncode == 0, done.stderr
    source = tmp_path / "source"
    assert done.stdout.split() == [
        "True", str(source / "_opscope_startup.py"), str(source / "opscope" / "on_demand" /
                                                         "__init__.py")]
