"""On-demand profiling must never kill the job, nor act on files planted by another user.

The control folder is attacked (symlinks, wrong owner or mode, planted
files), a real training process is triggered with every option, and the
trigger's exit status is checked when the target dies or answers badly.
"""

from __future__ import annotations

import collections
import json
import os
import signal
import stat
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import warnings

import pytest

import opscope
from opscope.cli.main import main as cli_main
from opscope.on_demand import control
from subprocesses import run_in_group
from workloads import mlp_step_fn

SUBPROCESS_TIMEOUT_S = 120


@pytest.fixture
def control_folder(tmp_path, monkeypatch):
    folder = tmp_path / "control"
    monkeypatch.setenv(control.CONTROL_DIR_ENV, str(folder))
    return folder


def _victim_folder(tmp_path):
    victim = tmp_path / "checkpoints"
    victim.mkdir()
    for name in ("1000.pt", "2000.pt", "1000.json"):
        (victim / name).write_text("weights")
    return victim


def _dead_pid():
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    return dead.pid


def _run(cmd, env=None, timeout=SUBPROCESS_TIMEOUT_S):
    """Run ``cmd`` in its own process group; kill the group if it hangs."""
    proc = run_in_group(cmd, env=env, timeout=timeout)
    return proc.returncode, proc.stdout, proc.stderr


# -- the control folder ------------------------------------------------------------------------
def test_symlink_planted_at_the_default_control_folder_deletes_nothing(tmp_path, monkeypatch):
    # the attack from the issue: <tmp>/opscope-on-demand-<uid> -> the victim's checkpoints
    monkeypatch.delenv(control.CONTROL_DIR_ENV, raising=False)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    victim = _victim_folder(tmp_path)
    planted = tmp_path / f"opscope-on-demand-{os.getuid()}"
    planted.symlink_to(victim)
    with pytest.raises(control.ControlFolderError) as refused:
        opscope.enable_on_demand()
    message = str(refused.value)
    assert "\n" not in message and str(planted) in message and "symlink" in message
    assert not opscope.on_demand.is_enabled()
    assert signal.getsignal(signal.SIGUSR2) == signal.SIG_DFL  # nothing left installed

    monkeypatch.setenv("OPSCOPE_ON_DEMAND", "1")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert opscope.on_demand.enable_from_environment() is False
    assert len(caught) == 1 and str(planted) in str(caught[0].message)
    assert "\n" not in str(caught[0].message)
    with pytest.raises(control.ControlFolderError):
        control.remove_files_of_dead_processes()
    assert sorted(os.listdir(victim)) == ["1000.json", "1000.pt", "2000.pt"]
    assert planted.is_symlink()


def test_launcher_refuses_a_symlinked_control_folder_with_one_line(tmp_path):
    victim = _victim_folder(tmp_path)
    planted = tmp_path / "control"
    planted.symlink_to(victim)
    script = tmp_path / "train.py"
    script.write_text("print('trained')\n")
    env = dict(os.environ, **{control.CONTROL_DIR_ENV: str(planted)})
    code, out, err = _run([sys.executable, "-m", "opscope.on_demand", str(script)], env=env)
    assert code == 2 and "trained" not in out
    assert err.count("\n") == 1 and str(planted) in err, err
    assert sorted(os.listdir(victim)) == ["1000.json", "1000.pt", "2000.pt"]


def test_a_control_folder_with_group_or_other_access_is_refused(control_folder):
    control_folder.mkdir(mode=0o700)
    control_folder.chmod(0o755)
    with pytest.raises(control.ControlFolderError, match="mode 0755") as refused:
        control.control_dir()
    assert str(control_folder) in str(refused.value)
    with pytest.raises(control.ControlFolderError):
        control.register(os.getpid(), int(signal.SIGUSR2))
    assert os.listdir(control_folder) == []


