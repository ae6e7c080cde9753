"""Clock offsets to rank 0 through the job's c10d store, on real 2-rank torchrun jobs (gloo).

The ranks share one host, so ``OPSCOPE_CLOCK_SYNC=1`` forces the estimate; its value
must then be small. Durations are never asserted: only that generous bound on the offset.
"""

from __future__ import annotations

import json
import os
import socket
import sys
from pathlib import Path

import pytest

from opscope.collect.job.clock_sync import estimate_offset, launched_on_one_host
from opscope.model.torch_names import CLOCK_OFFSET_KEY
from subprocesses import run_in_group

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "tests" / "job_workloads" / "clock_job.py"
WORLD = 2
ONE_HOST_BOUND_NS = 50_000_000  # 50 ms: generous for two processes sharing a clock


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_job(folder: Path, sync: str, *args: str):
    """The clock job on WORLD ranks; each rank's trace metadata, by rank."""
    folder.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(REPO), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep), OMP_NUM_THREADS="1",
        PYTHONFAULTHANDLER="1")
    env.pop("OPSCOPE_CLOCK_SYNC", None)
    if sync:
        env["OPSCOPE_CLOCK_SYNC"] = sync
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(WORLD),
           "--master-addr", "127.0.0.1", "--master-port", str(free_port()),
           str(SCRIPT), str(folder), *args]
    done = run_in_group(cmd, timeout=180, env=env, cwd=str(folder))
    assert done.returncode == 0, done.stderr[-3000:]
    for rank in range(WORLD):  # the job went on after the recording
        assert (folder / f"done.rank{rank}.txt").read_text() == str(WORLD)
    metadata = {}
    for rank in range(WORLD):
        doc = json.loads((folder / f"train.rank{rank}.pt.trace.json").read_text())
        assert doc["distributedInfo"]["rank"] == rank
        metadata[rank] = doc
    return metadata, done


def test_forced_sync_writes_small_offsets(tmp_path):
    docs, _ = run_job(tmp_path, "1")
    assert docs[0][CLOCK_OFFSET_KEY] == 0
    for rank in range(1, WORLD):
        offset = docs[rank][CLOCK_OFFSET_KEY]
        assert type(offset) is int
        assert abs(offset) < ONE_HOST_BOUND_NS


def test_one_host_without_the_variable_writes_nothing(tmp_path):
    docs, _ = run_job(tmp_path, "")
    assert all(CLOCK_OFFSET_KEY not in doc for doc in docs.values())


def test_rank0_not_answering_writes_no_key_and_the_job_goes_on(tmp_path):
    docs, done = run_job(tmp_path, "1", "--rank0-silent")
    assert all(CLOCK_OFFSET_KEY not in doc for doc in docs.values())
    assert f"no {CLOCK_OFFSET_KEY} in this trace: rank 0 did not answer" in done.stderr


def test_estimate_keeps_the_shortest_round_trip():
    # rank 0's clock runs 1000 ns ahead; the slow sample (round trip 400) is dropped
    samples = [(0, 1100, 400), (500, 1550, 600), (700, 1760, 820)]
    assert estimate_offset(samples) == 1000
    assert estimate_offset([]) is None


@pytest.mark.parametrize("local, world, one", [("2", 2, True), ("2", 4, False), ("", 2, False)])
def test_one_host_is_read_from_torchrun(monkeypatch, local, world, one):
    monkeypatch.setenv("LOCAL_WORLD_SIZE", local)
    assert launched_on_one_host(world) is one
