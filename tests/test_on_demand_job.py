"""A whole-job trigger: ``opscope trigger`` on one rank of a 2-rank torchrun job (gloo).

The job runs under ``torchrun ... -m opscope.on_demand``; triggering rank 1 alone makes
both ranks record the same optimizer steps, and the trigger prints both traces. Unit
tests cover the step range each rank arms for and the "too late" answer.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from opscope.on_demand.agent import OnDemandAgent
from opscope.on_demand.job import margin_steps
from opscope.on_demand.job_request import check_job_request
from opscope.step_tracker import StepTracker
from subprocesses import run_in_group

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "tests" / "job_workloads" / "on_demand_job.py"
WORLD = 2
STEPS = 3


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_pids(folder: Path, proc: subprocess.Popen, timeout: float):
    deadline = time.monotonic() + timeout
    paths = [folder / f"pid.rank{r}" for r in range(WORLD)]
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        if all(p.exists() and p.read_text() for p in paths):
            return [int(p.read_text()) for p in paths]
        time.sleep(0.2)
    pytest.fail(f"the job's ranks did not start training in {timeout} s")


def test_trigger_one_rank_records_the_same_steps_on_every_rank(tmp_path):
    control = tmp_path / "control"
    traces = tmp_path / "traces"
    port = free_port()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(REPO), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
        OMP_NUM_THREADS="1", OPSCOPE_ON_DEMAND_DIR=str(control), PYTHONFAULTHANDLER="1",
        OPSCOPE_ON_DEMAND_OUTPUT=str(traces))  # the job's folder: a job's ranks write there
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(WORLD),
           "--master-addr", "127.0.0.1", "--master-port", str(port),
           "-m", "opscope.on_demand", str(SCRIPT), str(tmp_path)]
    job = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           env=env, cwd=str(tmp_path), start_new_session=True)
    try:
        pids = wait_for_pids(tmp_path, job, timeout=120)
        plant_outsider_requests(port, tmp_path / "outsider")
        done = run_in_group([sys.executable, "-m", "opscope", "trigger", str(pids[1]),
                             "--steps", str(STEPS), "-o", str(traces), "--timeout", "90"],
                            timeout=150, env=env)
        assert done.returncode == 0, done.stderr
        printed = done.stdout.split()
        assert len(printed) == WORLD, (done.stdout, done.stderr)
        docs = [json.loads(Path(p).read_text()) for p in printed]
        # naming every rank (the single-process way) still gives one window, one trace each
        both = run_in_group([sys.executable, "-m", "opscope", "trigger", *map(str, pids),
                             "--steps", "2", "-o", str(tmp_path / "both"), "--timeout", "90"],
                            timeout=150, env=env)
        assert both.returncode == 0, both.stderr
        (tmp_path / "stop").write_text("")
        _, err = job.communicate(timeout=90)
        assert job.returncode == 0, err[-3000:]
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
            job.communicate()
    for rank, (path, doc) in enumerate(zip(printed, docs)):
        assert Path(path).parent == traces and f".rank{rank}." in Path(path).name
        assert doc["distributedInfo"]["rank"] == rank
        assert doc["distributedInfo"]["world_size"] == WORLD
    windows = [(d["onDemand"]["first_step"], d["onDemand"]["steps"]) for d in docs]
    assert windows[0] == windows[1] and windows[0][1] == STEPS
    assert windows[0][0] > 5  # a future step: the ranks had trained 5 steps before
    assert {d["onDemand"]["request"] for d in docs} == {docs[0]["onDemand"]["request"]}
    assert all(d["onDemand"]["origin_rank"] == 1 for d in docs)
    again = [json.loads(Path(p).read_text()) for p in both.stdout.split()]
    assert sorted(d["distributedInfo"]["rank"] for d in again) == [0, 1]  # as they came
    assert len({json.dumps(d["onDemand"]) for d in again}) == 1
    assert again[0]["onDemand"]["first_step"] > windows[0][0] + STEPS
    assert not (tmp_path / "outsider").exists()  # the outsider's request chose no folder


def plant_outsider_requests(port: int, elsewhere: Path) -> None:
    """Another client of the job's store: a counter jump, a pending request far ahead with
    every option and a folder of its choice, and junk (issue 28: none may stop the trigger)."""
    import datetime

    from torch.distributed import TCPStore

    outsider = TCPStore("127.0.0.1", port, is_master=False,
                        timeout=datetime.timedelta(seconds=30))
    prefix = "default_pg/0//opscope/on_demand/"  # the default group's PrefixStores
    n = outsider.add(prefix + "requests", 10**9)
    outsider.set(f"{prefix}request/{n}", json.dumps({
        "id": "0badc0de", "steps": 5, "first_step": 5000, "origin": 0, "job": True,
        "output_dir": str(elsewhere), "options": {name: True for name in (
            "record_shapes", "profile_memory", "with_stack", "with_flops", "with_modules")}}))
    outsider.set(f"{prefix}request/{outsider.add(prefix + 'requests', 1)}", "[" * 60000)


class FakeJob:
    """Collects the answers an agent posts to the job (its store is open already)."""

    needs_store = False

    def __init__(self):
        self.answers = []

    def answer(self, request, fields):
        self.answers.append((request["id"], fields))


def job_request(first_step: int) -> dict:
    return {"id": "abc123", "steps": 2, "first_step": first_step, "output_dir": "/tmp/x",
            "options": {}, "origin": 0, "rank": 1, "job": True}


def test_a_rank_that_sees_the_request_too_late_records_nothing():
    agent = OnDemandAgent(pid=os.getpid())
    agent.job = FakeJob()
    now = StepTracker.current_step()
    agent.arm_job(job_request(first_step=now))  # its first step has begun
    assert agent.state == "idle"
    assert agent.job.answers[0][1]["status"] == "error"
    assert "too late" in agent.job.answers[0][1]["message"]


def test_an_armed_rank_that_misses_its_start_step_answers_too_late():
    agent = OnDemandAgent(pid=os.getpid())
    agent.job = FakeJob()
    now = StepTracker.current_step()
    agent.arm_job(job_request(first_step=now + 5))
    assert agent.state == "armed"
    agent.on_step(now + 1)  # not yet: still armed
    assert agent.state == "armed" and not agent.job.answers
    agent.on_step(now + 6)  # the step to start after (now + 4) was skipped
    assert agent.state == "idle"
    assert "too late" in agent.job.answers[0][1]["message"]


def test_margin_covers_the_polls_of_the_other_ranks():
    assert margin_steps([]) == 2
    assert margin_steps([(0.0, 0), (2.0, 0)]) == 2  # stalled: the minimum
    assert margin_steps([(0.0, 0), (1.0, 100)]) == 202  # 100 steps a second, 2 s


@pytest.mark.parametrize("change", [{"id": "../x"}, {"steps": 0}, {"first_step": "9"},
                                    {"rank": 1}, {"options": []}])
def test_malformed_job_requests_are_refused(change):
    request = {**job_request(9), **change}
    request.pop("rank") if "rank" not in change else None
    assert check_job_request(request, now_step=0, world_size=2)
    assert not check_job_request({k: v for k, v in job_request(9).items() if k != "rank"},
                                 now_step=0, world_size=2)


def test_the_trigger_lists_every_rank_and_names_the_missing(tmp_path, capsys):
    from opscope.cli import trigger

    own = tmp_path / "h_2.rank1.1.pt.trace.json"
    own.write_text("{}")
    job = {"folder": str(tmp_path), "world_size": 3, "first_step": 9,
           "ranks": {"0": {"status": "ok", "trace": "/elsewhere/h_1.rank0.1.pt.trace.json"},
                     "1": {"status": "ok", "trace": str(own)}}}
    assert trigger._report(2, {"status": "ok", "trace": str(own), "job": job}) == 0
    out, err = capsys.readouterr()
    assert out.split() == [str(own)]  # rank 0's answer names no file of this job's folder
    assert "rank 0: its answer names '/elsewhere/h_1.rank0.1.pt.trace.json'" in err
    assert f"rank 2 has not answered yet; look for its trace in {tmp_path}" in err