def test_a_control_folder_of_another_user_is_refused(control_folder):
    if os.getuid() != 0:
        pytest.skip("needs root to chown the folder to another uid")
    control_folder.mkdir(mode=0o700)
    os.chown(control_folder, 65534, 65534)
    with pytest.raises(control.ControlFolderError, match="belongs to uid 65534"):
        control.control_dir()
    with pytest.raises(control.ControlFolderError):
        opscope.enable_on_demand()
    assert not opscope.on_demand.is_enabled()


def test_a_file_at_the_control_folder_path_is_refused(control_folder):
    control_folder.write_text("not a folder")
    with pytest.raises(control.ControlFolderError, match="cannot be opened as a folder"):
        control.control_dir()
    assert control_folder.read_text() == "not a folder"


def test_a_new_control_folder_is_private_whatever_the_umask(control_folder):
    previous = os.umask(0o777)
    try:
        control.control_dir()
    finally:
        os.umask(previous)
    info = os.lstat(control_folder)
    assert stat.S_ISDIR(info.st_mode) and stat.S_IMODE(info.st_mode) == 0o700


def test_planted_symlinks_named_like_control_files_are_not_followed(tmp_path, control_folder):
    control.control_dir()
    secret = tmp_path / "secret.json"
    secret.write_text(json.dumps({"id": "abcdef123456", "steps": 1, "output_dir": "/tmp"}))
    pid, dead = os.getpid(), _dead_pid()
    links = {
        "request": control_folder / f"{pid}.abcdef123456.request.json",
        "result": control_folder / f"{pid}.abcdef654321.result.json",
        "dead request": control_folder / f"{dead}.abcdef123456.request.json",
        "dead registration": control_folder / f"{dead}.json",
    }
    for link in links.values():
        link.symlink_to(secret)
    # not ours by name: never removed, even for a dead pid
    (control_folder / f"{dead}.pt").write_text("weights")
    # ours by name and kind, of a dead pid: removed
    leftovers = [control_folder / f".{dead}.0123456789abcdef.tmp",
                 control_folder / f"{dead}.abcdef999999.result.json"]
    for leftover in leftovers:
        leftover.write_text("{}")
    assert control.take_requests(pid) == []
    assert control.take_result(pid, "abcdef654321") is None
    assert control.read_registration(dead) is None
    control.remove_files_of_dead_processes()
    assert all(link.is_symlink() for link in links.values())
    assert (control_folder / f"{dead}.pt").read_text() == "weights"
    assert not any(leftover.exists() for leftover in leftovers)
    assert json.loads(secret.read_text())["steps"] == 1

    # writing our own file at a planted link's name replaces the link, never its target
    registration = control_folder / f"{pid}.json"
    registration.symlink_to(secret)
    control.register(pid, int(signal.SIGUSR2))
    assert not registration.is_symlink() and control.read_registration(pid)["pid"] == pid
    assert json.loads(secret.read_text())["steps"] == 1
    control.unregister(pid)


def test_odd_control_files_are_skipped_not_waited_on(control_folder):
    control.control_dir()
    pid = os.getpid()
    os.mkfifo(control_folder / f"{pid}.abcdef000001.request.json", 0o600)
    big = control_folder / f"{pid}.abcdef000002.request.json"
    big.write_text(json.dumps({"id": "abcdef000002", "steps": 1, "output_dir": "/tmp",
                               "pad": "x" * (control.MAX_FILE_BYTES + 1)}))
    taken = []
    reader = threading.Thread(target=lambda: taken.append(control.take_requests(pid)),
                              daemon=True)
    reader.start()
    reader.join(30)
    assert not reader.is_alive(), "take_requests blocked on a FIFO"
    assert taken == [[]]
    assert big.exists()
    with pytest.raises(ValueError, match="request id"):
        control.write_result(pid, "../../escape", status="ok")


