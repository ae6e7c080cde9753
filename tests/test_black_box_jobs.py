"""The black box in real processes: each reason it writes for, a crash, memory, two ranks.

One module fixture starts every job at once (they mostly wait: a hang of 13 s, a 60 s
memory run, a 2-rank torchrun job on gloo), each in its own process group killed on
timeout; the tests then read what each wrote. The dumps are read back by opscope's own
loader and CLI, as a user would.
"""

from __future__ import annotations

import gzip
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from opscope.load import read_trace
from subprocesses import run_in_group

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "tests" / "job_workloads" / "black_box_job.py"
TIMEOUT_S = 240
MEMORY_RUN_S = 60


def _env(**extra):
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join(
        [str(REPO), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))
    env.pop("OPSCOPE_BLACKBOX", None)
    env.update(extra)
    return env


class Job:
    """A started process: its folder, and (once finished) its status and output."""

    def __init__(self, folder: Path, cmd, env=None):
        self.folder = folder
        self.proc = subprocess.Popen([str(c) for c in cmd], stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, cwd=str(folder),
                                     env=env or _env(), start_new_session=True)
        self.out = self.err = ""

    def wait_for_line(self, text: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if text in line:
                return
            if not line and self.proc.poll() is not None:
                break
        self.finish(5)
        pytest.fail(f"no {text!r} from {self.proc.args}: {self.err[-3000:]}")

    def finish(self, timeout: float = TIMEOUT_S) -> "Job":
        try:
            out, err = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            out, err = self.proc.communicate()
            pytest.fail(f"{self.proc.args} did not finish in {timeout} s: {err[-3000:]}")
        self.out += out
        self.err += err
        return self

    def dumps(self, reason: str):
        return sorted(self.folder.glob(f"*.blackbox.{reason}.*"))


def _script(tmp: Path, name: str, mode: str, *extra, env=None) -> Job:
    folder = tmp / name
    folder.mkdir()
    return Job(folder, [sys.executable, SCRIPT, mode, folder, *extra], env=env)


@pytest.fixture(scope="module")
def jobs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("black_box_jobs")
    started = {}
    try:
        _start_all(tmp, started)
        for job in started.values():
            if isinstance(job, Job):
                job.finish()
    finally:
        for job in started.values():
            if isinstance(job, Job) and job.proc.poll() is None:
                os.killpg(job.proc.pid, signal.SIGKILL)
                job.proc.communicate()
    started["env"].folder = started["env"].folder / "opscope-blackbox"  # the default
    return started


def _start_all(tmp: Path, started: dict) -> None:
    for name, mode, extra in (("slow", "slow", ()), ("stall", "stall", ()),
                              ("crash", "crash", ()), ("memory", "memory", (MEMORY_RUN_S,)),
                              ("loop", "loop", ())):
        started[name] = _script(tmp, name, mode, *extra)
    started["env"] = _script(tmp, "env", "loop", env=_env(OPSCOPE_BLACKBOX="1"))
    ranks = tmp / "ranks"
    ranks.mkdir()
    started["ranks"] = Job(ranks, [sys.executable, "-m", "torch.distributed.run",
                                   "--nproc-per-node", "2", "--standalone",
                                   SCRIPT, "ranks", ranks])
    cli = tmp / "cli"
    cli.mkdir()
    (cli / "fails.py").write_text("import torch\nx = torch.ones(3) * 2\n"
                                  "raise ValueError('the script fails')\n")
    started["cli"] = Job(cli, [sys.executable, "-m", "opscope", "run", "--black-box",
                               "--black-box-seconds", "10", "-o", cli / "out", "fails.py"])
    # SIGTERM: written first, then the default action (the process ends by the signal)
    started["loop"].wait_for_line("ready", TIMEOUT_S)
    time.sleep(1.0)  # some steps first
    started["loop"].proc.send_signal(signal.SIGTERM)
    # OPSCOPE_BLACKBOX=1 through the start-up hook; `opscope trigger --black-box` answers
    env_job = started["env"]
    env_job.wait_for_line("ready", TIMEOUT_S)
    time.sleep(1.0)
    started["trigger"] = run_in_group(
        [sys.executable, "-m", "opscope", "trigger", str(env_job.proc.pid), "--black-box",
         "--timeout", "60"], timeout=120, env=_env())
    env_job.proc.send_signal(signal.SIGTERM)


def _facts(path: Path) -> dict:
    with gzip.open(path, "rt") as f:
        return json.load(f)["opscopeBlackBox"]


def _op_names(path: Path) -> set:
    raw = read_trace(str(path))
    return {raw.names[i] for i in set(raw.records["name_id"].tolist())}


def test_a_slow_step_is_written_naming_the_op_that_made_it_slow(jobs):
    (dump,) = jobs["slow"].dumps("slow_step")
    facts = _facts(dump)
    assert facts["reason"] == "slow_step" and "median" in facts["rule"]
    assert facts["slow_ops"][0]["name"] == "injected_stall", facts["slow_ops"]
    assert facts["step_ns"] > 3 * facts["median_ns"]
    assert {"aten::addmm", "injected_stall", "Optimizer.step#SGD.step"} <= _op_names(dump)


def test_an_uncaught_exception_is_written_and_the_users_hook_still_runs(jobs):
    job = jobs["slow"]
    assert job.proc.returncode == 1
    assert "RuntimeError: the training loop failed on purpose" in job.err  # Python's hook ran
    (dump,) = job.dumps("exception")
    facts = _facts(dump)
    assert facts["exception"] == "RuntimeError: the training loop failed on purpose"
    assert facts["thread"] == "MainThread"
    assert "aten::addmm" in _op_names(dump)


def test_sigterm_is_written_then_the_process_ends_by_the_signal(jobs):
    job = jobs["loop"]
    assert job.proc.returncode == -signal.SIGTERM, job.err[-2000:]
    (dump,) = job.dumps("signal")
    assert _facts(dump)["signal"] == "SIGTERM"
    assert "aten::addmm" in _op_names(dump)


def test_a_stall_is_written_while_it_lasts(jobs):
    job = jobs["stall"]
    assert job.proc.returncode == 0, job.err[-2000:]
    assert json.loads(job.out.splitlines()[-1]) == {"stall_dump_during_hang": True}
    (dump,) = job.dumps("stall")
    facts = _facts(dump)
    assert facts["waited_ns"] >= 10 * 10 ** 9 and "at least 10 s" in facts["rule"]


def test_the_environment_black_box_answers_a_trigger_and_a_sigterm(jobs):
    done = jobs["trigger"]
    assert done.returncode == 0, done.stderr
    (printed,) = done.stdout.split()
    job = jobs["env"]
    assert [Path(printed).name] == [p.name for p in job.dumps("trigger")]
    assert Path(printed).parent.name == "opscope-blackbox"  # ./opscope-blackbox by default
    assert _facts(Path(printed))["reason"] == "trigger"
    assert job.proc.returncode == -signal.SIGTERM
    assert len(job.dumps("signal")) == 1


def test_a_segfault_writes_the_ring_raw_and_the_process_dies_as_it_would(jobs):
    job = jobs["crash"]
    assert job.proc.returncode == -signal.SIGSEGV, job.err[-2000:]
    (dump,) = job.dumps("fatal")
    assert dump.suffix == ".raw"
    raw = read_trace(str(dump))
    names = [raw.names[i] for i in raw.records["name_id"].tolist()]
    assert names.count("before_the_crash") > 100 and names.count("aten::add") > 100
    assert json.loads(raw.metadata["opscopeBlackBox"])["signal"] == "SIGSEGV"
    table = run_in_group([sys.executable, "-m", "opscope", "table", str(dump)], timeout=120)
    assert table.returncode == 0 and "before_the_crash" in table.stdout, table.stderr


def test_a_minute_of_ops_stays_within_max_mb(jobs):
    job = jobs["memory"]
    assert job.proc.returncode == 0, job.err[-2000:]
    facts = json.loads(job.out.splitlines()[-1])
    region = 2 * 2 ** 20  # the live window may overshoot by one region of the thread
    assert 0 < facts["largest_ring_bytes"] <= facts["max_bytes"] + region, facts
    assert facts["largest_ring_bytes"] >= facts["max_bytes"] // 2, facts  # the bound was met
    rss = facts["rss"]
    assert len(rss) >= MEMORY_RUN_S - 5
    # after the first windows the peak RSS stops growing: nothing is kept past max_mb
    assert rss[-1] - rss[10] < 16 * 2 ** 20, [r // 2 ** 20 for r in rss]


def test_a_dump_on_one_rank_brings_the_other_ranks(jobs):
    job = jobs["ranks"]
    assert job.proc.returncode == 0, job.err[-3000:]
    (one,) = job.folder.glob("black_box_job.rank1.blackbox.manual.*")
    (zero,) = job.folder.glob("black_box_job.rank0.blackbox.manual.*")
    assert _facts(one).get("origin_rank") is None
    facts = _facts(zero)
    assert facts["origin_rank"] == 1 and facts["job_dump"] >= 1
    with gzip.open(zero, "rt") as f:
        assert json.load(f)["distributedInfo"]["rank"] == 0
    ranks = run_in_group([sys.executable, "-m", "opscope", "ranks", str(job.folder)],
                         timeout=120)
    assert ranks.returncode == 0 and "World size 2" in ranks.stdout, ranks.stderr


def test_opscope_run_black_box_writes_under_its_output_folder(jobs):
    job = jobs["cli"]
    assert job.proc.returncode == 1
    assert "ValueError: the script fails" in job.err
    (dump,) = (job.folder / "out").glob("fails.blackbox.exception.*.pt.trace.json.gz")
    assert f"opscope: black box: wrote {dump}" in job.err
    assert "aten::mul" in _op_names(dump)
