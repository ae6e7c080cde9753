"""On-demand profiling: a real training process, triggered from outside by `opscope trigger`."""

from __future__ import annotations

import collections
import json
import os
import queue
import re
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time

import pytest

import opscope
from opscope.cli.main import main as cli_main
from opscope.on_demand import control
from workloads import mlp_step_fn

TRAIN_SCRIPT = textwrap.dedent("""
    import json, os, sys, time
    import torch
    if os.environ.get("IMPORT_OPSCOPE"):
        import opscope  # OPSCOPE_ON_DEMAND=1 takes effect here
    stop_file = sys.argv[1]
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(8, 16), torch.randint(0, 4, (8,))
    from opscope.record_function import recording_collector
    from opscope.collect.native.build import load_native
    native = load_native()
    changes, recording, steps = [], False, 0
    deadline = time.time() + 90
    while not os.path.exists(stop_file) and time.time() < deadline:
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        steps += 1
        now = recording_collector() is not None or bool(native and native.is_recording())
        if now != recording:
            changes.append(now)
            recording = now
        if steps == 2:
            print("ready", os.getpid(), flush=True)
        time.sleep(0.003)
    import opscope.on_demand
    print(json.dumps({"steps": steps, "changes": changes,
                      "enabled": opscope.on_demand.is_enabled()}), flush=True)
""")


class Child:
    """A training subprocess whose stdout lines are read on a thread."""

    def __init__(self, tmp_path, env_extra, launcher):
        self.script = tmp_path / "train.py"
        self.script.write_text(TRAIN_SCRIPT)
        self.stop_file = tmp_path / "stop"
        env = dict(os.environ, **env_extra)
        cmd = [sys.executable] + (["-m", "opscope.on_demand"] if launcher else []) + \
            [str(self.script), str(self.stop_file)]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True, env=env)
        self.lines: "queue.Queue[str]" = queue.Queue()
        self.output = []
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self):
        for line in self.proc.stdout:
            self.output.append(line)
            self.lines.put(line)
        self.lines.put("")

    def wait_ready(self, timeout=60.0):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=deadline - time.monotonic())
            except queue.Empty:
                break
            if line.startswith("ready"):
                return int(line.split()[1])
            if line == "":
                break
        self.kill()
        pytest.fail("the training process did not start:\n" + "".join(self.output))

    def finish(self, timeout=60.0):
        self.stop_file.write_text("stop")
        code = self.proc.wait(timeout=timeout)
        time.sleep(0.1)  # let the reader thread take the last lines
        return code, json.loads(self.output[-1]) if self.output else None

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def control_folder(tmp_path, monkeypatch):
    folder = tmp_path / "control"
    monkeypatch.setenv(control.CONTROL_DIR_ENV, str(folder))
    return folder


def run_trigger(args, capsys):
    with pytest.raises(SystemExit) as ended:
        cli_main(["trigger", *args])
    out, err = capsys.readouterr()
    return ended.value.code, out, err


def trace_counts(path):
    doc = json.load(open(path))
    names = collections.Counter(e["name"] for e in doc["traceEvents"] if e.get("ph") == "X")
    return doc, names


def test_trigger_profiles_the_next_steps_of_a_running_process(tmp_path, control_folder, capsys):
    out_dir = tmp_path / "traces"
    child = Child(tmp_path, {}, launcher=True)
    try:
        pid = child.wait_ready()
        code, out, err = run_trigger([str(pid), "--steps", "3", "-o", str(out_dir),
                                      "--timeout", "60"], capsys)
        assert code == 0, err
        path = out.strip()
        assert os.path.dirname(path) == str(out_dir)
        assert re.fullmatch(re.escape(f"{socket.gethostname()}_{pid}.") + r"\d+\.pt\.trace\.json",
                            os.path.basename(path))
        doc, names = trace_counts(path)
        assert doc["onDemand"]["steps"] == 3
        # three whole iterations: zero_grad, forward (2 Linear), backward, step
        assert names["Optimizer.step#SGD.step"] == 3
        assert names["Optimizer.zero_grad#SGD.zero_grad"] == 3
        assert names["aten::linear"] == 6
        assert names["autograd::engine::evaluate_function: AddmmBackward0"] == 6

        # a window longer than the wait: the trigger gives up, the request stays served
        code, _, err = run_trigger([str(pid), "--steps", "100000", "-o", str(out_dir),
                                    "--timeout", "1"], capsys)
        assert code == 1
        assert err.startswith("opscope: error: process") and "has not finished" in err
        assert err.count("\n") == 1
        code, final = child.finish()
    finally:
        child.kill()
    assert code == 0, "".join(child.output)
    # recording switched on, off (back to no overhead), and on for the second request
    assert final["changes"] == [True, False, True] and final["enabled"] is True
    # the process exited inside the second window: what it recorded was still written
    traces = sorted(p for p in os.listdir(out_dir) if p.endswith(".pt.trace.json"))
    assert len(traces) == 2
    partial = [json.load(open(out_dir / t)) for t in traces]
    assert sorted(d["onDemand"]["steps"] for d in partial) == [3, 100000]
    left = os.listdir(control_folder)
    assert not [name for name in left if not name.endswith(".result.json")], left


