"""``opscope run`` in a torch.distributed job: real torchrun on gloo, 2 ranks.

The jobs run ``tests/run_workloads/ddp_steps.py`` (a small DDP model, one
thread per rank) under both launch forms, ``torchrun ... -m opscope run`` and
``opscope run --nproc-per-node 2``: clean runs, a rank that fails and one that
torchrun then stops, and ranks hung until the process group's timeout. They are
shared by module-scoped fixtures.
The oracles are the files each rank writes, their ``distributedInfo``, the
collectives the workload counts, and ``opscope ranks --json``. The in-process
tests cover ``distributedInfo`` for a group created after ``start()``, the
launch command and the SIGTERM handler.
"""

from __future__ import annotations

import json
import os
import re
import signal
import sys
import time
from pathlib import Path
from typing import NamedTuple

import pytest
import torch
import torch.distributed as dist

import opscope
from opscope.cli.main import build_parser
from opscope.cli.main import main as cli_main
from opscope.cli.torchrun import (LOOPBACK_LAUNCHER, RUN_FILE, SIGTERM_EXIT, SigtermExit,
                                  launch_command)
from subprocesses import run_in_group

pytestmark = pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(),
                                reason="torch.distributed with gloo is not available")

REPO = Path(__file__).resolve().parent.parent
WORKLOAD = REPO / "tests" / "run_workloads" / "ddp_steps.py"
WORLD = 2
JOB_TIMEOUT_S = 240
TORCHRUN_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK")


class Job(NamedTuple):
    out: Path  # the traces (-o)
    counts: Path  # the workload's counts.rank<R>.txt
    done: object  # subprocess.CompletedProcess


