"""opscope's store threads never abort a rank at exit (real 2-rank torchrun jobs, gloo).

A thread still inside a c10d store call when the interpreter finalises aborts
the process ("terminate called without an active exception"). opscope's store
threads are stopped, and waited for, before that: the workload's threads call
the store without pause while the main thread returns.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from opscope.collect.job import store as job_store
from subprocesses import run_in_group
from test_clock_sync import free_port

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "tests" / "job_workloads" / "exit_job.py"
WORLD = 2


def run_exit_job(folder: Path, *args: str):
    folder.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(REPO), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
        OMP_NUM_THREADS="1", PYTHONFAULTHANDLER="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(WORLD),
           "--master-addr", "127.0.0.1", "--master-port", str(free_port()),
           str(SCRIPT), str(folder), *args]
    done = run_in_group(cmd, timeout=120, env=env, cwd=str(folder))
    assert done.returncode == 0, done.stderr[-3000:]
    return [tuple(map(int, (folder / f"polls.rank{r}").read_text().split()))
            for r in range(WORLD)]


def test_threads_in_store_calls_when_main_returns_do_not_abort(tmp_path):
    for attempt in range(3):
        polls = run_exit_job(tmp_path / str(attempt))
        assert all(user_running == 0 for _, user_running in polls)


def test_store_threads_serve_while_the_programs_own_threads_run(tmp_path):
    polls = run_exit_job(tmp_path, "--user-thread")
    # the opscope thread went on after main returned, while the program's thread ran
    assert all(after_main > 0 and user_running == 1 for after_main, user_running in polls)


def test_store_threads_are_joined_at_exit_where_calls_have_a_timeout():
    import threading

    import torch  # noqa: F401  (the Store class is torch's)

    assert job_store._store_calls_are_bounded()
    started = job_store.start_thread(lambda: None, "opscope-test")
    started.join()
    assert not started.daemon and hasattr(threading, "_register_atexit")
