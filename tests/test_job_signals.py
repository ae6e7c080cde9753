"""A rank of a job-wide on-demand window that outlives another rank keeps what it recorded.

A real 2-rank torchrun job (gloo, loopback): ``opscope trigger`` on rank 1 makes both
ranks record; rank 0 is SIGKILLed in the middle of the window. Rank 1 then fails in its
next collective or is stopped by torchrun's SIGTERM: either way it writes its trace,
marked partial (issue 28, finding 6). A single process under ``opscope run`` that gets
SIGTERM writes its window too, marked partial, and exits 143 (finding 8).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from test_on_demand_job import REPO, free_port, wait_for_pids

SCRIPT = REPO / "tests" / "job_workloads" / "killed_rank_job.py"
STEPS = 400


def wait_for(path: Path, proc: subprocess.Popen, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert proc.poll() is None and time.monotonic() < deadline, path
        time.sleep(0.1)


def terminate_when(marker: Path, proc: subprocess.Popen, before=None) -> str:
    """``before()``, then SIGTERM ``proc`` once ``marker`` exists; its stderr. The group is
    killed if anything fails on the way."""
    try:
        if before is not None:
            before()
        wait_for(marker, proc, timeout=120)
        os.kill(proc.pid, signal.SIGTERM)
        try:
            return proc.communicate(timeout=120)[1]
        except subprocess.TimeoutExpired as exc:  # a hang: its stacks (PYTHONFAULTHANDLER)
            os.kill(proc.pid, signal.SIGABRT)
            err = proc.communicate(timeout=30)[1]
            raise AssertionError(
                f"no exit 120 s after SIGTERM; its threads:\n{err[-6000:]}") from exc
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()


def test_the_survivor_of_a_killed_rank_writes_its_partial_window(tmp_path):
    traces = tmp_path / "traces"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(REPO), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
        OMP_NUM_THREADS="1", OPSCOPE_ON_DEMAND_DIR=str(tmp_path / "control"),
        PYTHONFAULTHANDLER="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
           "--master-addr", "127.0.0.1", "--master-port", str(free_port()),
           "-m", "opscope.on_demand", str(SCRIPT), str(tmp_path)]
    job = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           env=env, cwd=str(tmp_path), start_new_session=True)
    trigger = None
    try:
        pids = wait_for_pids(tmp_path, job, timeout=120)
        trigger = subprocess.Popen(
            [sys.executable, "-m", "opscope", "trigger", str(pids[1]), "--steps", str(STEPS),
             "-o", str(traces), "--timeout", "120"], env=env, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True, start_new_session=True)
        wait_for(tmp_path / "recording.rank1", job, timeout=120)
        wait_for(tmp_path / "recording.rank0", job, timeout=60)
        os.kill(pids[0], signal.SIGKILL)
        _, err = job.communicate(timeout=120)
        out, trigger_err = trigger.communicate(timeout=120)
    finally:
        for proc in (job, trigger):
            if proc is not None and proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.communicate()
    # under -o, or the job's own folder where the job store decides (issue 28, finding 1)
    written = sorted(tmp_path.rglob("*.rank1.*.pt.trace.json"))
    assert len(written) == 1, (err[-3000:], out, trigger_err)
    doc = json.loads(written[0].read_text())
    assert doc["onDemand"]["partial"] is True
    assert 1 <= doc["onDemand"]["steps_recorded"] < STEPS
    assert doc["distributedInfo"]["rank"] == 1
    assert not list(tmp_path.rglob("*.rank0.*.pt.trace.json"))  # the killed rank wrote nothing


# a script under `opscope run --schedule`: a marker once the window has recorded a step
RUN_SCRIPT = """
import os, sys, time
import torch
model = torch.nn.Linear(8, 8)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(100000):
    opt.zero_grad(); model(torch.randn(4, 8)).sum().backward(); opt.step()
    if step == 3:
        open(sys.argv[1], "w").close()
    time.sleep(0.01)
"""


def test_sigterm_under_opscope_run_writes_the_window_marked_partial(tmp_path):
    """A single process (no torchrun): the window being recorded is written, then exit 143."""
    (tmp_path / "train.py").write_text(RUN_SCRIPT)
    marker = tmp_path / "stepping"
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    proc = subprocess.Popen([sys.executable, "-m", "opscope", "run", "-o", str(tmp_path / "out"),
                             "--schedule", "0,1,100000,1", str(tmp_path / "train.py"), str(marker)],
                            env=env, cwd=str(tmp_path), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    err = terminate_when(marker, proc)
    assert proc.returncode == 143, err  # sys.exit(143), as a shell shows a SIGTERM
    assert "stopped by SIGTERM" in err
    written = [p.name for p in (tmp_path / "out").glob("*.pt.trace.json")]
    assert len(written) == 1 and ".partial." in written[0], (written, err)
