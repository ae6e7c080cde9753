"""A DDP job's process group ends in ``destroy_process_group()`` under ``opscope run``.

torch's ``torch.distributed.nn.functional`` keeps the default group in its
functions' default arguments when it is imported after ``init_process_group()``
(DDP's constructor does), so the group and gloo's worker threads outlive
``destroy_process_group()`` and can abort the process at interpreter exit
(pytorch #190489). ``opscope run`` imports it first
(``opscope.collect.group_lifetime``). Real 2-rank torchrun jobs on gloo
(``tests/run_workloads/group_exit.py``): each rank lists its threads after
``destroy_process_group()``. The same job without opscope shows the threads
left behind, so the check can fail.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
import torch.distributed as dist

from subprocesses import run_in_group

pytestmark = pytest.mark.skipif(
    not dist.is_available() or not dist.is_gloo_available() or not os.path.isdir("/proc/self/task"),
    reason="needs torch.distributed with gloo and /proc")

REPO = Path(__file__).resolve().parent.parent
WORKLOAD = REPO / "tests" / "run_workloads" / "group_exit.py"
JOB_TIMEOUT_S = 180


def run_job(folder: Path, launch: list) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env["OMP_NUM_THREADS"] = "1"
    done = run_in_group([*launch, str(WORKLOAD), str(folder)], timeout=JOB_TIMEOUT_S, env=env,
                        cwd=str(folder))
    assert done.returncode == 0, done.stderr[-3000:]
    assert "terminate called" not in done.stderr
    return {rank: json.loads((folder / f"threads.rank{rank}.json").read_text())
            for rank in range(2)}


def test_opscope_run_leaves_no_gloo_thread_after_destroy(tmp_path):
    threads = run_job(tmp_path, [sys.executable, "-m", "opscope", "run", "--nproc-per-node",
                                 "2", "-o", str(tmp_path / "out")])
    for rank, names in threads.items():
        assert not [n for n in names if "gloo" in n], (rank, names)
        assert len(names) == 1, (rank, names)  # the main thread alone
    assert sorted(p.name for p in (tmp_path / "out").glob("*.pt.trace.json")) == [
        "group_exit.rank0.pt.trace.json", "group_exit.rank1.pt.trace.json"]


def test_without_opscope_the_group_outlives_destroy(tmp_path):
    """The control: torch 2.13 alone keeps the group's gloo threads after destroy."""
    threads = run_job(tmp_path, [sys.executable, "-m", "torch.distributed.run", "--standalone",
                                 "--nproc-per-node", "2"])
    for rank, names in threads.items():
        assert [n for n in names if "gloo" in n], (rank, names)
