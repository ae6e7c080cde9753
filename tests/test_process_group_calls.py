"""The process-group calls of the job's Python: point-to-point facts and call sites (issue 31).

A real 2-rank gloo job (``tests/ranks_workloads/p2p_job.py`` under torchrun, plain
``opscope.profile()``, no DDP, so torch._inductor is never imported and torch's flight
recorder holds no readable stack) of collectives, sends and receives, ending in a
desync. Then the wrappers themselves, on a real one-rank gloo group in this process:
they never raise into the job, pass the job's errors through, and come off at stop.
"""

from __future__ import annotations

import datetime
import json
import os
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from opscope.collect.job import process_group_calls
from opscope.collect.job.process_group_calls import ProcessGroupCalls
from subprocesses import run_in_group
from test_ranks import free_port, ranks_json

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "tests" / "ranks_workloads" / "p2p_job.py"


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    folder = tmp_path_factory.mktemp("p2p")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(REPO), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep), OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
           "--master-addr", "127.0.0.1", "--master-port", str(free_port()), str(SCRIPT),
           str(folder)]
    done = run_in_group(cmd, timeout=240, env=env, cwd=str(folder))
    assert done.returncode != 0  # the last all_reduce differs: the group's timeout ends it
    assert sorted(p.name for p in folder.glob("*.pt.trace.json")) == [
        "job.rank0.pt.trace.json", "job.rank1.pt.trace.json"], done.stderr[-3000:]
    return folder


def c10d_args(folder: Path, rank: int) -> list:
    doc = json.loads((folder / f"job.rank{rank}.pt.trace.json").read_text())
    return [(e["name"], e["args"]) for e in doc["traceEvents"]
            if e.get("name", "").startswith("c10d::")]


def test_the_job_ran_as_meant(job):
    for rank in (0, 1):
        state = json.loads((job / f"state.rank{rank}.txt").read_text())
        assert state == {"restored": True, "inductor_imported": False}


def test_every_python_call_has_its_call_site(job):
    for rank in (0, 1):
        ops = c10d_args(job, rank)
        assert len(ops) == 2 * 7 + 1
        for name, args in ops:
            site = args.get("Collective Call Site", "")
            assert site.startswith(str(SCRIPT)), (name, args)
            function = "exchange" if name in ("c10d::send", "c10d::recv_", "c10d::allgather_") \
                else "main"
            assert site.endswith(": " + function), (name, site)


def test_point_to_point_ops_carry_group_number_sizes_and_peer(job):
    def p2p(rank, name, peer_key):
        return [(a["Process Group Name"], a["Seq"], a["In msg nelems"], a["dtype"], a[peer_key])
                for n, a in c10d_args(job, rank) if n == name]

    sends0, recvs1 = p2p(0, "c10d::send", "Dst Rank"), p2p(1, "c10d::recv_", "Src Rank")
    sends1, recvs0 = p2p(1, "c10d::send", "Dst Rank"), p2p(0, "c10d::recv_", "Src Rank")
    assert [s[2:] for s in sends0] == [(5, "Float", 1), (7, "Float", 1)] * 2
    assert [s[2:] for s in recvs0] == [(3, "Double", 1), (7, "Float", 1)] * 2
    assert [s[2:] for s in sends1] == [(3, "Double", 0), (7, "Float", 0)] * 2
    assert [s[2:] for s in recvs1] == [(5, "Float", 0), (7, "Float", 0)] * 2
    # torch's number in the group: a send and its receive have the same one (in a batch,
    # each rank numbers its ops in its list's order: [send, recv] on both ranks)
    assert [s[:2] for s in sends0][0::2] == [r[:2] for r in recvs1][0::2]
    assert [s[:2] for s in sends1][0::2] == [r[:2] for r in recvs0][0::2]
    assert [s[1] for s in sends0][1::2] == [s[1] for s in sends1][1::2]
    assert {s[0] for s in sends0 + sends1} == {"0"}


def test_the_desync_names_each_ranks_call_site(job, capsys):
    (d,) = ranks_json(job, capsys)["desync"]
    assert d["in_nelems"] == {"0": 4, "1": 2}
    assert set(d["call_sites"]) == {"0", "1"}
    assert all(site.startswith(str(SCRIPT)) and site.endswith(": main")
               for site in d["call_sites"].values())


@pytest.fixture(scope="module")
def one_rank(tmp_path_factory):
    """A real one-rank gloo group in this process, destroyed after the module."""
    if dist.is_initialized():
        pytest.skip("a process group already exists in this process")
    store = dist.FileStore(str(tmp_path_factory.mktemp("store") / "f"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1,
                            timeout=datetime.timedelta(seconds=30))
    yield dist.group.WORLD
    dist.destroy_process_group()


def test_a_call_is_noted_with_its_call_site(one_rank):
    calls = ProcessGroupCalls()
    calls.install()
    tensor = torch.ones(6, dtype=torch.float16)
    dist.all_reduce(tensor)
    line = sys._getframe().f_lineno - 1
    rows = calls.uninstall()
    assert len(rows) == 1
    pg, seq, name, entered, desc, n_in, n_out, dtype, site, p2p, returned, peer = rows[0]
    assert (pg, seq, name, n_in, n_out, dtype, p2p, peer) == (
        "0", None, "c10d::allreduce", 6, 6, "Half", False, None)
    assert site == f"{__file__}({line}): test_a_call_is_noted_with_its_call_site"
    assert entered <= returned


def test_a_failing_note_never_reaches_the_job(one_rank, monkeypatch):
    def broken(*_args, **_kwargs):
        raise RuntimeError("bookkeeping failed")

    calls = ProcessGroupCalls()
    monkeypatch.setattr(calls, "_note", broken)
    calls.install()
    try:
        tensor = torch.full((3,), 2.0)
        dist.all_reduce(tensor)
        assert tensor.tolist() == [2.0, 2.0, 2.0]
    finally:
        assert calls.uninstall() == []


def test_the_jobs_own_error_passes_through_unchanged(one_rank):
    def error_of(group):
        with pytest.raises(Exception) as info:
            group.allreduce("not a tensor")  # pybind refuses the argument
        return type(info.value), str(info.value)

    plain = error_of(one_rank)
    calls = ProcessGroupCalls()
    calls.install()
    try:
        assert error_of(one_rank) == plain
    finally:
        assert calls.uninstall() == []


def test_stop_puts_the_methods_back_and_leaves_a_later_wrapper(one_rank):
    cls = torch._C._distributed_c10d.ProcessGroup
    before = {m: cls.__dict__[m] for m in ("send", "allreduce", "barrier")}
    calls = ProcessGroupCalls()
    calls.install()
    assert all(cls.__dict__[m] is not f for m, f in before.items())
    ours = cls.__dict__["barrier"]
    seen = []

    def theirs(group, *args, **kwargs):  # the job wraps the method after opscope did
        seen.append(1)
        return ours(group, *args, **kwargs)

    cls.barrier = theirs
    try:
        calls.uninstall()
        assert cls.__dict__["send"] is before["send"]
        assert cls.__dict__["allreduce"] is before["allreduce"]
        assert cls.__dict__["barrier"] is theirs  # theirs stays; ours, under it, is inert
        dist.barrier()
        assert seen == [1] and calls.rows == []
    finally:
        cls.barrier = before["barrier"]


def test_a_window_keeps_at_most_max_rows(one_rank, monkeypatch):
    monkeypatch.setattr(process_group_calls, "MAX_ROWS", 3)
    calls = ProcessGroupCalls()
    calls.install()
    for _ in range(5):
        dist.all_reduce(torch.ones(1))
    assert len(calls.uninstall()) == 3
