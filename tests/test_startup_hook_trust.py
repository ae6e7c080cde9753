"""The start-up hook costs a program nothing it did not ask for (issue 28, findings 8, 18, 19).

With ``OPSCOPE_ON_DEMAND=1`` the hook runs in every Python process of the environment:
``import torch`` compiles nothing and starts no thread that exit must wait for, and a
SIGTERM still ends the process as it would have, after the window being recorded is
written, marked partial. The children read this checkout's .pth (``hooked_env``).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

from opscope.on_demand import control
from test_job_signals import terminate_when
from test_on_demand_startup import hooked_env, run_python, wait_for_registration

# the first line the script runs, after `import torch`: what opscope left running or built
FIRST_LINE = textwrap.dedent("""
    import os, sys, threading, json
    import torch
    cache = os.environ["OPSCOPE_CACHE_DIR"]
    print(json.dumps({
        "enabled": sys.modules["opscope.on_demand"].is_enabled(),
        "cache": sorted(os.listdir(cache)) if os.path.isdir(cache) else None,
        "threads": sorted((t.name, t.daemon) for t in threading.enumerate()),
    }))
""")


def test_importing_torch_builds_nothing_and_leaves_no_thread_to_wait_for(tmp_path):
    env = dict(hooked_env(tmp_path, "1"), OPSCOPE_CACHE_DIR=str(tmp_path / "empty-cache"),
               CXX=str(tmp_path / "no-compiler"))  # a build that starts fails at once
    done = run_python(FIRST_LINE, env)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    assert seen["enabled"] is True
    assert seen["cache"] is None  # no build was started: the cache folder was not even made
    assert seen["threads"] == [["MainThread", False]]  # exit waits for no thread of opscope's
    assert done.stderr == ""
    assert not (tmp_path / "empty-cache").exists()  # nor at exit


def test_the_main_threads_end_stops_the_job_thread_at_once(monkeypatch):
    """In a job the store thread polls; the end of the main thread wakes it, without a join."""
    import opscope.on_demand as on_demand

    closed = []

    class Job:
        def close(self, wait_s=2.0):
            closed.append(wait_s)

    class Agent:
        pid = os.getpid()
        job = Job()

    class ProgramThread:  # a thread of the program's own, still training
        daemon = False
        name = "trainer"

        def is_alive(self):
            return True

    monkeypatch.setattr(on_demand, "_agent", Agent())
    main = threading.main_thread()
    # the threads the pytest process has are not the program's: only the main one runs
    monkeypatch.setattr(threading, "enumerate", lambda: [main])
    on_demand._main_thread_done()
    assert closed == [0.0]
    monkeypatch.setattr(threading, "enumerate", lambda: [main, ProgramThread()])
    on_demand._main_thread_done()
    assert closed == [0.0]  # it stops by itself once that thread has ended


# A training script: steps until killed; a marker file once a window has recorded a step.
TRAIN = textwrap.dedent("""
    import os, sys, time
    import torch
    model = torch.nn.Linear(8, 8)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    marker = sys.argv[1]
    for _ in range(100000):
        opt.zero_grad(); model(torch.randn(4, 8)).sum().backward(); opt.step()
        agent = getattr(sys.modules.get("opscope.on_demand"), "_agent", None)
        window = getattr(agent, "_window", None)  # recording, a step done already
        if window is not None and window.remaining < window.request["steps"] \
                and not os.path.exists(marker):
            open(marker, "w").close()
        time.sleep(0.005)
""")


def sigterm_while_recording(run: Path, env: dict) -> tuple:
    """Trigger a long window, SIGTERM the process while it records; (returncode, answer, err)."""
    marker = run / "recording"
    proc = subprocess.Popen([sys.executable, str(run.parent / "train.py"), str(marker)],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    request = control.new_request(STEPS, str(run / "traces"))

    def trigger():
        wait_for_registration(proc)
        control.write_request(proc.pid, request)
        os.kill(proc.pid, control.read_registration(proc.pid)["signal"])

    err = terminate_when(marker, proc, before=trigger)
    return proc.returncode, control.take_result(proc.pid, request["id"]), err


STEPS = 500


def test_sigterm_writes_the_window_marked_partial_then_ends_as_sigterm(tmp_path, monkeypatch):
    (tmp_path / "train.py").write_text(TRAIN)
    for attempt in range(3):  # every time, not one run of two
        run = tmp_path / str(attempt)
        run.mkdir()
        env = dict(hooked_env(run, "1"), PYTHONFAULTHANDLER="1")  # stacks if it hangs
        monkeypatch.setenv(control.CONTROL_DIR_ENV, env[control.CONTROL_DIR_ENV])
        code, answer, err = sigterm_while_recording(run, env)
        assert code == -signal.SIGTERM, err  # killed by SIGTERM, as without opscope
        assert answer is not None and answer["status"] == "ok", (answer, err)
        assert "SIGTERM" in answer["note"]
        doc = json.load(open(answer["trace"]))
        assert doc["onDemand"]["partial"] is True
        assert 1 <= doc["onDemand"]["steps_recorded"] < STEPS