def job_env() -> dict:
    env = {k: v for k, v in os.environ.items()
           if k not in ("OPSCOPE_COLLECTOR",) + TORCHRUN_VARS}
    env["PYTHONPATH"] = os.pathsep.join(
        [str(REPO), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env["OMP_NUM_THREADS"] = "1"
    return env


def run_job(folder: Path, launch: list, run_args: list, script_args: list) -> Job:
    """``launch + [opscope run options] WORKLOAD COUNTS script_args`` in ``folder``."""
    (folder / "counts").mkdir()
    cmd = [*launch, "-o", "out", *run_args, str(WORKLOAD), "counts", *script_args]
    done = run_in_group(cmd, timeout=JOB_TIMEOUT_S, env=job_env(), cwd=str(folder))
    return Job(folder / "out", folder / "counts", done)


TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone",
            "--nproc-per-node", str(WORLD), "-m", "opscope", "run"]
OPSCOPE_RUN = [sys.executable, "-m", "opscope", "run", "--nproc-per-node", str(WORLD)]


@pytest.fixture(scope="module")
def scheduled(tmp_path_factory) -> Job:
    """torchrun form, --schedule 1,1,2,2 over 8 steps: windows of steps 2-3 and 6-7."""
    job = run_job(tmp_path_factory.mktemp("scheduled"), TORCHRUN,
                  ["--schedule", "1,1,2,2", "--row-limit", "5"], ["--steps", "8"])
    assert job.done.returncode == 0, job.done.stderr[-3000:]
    return job


@pytest.fixture(scope="module")
def launched(tmp_path_factory) -> Job:
    """opscope run --nproc-per-node form, no schedule, with --report."""
    job = run_job(tmp_path_factory.mktemp("launched"), OPSCOPE_RUN,
                  ["--report", "--row-limit", "5"], ["--steps", "3"])
    assert job.done.returncode == 0, job.done.stderr[-3000:]
    return job


@pytest.fixture(scope="module")
def failing(tmp_path_factory) -> Job:
    """Rank 0 raises at step 2 while rank 1 waits; torchrun then stops rank 1 (SIGTERM)."""
    return run_job(tmp_path_factory.mktemp("failing"), OPSCOPE_RUN, [],
                   ["--steps", "4", "--fail-rank", "0", "--fail-step", "2"])


@pytest.fixture(scope="module")
def hung(tmp_path_factory) -> Job:
    """Rank 1 issues an extra broadcast at step 1: both ranks hang until the 3 s timeout."""
    return run_job(tmp_path_factory.mktemp("hung"), TORCHRUN, [],
                   ["--steps", "3", "--extra-rank", "1", "--extra-step", "1",
                    "--timeout-s", "3"])


def names_in(path: Path) -> set:
    return {e["name"] for e in json.loads(path.read_text())["traceEvents"]}


def table_headers(stdout: str) -> int:
    return sum(1 for line in stdout.splitlines() if line.split()[:1] == ["Name"])


def counts(job: Job, rank: int) -> list:
    return json.loads((job.counts / f"counts.rank{rank}.txt").read_text())


def ranks_json(folder: Path, capsys) -> dict:
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        cli_main(["ranks", str(folder), "--json"])
    out = capsys.readouterr().out
    assert exit_info.value.code == 0
    return json.loads(out)


# -- jobs ----------------------------------------------------------------------------

def test_each_rank_writes_its_own_files(scheduled, launched):
    assert sorted(os.listdir(scheduled.out)) == [
        f"ddp_steps.rank{r}.step{n}.pt.trace.json" for r in range(WORLD) for n in (3, 7)]
    assert sorted(os.listdir(launched.out)) == [
        f"ddp_steps.rank{r}{suffix}" for r in range(WORLD) for suffix in (".html",
                                                                          ".pt.trace.json")]


def test_only_rank_zero_prints_the_table_and_each_rank_names_itself(scheduled, launched):
    for job in (scheduled, launched):
        assert table_headers(job.done.stdout) == 1, job.done.stdout
        written = re.findall(r"^opscope: rank (\d): wrote (\w+) out/(\S+)",
                             job.done.stderr, re.M)
        assert sorted(written) == sorted(
            (name.split(".rank")[1][0], "report" if name.endswith(".html") else "trace", name)
            for name in os.listdir(job.out))


def test_with_a_schedule_every_rank_records_the_same_steps(scheduled):
    steps = {}
    for rank in range(WORLD):
        steps[rank] = {name for path in scheduled.out.glob(f"*.rank{rank}.*")
                       for name in names_in(path) if name.startswith("ProfilerStep#")}
    assert steps[0] == steps[1] == {f"ProfilerStep#{n}" for n in (2, 3, 6, 7)}


def test_every_trace_names_its_rank_in_distributed_info(scheduled, launched, failing):
    for job in (scheduled, launched, failing):
        traces = sorted(job.out.glob("*.pt.trace.json"))
        assert len(traces) >= WORLD
        for path in traces:
            info = json.loads(path.read_text())["distributedInfo"]
            rank = int(path.name.split(".rank")[1].split(".")[0])
            assert (info["backend"], info["rank"], info["world_size"]) == ("gloo", rank, WORLD)
            assert info["pg_count"] == 1 and info["pg_config"][0]["ranks"] == [0, 1]


def test_ranks_match_the_collectives_the_ranks_issued(scheduled, launched, capsys):
    doc = ranks_json(scheduled.out, capsys)
    recorded = [2, 3, 6, 7]  # the steps of the two windows
    issued = [sum(counts(scheduled, r)[n] for n in recorded) for r in range(WORLD)]
    assert doc["world_size"] == WORLD and doc["desync"] == []
    assert issued[0] == issued[1] == len(doc["collectives"]) > 0
    assert all(sorted(c["ranks"]) == ["0", "1"] for c in doc["collectives"])
    assert [r["steps"] for r in doc["ranks"]] == [len(recorded)] * WORLD
    # no schedule: the whole script, DDP's set-up broadcasts included
    doc = ranks_json(launched.out, capsys)
    assert doc["world_size"] == WORLD and doc["desync"] == []
    allreduces = [c for c in doc["collectives"] if c["kind"] == "allreduce"]
    assert len(allreduces) == sum(counts(launched, 0)) == sum(counts(launched, 1))


def test_a_failing_rank_and_a_terminated_rank_keep_their_traces(failing, capsys):
    done = failing.done
    assert done.returncode == 1, done.stderr[-3000:]  # torchrun's status, passed on
    assert "RuntimeError: rank 0 fails at step 2" in done.stderr
    assert re.search(r"^opscope: rank 1: stopped by SIGTERM", done.stderr, re.M), done.stderr
    assert sorted(os.listdir(failing.out)) == [
        f"ddp_steps.rank{r}.pt.trace.json" for r in range(WORLD)]
    for rank in range(WORLD):  # steps 0 and 1 ran on both ranks before the failure
        assert "c10d::allreduce_" in names_in(failing.out / f"ddp_steps.rank{rank}.pt.trace.json")
        assert len(counts(failing, rank)) == 2
    doc = ranks_json(failing.out, capsys)
    assert doc["world_size"] == WORLD and doc["desync"] == []


# -- in process ----------------------------------------------------------------------

@pytest.fixture
def no_torchrun_env(monkeypatch):
    for name in TORCHRUN_VARS:
        monkeypatch.delenv(name, raising=False)


def exported_info(prof, path):
    prof.export_chrome_trace(str(path))
    return json.loads(path.read_text()).get("distributedInfo")


def test_distributed_info_of_a_group_created_after_start(tmp_path, no_torchrun_env):
    for destroy_before_stop in (False, True):
        prof = opscope.profile()
        prof.start()
        store = dist.FileStore(str(tmp_path / f"store{destroy_before_stop}"), 1)
        dist.init_process_group("gloo", store=store, rank=0, world_size=1)
        try:
            dist.all_reduce(torch.ones(2))
            prof.step()  # the group is seen here ...
        finally:
            if destroy_before_stop:
                dist.destroy_process_group()  # ... and kept when it is gone by the stop
            prof.stop()
            if dist.is_initialized():
                dist.destroy_process_group()
        info = exported_info(prof, tmp_path / "trace.json")
        assert (info["backend"], info["rank"], info["world_size"]) == ("gloo", 0, 1)


def test_distributed_info_falls_back_to_torchrun_env(tmp_path, monkeypatch):
    for name, value in zip(TORCHRUN_VARS, ("1", "2", "1")):
        monkeypatch.setenv(name, value)
    with opscope.profile() as prof:
        _ = torch.ones(2) + 1
    assert exported_info(prof, tmp_path / "t.json") == {"rank": 1, "world_size": 2}


def test_profiles_without_torch_distributed(tmp_path, monkeypatch):
    monkeypatch.setattr(dist, "is_available", lambda: False)
    for name, value in zip(TORCHRUN_VARS, ("0", "2", "0")):
        monkeypatch.setenv(name, value)  # env only: still the fallback
    with opscope.profile() as prof:
        _ = torch.ones(2) + 1
    assert exported_info(prof, tmp_path / "t.json") == {"rank": 0, "world_size": 2}
    monkeypatch.delenv("RANK")
    with opscope.profile() as prof:
        _ = torch.ones(2) + 1
    assert exported_info(prof, tmp_path / "t.json") is None


def test_launch_passes_every_run_option_to_the_ranks():
    parser = build_parser()
    argv = ["run", "--nproc-per-node", "2", "-o", "out", "--schedule", "1,2,3,4", "--sort",
            "count", "--row-limit", "7", "--record-shapes", "--memory", "--stack", "--modules",
            "--flops", "--report", "--hang-after", "2.5", "--black-box",
            "--black-box-seconds", "12.5", "train.py", "--lr", "1",
            "-o", "x"]
    args = parser.parse_args(argv)
    run_parser = parser._subparsers._group_actions[0].choices["run"]
    for action in run_parser._actions:  # the argv above sets every option: a new one too
        if action.option_strings and action.dest != "help":
            assert getattr(args, action.dest) != action.default, action.dest
    cmd = launch_command(args)
    assert cmd[:12] == [sys.executable, "-c", RUN_FILE, LOOPBACK_LAUNCHER, "--standalone",
                        "--local-addr", "127.0.0.1", "--nproc-per-node", "2",
                        "-m", "opscope", "run"]  # torch's launcher, its stores on loopback
    assert vars(parser.parse_args(cmd[11:])) == {**vars(args), "nproc_per_node": None}


def test_nproc_per_node_inside_torchrun_is_a_usage_error(tmp_path, monkeypatch, capsys):
    (tmp_path / "train.py").write_text("")
    monkeypatch.chdir(tmp_path)
    for name, value in zip(TORCHRUN_VARS, ("1", "2", "1")):
        monkeypatch.setenv(name, value)
    with pytest.raises(SystemExit) as exit_info:
        cli_main(["run", "--nproc-per-node", "2", "train.py"])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2
    assert err.startswith("opscope: error: argument --nproc-per-node: this is already rank 1")
    assert not (tmp_path / "opscope-out").exists()


def test_sigterm_ends_the_script_after_the_step_and_is_then_only_noted():
    previous = signal.getsignal(signal.SIGTERM)
    term = SigtermExit({"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1"})
    assert SigtermExit({}).active is True  # outside torchrun too (issue 28, finding 8)
    term.install()
    done = []

    def step():
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.05)
        done.append("step")

    def script():
        term.shielded(step)
        done.append("after the step")  # never reached

    try:
        with pytest.raises(SystemExit) as exit_info:
            term.run(script)
        assert exit_info.value.code == SIGTERM_EXIT and done == ["step"] and term.received
        os.kill(os.getpid(), signal.SIGTERM)  # again, while the trace is written
        time.sleep(0.05)
    finally:
        term.uninstall()
    assert signal.getsignal(signal.SIGTERM) is previous


def test_ranks_hung_until_the_timeout_keep_their_traces(hung, capsys):
    assert hung.done.returncode != 0
    assert sorted(os.listdir(hung.out)) == [
        f"ddp_steps.rank{r}.pt.trace.json" for r in range(WORLD)]
    for rank in range(WORLD):
        info = json.loads((hung.out / f"ddp_steps.rank{rank}.pt.trace.json").read_text())[
            "distributedInfo"]
        assert (info["rank"], info["world_size"]) == (rank, WORLD)
    desync = ranks_json(hung.out, capsys)["desync"]
    assert [d["ranks"]["1"] for d in desync] == ["broadcast"], desync