def test_environment_variable_enables_a_process_that_imports_opscope(tmp_path, control_folder,
                                                                      capsys):
    child = Child(tmp_path, {"OPSCOPE_ON_DEMAND": "1", "IMPORT_OPSCOPE": "1"}, launcher=False)
    try:
        pid = child.wait_ready()
        code, out, err = run_trigger([str(pid), "--steps", "2", "-o", str(tmp_path / "t"),
                                      "--timeout", "60", "--record-shapes"], capsys)
        assert code == 0, err
        doc, names = trace_counts(out.strip())
        assert names["Optimizer.step#SGD.step"] == 2
        assert doc.get("record_shapes") == 1
        assert any("Input Dims" in e.get("args", {}) for e in doc["traceEvents"])
        code, final = child.finish()
    finally:
        child.kill()
    assert code == 0 and final["changes"] == [True, False]


def test_bad_pids_are_one_line_usage_errors(tmp_path, control_folder, capsys):
    code, out, err = run_trigger(["not-a-pid"], capsys)
    assert code == 2 and err.count("\n") == 1 and "PID" in err
    code, out, err = run_trigger(["999999999", "-o", str(tmp_path / "o")], capsys)
    assert code == 2 and "no process with id 999999999" in err and err.count("\n") == 1
    # a live process that never enabled on-demand profiling is not signalled (it would die)
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        code, out, err = run_trigger([str(sleeper.pid), "-o", str(tmp_path / "o")], capsys)
        assert code == 2 and "not enabled for on-demand profiling" in err
        time.sleep(0.2)
        assert sleeper.poll() is None
    finally:
        sleeper.kill()
        sleeper.wait()
    assert not (tmp_path / "o").exists()


def _serve_in_this_process(steps, requests, step_fn):
    """Enable on-demand here, send requests by signal, run 1 + ``steps`` optimizer steps,
    disable; return the results by request id."""
    opscope.enable_on_demand()
    try:
        for request in requests:
            control.write_request(os.getpid(), request)
        os.kill(os.getpid(), signal.SIGUSR2)
        time.sleep(0.05)  # the handler runs at the next bytecode of the main thread
        for _ in range(steps + 1):
            step_fn()
    finally:
        opscope.disable_on_demand()  # waits for the trace writer; ends an open window
    results = {}
    for request in requests:
        results[request["id"]] = control.take_result(os.getpid(), request["id"])
    return results


def test_in_process_window_under_each_collector(tmp_path, control_folder, collector_name):
    step = mlp_step_fn()
    step()
    first = control.new_request(2, str(tmp_path / "out"))
    second = control.new_request(2, str(tmp_path / "out"))  # while the first is armed: busy
    results = _serve_in_this_process(2, [first, second], step)
    assert results[first["id"]]["status"] == "ok"
    assert results[second["id"]]["status"] == "error"
    assert "busy" in results[second["id"]]["message"]
    doc, names = trace_counts(results[first["id"]]["trace"])
    assert names["Optimizer.step#SGD.step"] == 2
    assert signal.getsignal(signal.SIGUSR2) == signal.SIG_DFL  # restored
    assert control.read_registration(os.getpid()) is None


def test_disabling_mid_window_writes_what_was_recorded(tmp_path, control_folder):
    step = mlp_step_fn()
    request = control.new_request(50, str(tmp_path / "out"))
    results = _serve_in_this_process(2, [request], step)
    result = results[request["id"]]
    assert result["status"] == "ok" and result["steps"] == 2
    assert "after 2 of 50 steps" in result["note"]
    _, names = trace_counts(result["trace"])
    assert names["Optimizer.step#SGD.step"] == 2


def test_enable_refuses_a_signal_the_program_handles():
    previous = signal.signal(signal.SIGUSR1, lambda *a: None)
    try:
        with pytest.raises(RuntimeError, match="SIGUSR1 already has a handler"):
            opscope.enable_on_demand(signal="USR1")
    finally:
        signal.signal(signal.SIGUSR1, previous)
    assert not opscope.on_demand.is_enabled()
    errors = []
    worker = threading.Thread(target=lambda: _catch(errors, opscope.enable_on_demand))
    worker.start()
    worker.join()
    assert errors and "main thread" in str(errors[0])
    with pytest.raises(ValueError, match="unknown signal name"):
        opscope.enable_on_demand(signal="SIGNOPE")


def _catch(errors, fn):
    try:
        fn()
    except Exception as exc:  # noqa: BLE001
        errors.append(exc)


def test_control_folder_must_be_private(tmp_path, monkeypatch):
    folder = tmp_path / "shared"
    folder.mkdir()
    folder.chmod(0o777)
    monkeypatch.setenv(control.CONTROL_DIR_ENV, str(folder))
    with pytest.raises(control.ControlFolderError, match="has mode 0777"):
        control.control_dir()


def test_stale_registration_is_ignored(control_folder):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    control.register(dead.pid, int(signal.SIGUSR2))
    assert control.read_registration(dead.pid) is None
    assert not os.path.exists(control.registration_path(dead.pid))