def test_trigger_refuses_a_control_folder_that_is_not_private(tmp_path, control_folder,
                                                              capsys):
    control_folder.mkdir(mode=0o700)
    control_folder.chmod(0o755)
    with pytest.raises(SystemExit) as ended:
        cli_main(["trigger", str(os.getppid()), "-o", str(tmp_path / "out")])
    _, err = capsys.readouterr()
    assert ended.value.code == 2
    assert err.count("\n") == 1 and str(control_folder) in err and "mode 0755" in err


def test_a_signal_with_the_folder_gone_bad_warns_and_disabling_still_works(control_folder):
    opscope.enable_on_demand()
    try:
        control_folder.chmod(0o755)
        with pytest.warns(RuntimeWarning, match="trigger signal was ignored.*mode 0755"):
            opscope.on_demand._agent.on_signal()
    finally:
        with pytest.warns(RuntimeWarning, match="cannot withdraw the registration"):
            opscope.disable_on_demand()
    assert not opscope.on_demand.is_enabled()
    assert signal.getsignal(signal.SIGUSR2) == signal.SIG_DFL


# -- the training process survives every window ------------------------------------------------
def _serve_here(request, step_fn, steps):
    """Enable on-demand here, signal one request, run steps, disable; the result."""
    opscope.enable_on_demand()
    try:
        control.write_request(os.getpid(), request)
        os.kill(os.getpid(), signal.SIGUSR2)
        time.sleep(0.05)  # the handler runs at the next bytecode of the main thread
        for _ in range(steps):
            step_fn()
    finally:
        opscope.disable_on_demand()
    return control.take_result(os.getpid(), request["id"])


def test_a_memory_window_starts_and_stops_inside_the_optimizer_hook_loop(tmp_path,
                                                                         control_folder):
    # it used to end the training: "OrderedDict mutated during iteration"
    from torch.optim import optimizer as optim_module

    hooks_before = list(optim_module._global_optimizer_post_hooks)
    step = mlp_step_fn()
    step()
    request = control.new_request(2, str(tmp_path / "out"),
                                  options={"profile_memory": True, "with_modules": True})
    result = _serve_here(request, step, 4)
    assert result["status"] == "ok" and result["steps"] == 2
    assert "note" not in result  # the window closed by itself, inside optimizer.step()
    doc = json.load(open(result["trace"]))
    assert any(e.get("name") == "[memory]" for e in doc["traceEvents"])
    assert list(optim_module._global_optimizer_post_hooks) == hooks_before


TARGET_SCRIPT = textwrap.dedent("""
    import json, os, sys, time
    import torch
    stop_file = sys.argv[1]
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    x, y = torch.randn(8, 16), torch.randint(0, 4, (8,))
    steps = 0
    deadline = time.time() + 150
    while not os.path.exists(stop_file) and time.time() < deadline:
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        steps += 1
        if steps == 2:
            print("ready", os.getpid(), flush=True)
        time.sleep(0.002)
    print("final step", steps, flush=True)
""")

TRIGGER_OPTIONS = [["--memory"], ["--stack"], ["--record-shapes"], ["--modules"],
                   ["--memory", "--stack", "--record-shapes", "--modules"]]


