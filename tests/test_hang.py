"""The live hang detector (``opscope run --hang-after``): a real job, and its protocol.

The real job (``tests/job_workloads/hang_job.py``, torchrun, 2 gloo ranks, one job for
the module) has rank 1 sleep 1.5 s before one all_reduce (a wait under ``--hang-after
3``: not a hang) and later skip one: the hang must be named, in hang.json and on rank 0's
stderr, within 15 s of the skip and while the job still hangs, and both ranks must write
their traces then. The test then kills the job instead of waiting for the process group's
40 s timeout. A balanced job writes no hang.json: test_run_distributed's jobs run with the
detector on (its default) and list their folders exactly.

The protocol tests run ranks as ``HangWatch`` objects in this process, on one in-memory
c10d store (``HashStore``), with sources of their own and a fake clock.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch.distributed as dist

from opscope.analysis.ranks.hangs import find_hang, parse_state, script_frame
from opscope.cli.main import main as cli_main
from opscope.collect.job.store import JobStore, key
from opscope.on_demand.hang import GATHER_S, HANG_FILE, HANG_KEY, HangWatch

pytestmark = pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(),
                                reason="torch.distributed with gloo is not available")

REPO = Path(__file__).resolve().parent.parent
WORKLOAD = REPO / "tests" / "job_workloads" / "hang_job.py"
HANG_AFTER_S = 3
NAMED_WITHIN_S = 15
START_LIMIT_S = 180  # torchrun and two ranks importing torch on a busy 2-core host
SKIP_STEP = 4  # step k's all_reduce is number k + 1 of the default group


def waits_here_line() -> int:
    lines = WORKLOAD.read_text().splitlines()
    return next(n for n, line in enumerate(lines, 1) if "# WAITS HERE" in line)


def wait_for(predicate, limit_s: float, proc) -> bool:
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        if proc.poll() is not None:
            return bool(predicate())
        time.sleep(0.1)
    return False


@pytest.fixture(scope="module")
def hung(tmp_path_factory):
    """The job, watched until both traces are written at the hang, then killed."""
    folder = tmp_path_factory.mktemp("hang")
    (folder / "flags").mkdir()
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "TORCH_FR_BUFFER_SIZE",
                        "OPSCOPE_COLLECTOR")}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
           "2", "-m", "opscope", "run", "-o", "out", "--hang-after", str(HANG_AFTER_S),
           str(WORKLOAD), "flags", "--slow-step", "1", "--slow-s", "1.5", "--skip-step",
           str(SKIP_STEP), "--timeout-s", "40"]
    with open(folder / "stderr.txt", "w") as err:
        proc = subprocess.Popen(cmd, cwd=str(folder), env=env, stdout=subprocess.DEVNULL,
                                stderr=err, start_new_session=True)
    out = folder / "out"
    traces = [out / f"hang_job.rank{r}.pt.trace.json" for r in (0, 1)]
    try:
        skipped = wait_for((folder / "flags" / "skipped").exists, START_LIMIT_S, proc)
        skipped_at = time.monotonic()
        named = skipped and wait_for((out / HANG_FILE).exists, NAMED_WITHIN_S, proc)
        named_after_s = time.monotonic() - skipped_at
        written = named and wait_for(lambda: all(p.exists() for p in traces), 30, proc)
        running = proc.poll() is None  # the job still hangs: opscope left it alone
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    stderr = (folder / "stderr.txt").read_text()
    assert skipped, stderr[-3000:]
    return dict(named=named, named_after_s=named_after_s, written=written, running=running,
                out=out, traces=traces, stderr=stderr)


def test_a_skipped_collective_is_named_while_the_job_hangs(hung):
    assert hung["named"], f"no hang.json {NAMED_WITHIN_S} s after the skip:\n" + hung["stderr"][-3000:]
    assert hung["written"] and hung["running"], hung["stderr"][-3000:]
    doc = json.loads((hung["out"] / HANG_FILE).read_text())
    assert (doc["group"], doc["group_desc"], doc["group_ranks"]) == ("0", "default_pg", [0, 1])
    assert (doc["seq"], doc["op"]) == (SKIP_STEP + 1, "gloo:all_reduce")  # not the slow one
    assert [e["rank"] for e in doc["inside"]] == [0] and doc["seconds"] >= HANG_AFTER_S
    (missing,) = doc["missing"]
    assert (missing["rank"], missing["answered"], missing["now_in"]) == (1, True, None)
    frame = script_frame(missing["stack"])
    assert (Path(frame["file"]).name, frame["line"]) == (WORKLOAD.name, waits_here_line())
    inside_frame = script_frame(doc["inside"][0]["stack"])
    assert Path(inside_frame["file"]).name == WORKLOAD.name  # rank 0: in its all_reduce call
    lines = [line for line in hung["stderr"].splitlines() if line.startswith("opscope: hang:")]
    assert len(lines) == 1, hung["stderr"][-3000:]
    assert "gloo:all_reduce #5 of group 0 (default_pg) entered by rank 0" in lines[0]
    assert f"rank 1 (not in a collective at {WORKLOAD.name}:{waits_here_line()})" in lines[0]


def test_every_rank_writes_what_it_recorded_at_the_hang(hung, capsys):
    for rank, path in enumerate(hung["traces"]):
        doc = json.loads(path.read_text())
        assert doc[HANG_KEY]["partial"] is True and doc["distributedInfo"]["rank"] == rank
        assert f"opscope: rank {rank}: at the hang: wrote trace out/{path.name}" in hung["stderr"]
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        cli_main(["ranks", str(hung["out"]), "--json"])
    assert exit_info.value.code == 0
    desync = json.loads(capsys.readouterr().out)["desync"]
    assert desync and desync[0]["ranks"]["0"] == "allreduce" and desync[0]["ranks"]["1"] is None


# -- the protocol, in process -----------------------------------------------------------

GROUPS = {"0": {"desc": "default_pg", "ranks": [0, 1]}}


class FakeRank:
    """One rank's source: its recorder's pending pairs and its state."""

    def __init__(self, rank: int, store, seq: int, inside: bool):
        self.rank, self.store = rank, store
        entered_ns = time.time_ns() - 20 * 10**9
        self.pairs = {"0": (seq, seq - 1) if inside else (seq - 1, seq - 1)}
        self.st = {"rank": rank, "groups": GROUPS, "entered": {"0": seq if inside else seq - 1},
                   "stack": [{"file": "/job/train.py", "line": 10 + rank, "function": "main"}],
                   "active": [{"group": "0", "seq": seq, "op": "gloo:all_reduce",
                               "entered_ns": entered_ns}] if inside else []}

    def ranks(self):
        return self.rank, 2

    def open_store(self):
        return JobStore(self.store, self.rank, 2, cloned=False)

    def pending(self):
        return self.pairs

    def state(self, rank):
        return self.st


class CountingStore:
    """A HashStore that counts the calls made on it."""

    def __init__(self):
        self.inner, self.calls = dist.HashStore(), 0

    def __getattr__(self, name):
        attr = getattr(self.inner, name)
        if callable(attr):
            def counted(*args):
                self.calls += 1
                return attr(*args)
            return counted
        return attr


def watches(tmp_path, store, hang_after_s=3.0):
    hangs = []
    made = []
    for rank, inside in ((0, True), (1, False)):
        made.append(HangWatch(str(tmp_path), "out", hang_after_s,
                              on_hang=lambda rank=rank: hangs.append(rank),
                              source=FakeRank(rank, store, 7, inside)))
    return made, hangs


def test_the_protocol_names_the_missing_rank_and_every_rank_writes(tmp_path):
    store = dist.HashStore()
    (w0, w1), hangs = watches(tmp_path, store)
    for now in (0.0, 1.0, 2.0, 3.5, 4.0, 4.5, 5.0):
        w0.tick(now)
        w1.tick(now)
    doc = json.loads((tmp_path / HANG_FILE).read_text())
    assert (doc["seq"], [m["rank"] for m in doc["missing"]]) == (7, [1])
    assert doc["missing"][0]["stack"][0]["line"] == 11
    assert sorted(hangs) == [0, 1] and w0.reported and w1.reported


def test_no_store_round_trip_per_collective(tmp_path):
    """Each poll makes one store call, however many collectives completed meanwhile."""
    store = CountingStore()
    (w0, w1), _ = watches(tmp_path, store)
    w1.tick(0.0)
    before = store.calls
    for n in range(1, 101):  # 100 polls, each after a few thousand collectives completed
        w1.source.pairs = {"0": (n * 1000, n * 1000)}
        w1.tick(float(n))
    assert store.calls - before == 100
    assert not (tmp_path / HANG_FILE).exists()


def test_a_dead_rank_is_named_and_does_not_hold_the_detector(tmp_path):
    store = dist.HashStore()
    (w0, _dead), hangs = watches(tmp_path, store)
    for now in (0.0, 3.5, 4.0, 4.0 + GATHER_S / 2):
        w0.tick(now)
    assert not (tmp_path / HANG_FILE).exists()  # still waiting for rank 1's state
    w0.tick(4.0 + GATHER_S)
    doc = json.loads((tmp_path / HANG_FILE).read_text())
    assert doc["missing"] == [{"rank": 1, "answered": False, "now_in": None, "stack": []}]
    assert hangs == [0]


def test_junk_in_the_store_is_skipped(tmp_path, recwarn):
    store = dist.HashStore()
    (w0, w1), hangs = watches(tmp_path, store)
    store.set(key("hang", "ask"), "not a count")
    store.set(key("hang", "found"), "1")  # planted: rank 1 answered no ask yet
    for now in (0.0, 1.0):
        w0.tick(now)
        w1.tick(now)
    assert hangs == [] and not (tmp_path / HANG_FILE).exists()
    assert any("not a count" in str(w.message) for w in recwarn)
    store.set(key("hang", "ask"), "0")
    store.set(key("hang", "state", 1, 1), '{"rank": 1, "stack": "x"}')  # junk as rank 1's
    for now in (3.5, 4.0):
        w0.tick(now)
    w0.tick(4.0 + GATHER_S)
    doc = json.loads((tmp_path / HANG_FILE).read_text())
    assert doc["missing"][0]["answered"] is False  # the junk was no answer


def test_the_thread_never_raises_into_the_job_and_stops(tmp_path, monkeypatch):
    class Broken(FakeRank):
        def open_store(self):
            raise ConnectionError("store gone")

    raised = []
    monkeypatch.setattr(threading, "excepthook", lambda args: raised.append(args))
    watch = HangWatch.start(str(tmp_path), "out", 1.0,
                            source=Broken(0, dist.HashStore(), 3, True))
    time.sleep(0.3)
    watch.close(wait_s=5)
    assert not watch._thread.is_alive() and raised == []


def test_find_hang_rules():
    a = FakeRank(0, None, 5, True).st
    b = FakeRank(1, None, 5, False).st
    now = time.time_ns()
    assert find_hang({0: a, 1: b}, world_size=2, hang_after_s=3, now_ns=now)["seq"] == 5
    both = {**b, "active": a["active"], "entered": {"0": 5}}
    assert find_hang({0: a, 1: both}, world_size=2, hang_after_s=3, now_ns=now) is None
    other = {**both, "active": [{**a["active"][0], "op": "gloo:barrier"}]}
    hang = find_hang({0: a, 1: other}, world_size=2, hang_after_s=3, now_ns=now)
    assert hang["missing"][0]["now_in"] == {"group": "0", "seq": 5, "op": "gloo:barrier"}
    passed = {**b, "entered": {"0": 6}}  # entered and finished it (a broadcast's source)
    assert find_hang({0: a, 1: passed}, world_size=2, hang_after_s=3, now_ns=now) is None
    assert find_hang({0: a, 1: b}, world_size=2, hang_after_s=30, now_ns=now) is None


def test_parse_state_keeps_only_well_formed_states():
    good = FakeRank(1, None, 5, True).st
    assert parse_state(json.dumps(good), 1, 2) == good
    assert parse_state(json.dumps(good), 0, 2) is None  # another rank's
    for bad in ({**good, "groups": {"0": {"ranks": [0, 9]}}}, {**good, "active": [{}]},
                {**good, "stack": [{"file": 3}]}, {**good, "entered": {"0": -1}}):
        assert parse_state(json.dumps(bad), 1, 2) is None
    assert parse_state("{", 1, 2) is None and parse_state("x" * 10**6, 1, 2) is None