def test_every_trigger_option_leaves_the_target_training(tmp_path, control_folder):
    script = tmp_path / "train.py"
    script.write_text(TARGET_SCRIPT)
    stop_file = tmp_path / "stop"
    env = dict(os.environ)
    target = subprocess.Popen([sys.executable, "-m", "opscope.on_demand", str(script),
                               str(stop_file)], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, env=env,
                              start_new_session=True)
    lines = []
    try:
        ready = target.stdout.readline()
        lines.append(ready)
        assert ready.startswith("ready"), ready + target.stdout.read()
        pid = int(ready.split()[1])
        for options in TRIGGER_OPTIONS:
            out_dir = tmp_path / "traces" / "_".join(o.strip("-") for o in options)
            code, out, err = _run([sys.executable, "-m", "opscope", "trigger", str(pid),
                                   "--steps", "2", "-o", str(out_dir), "--timeout", "90",
                                   *options], env=env)
            assert code == 0, (options, err)
            assert target.poll() is None, f"{options} ended the target"
            doc = json.load(open(out.strip()))
            names = collections.Counter(e["name"] for e in doc["traceEvents"]
                                        if e.get("ph") == "X")
            assert names["Optimizer.step#Adam.step"] == 2, (options, names)
            assert names["aten::linear"] == 4, options
            if "--memory" in options:
                assert any(e.get("name") == "[memory]" for e in doc["traceEvents"]), options
            if "--record-shapes" in options:
                assert any("Input Dims" in e.get("args", {}) for e in doc["traceEvents"])
        stop_file.write_text("stop")
        rest, _ = target.communicate(timeout=SUBPROCESS_TIMEOUT_S)
    except BaseException:
        os.killpg(target.pid, signal.SIGKILL)
        target.communicate()
        raise
    output = "".join(lines) + rest
    assert target.returncode == 0, output
    assert "final step" in output and "Traceback" not in output, output
    assert "mutated" not in output and "opscope" not in output.replace("opscope-", ""), output


# -- the trigger's exit status -----------------------------------------------------------------
def _answer_when_asked(pid, answer, stop):
    """Play the target: wait for the request file, then ``answer(request_id)``."""
    def play():
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not stop.is_set():
            for name in os.listdir(control.control_dir()):
                if name.startswith(f"{pid}.") and name.endswith(".request.json"):
                    answer(name.split(".")[1])
                    return
            time.sleep(0.02)

    thread = threading.Thread(target=play, daemon=True)
    thread.start()
    return thread


@pytest.fixture
def fake_target(control_folder):
    """A live process registered for on-demand with signal 0 (a signal that does nothing)."""
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    control.register(sleeper.pid, 0)
    yield sleeper
    sleeper.kill()
    sleeper.wait()


def _trigger(pid, out_dir, capsys):
    with pytest.raises(SystemExit) as ended:
        cli_main(["trigger", str(pid), "--steps", "1", "-o", str(out_dir), "--timeout", "60"])
    out, err = capsys.readouterr()
    return ended.value.code, out, err


@pytest.mark.parametrize("kind", ["missing", "folder", "fifo"])
def test_trigger_fails_when_the_answered_trace_is_no_file(tmp_path, fake_target, capsys, kind):
    trace = tmp_path / "answered.pt.trace.json"
    if kind == "folder":
        trace.mkdir()
    elif kind == "fifo":
        os.mkfifo(trace)
    stop = threading.Event()
    player = _answer_when_asked(fake_target.pid, lambda rid: control.write_result(
        fake_target.pid, rid, status="ok", trace=str(trace), steps=1), stop)
    code, out, err = _trigger(fake_target.pid, tmp_path / "out", capsys)
    stop.set()
    player.join()
    assert code == 1 and out == ""
    assert err.count("\n") == 1 and str(trace) in err
    assert ("cannot be found" if kind == "missing" else "not a regular file") in err


def test_trigger_refuses_a_malformed_registration(tmp_path, fake_target, capsys):
    control._write_json(f"{fake_target.pid}.json",
                        {"pid": fake_target.pid, "signal": "KILL", "start_time": None})
    code, out, err = _trigger(fake_target.pid, tmp_path / "out", capsys)
    assert code == 2 and err.count("\n") == 1 and "malformed" in err
    assert fake_target.poll() is None


def test_trigger_fails_when_the_target_dies_before_answering(tmp_path, fake_target, capsys):
    stop = threading.Event()
    player = _answer_when_asked(fake_target.pid, lambda rid: fake_target.kill(), stop)
    code, out, err = _trigger(fake_target.pid, tmp_path / "out", capsys)  # not reaped: a zombie
    stop.set()
    player.join()
    assert code == 1 and out == ""
    assert err.count("\n") == 1 and "exited before writing a trace" in err
