"""Collectives keyed by torch's flight recorder: subgroups are matched in their own group.

A real 2-rank gloo job where rank 0 also issues an all_reduce in a subgroup of its own
each step. With ``TORCH_FR_BUFFER_SIZE`` set, each trace carries the recorder's rows,
and ``opscope ranks`` matches every collective in its own group by its
``collective_seq_id``: no desync. Without the recorder (``TORCH_FR_BUFFER_SIZE=0``: torch
2.13 keeps 2000 collectives by default) the ordinal rule sees rank 0's
extra all_reduce as a desync of the default group, as docs/multi-rank.md says.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from opscope.model.torch_names import FLIGHT_RECORDER_KEY
from subprocesses import run_in_group
from test_ranks import free_port, ranks_json

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "tests" / "ranks_workloads" / "subgroup_job.py"


def run_subgroup_job(folder: Path, flight_recorder: bool, buffer: int = 1000,
                     steps: int = 0) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(REPO), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep), OMP_NUM_THREADS="1")
    env["TORCH_FR_BUFFER_SIZE"] = str(buffer) if flight_recorder else "0"  # 0: torch's is off
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
           "--master-addr", "127.0.0.1", "--master-port", str(free_port()), str(SCRIPT),
           str(folder)] + ([str(steps)] if steps else [])
    done = run_in_group(cmd, timeout=240, env=env, cwd=str(folder))
    assert done.returncode == 0, done.stderr[-3000:]
    return folder


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    return run_subgroup_job(tmp_path_factory.mktemp("fr_on"), flight_recorder=True)


def test_traces_carry_the_recorders_rows(recorded):
    doc = json.loads((recorded / "job.rank0.pt.trace.json").read_text())
    rows = doc[FLIGHT_RECORDER_KEY]
    groups = {row[0] for row in rows}
    assert groups == {"0", "1"}  # the whole job and rank 0's subgroup
    assert [row[1] for row in rows if row[0] == "1"] == [1, 2, 3]


def test_subgroup_collectives_match_in_their_own_group(recorded, capsys):
    doc = ranks_json(recorded, capsys)
    assert doc["desync"] == []
    by_group = {}
    for c in doc["collectives"]:
        by_group.setdefault(c["pg"], []).append(c)
    assert [c["kind"] for c in by_group["0"]] == ["allreduce", "broadcast", "barrier"] * 3
    assert all(sorted(c["ranks"]) == ["0", "1"] for c in by_group["0"])
    assert [(c["seq"], c["kind"], sorted(c["ranks"])) for c in by_group["1"]] == [
        (s, "allreduce", ["0"]) for s in (1, 2, 3)]
    seqs = [c["seq"] for c in by_group["0"]]
    assert seqs == sorted(seqs) and len(set(seqs)) == 9  # the recorder's numbers


def test_without_the_recorder_the_ordinal_rule_reports_a_desync(tmp_path, capsys):
    folder = run_subgroup_job(tmp_path / "fr_off", flight_recorder=False)
    doc = json.loads((folder / "job.rank0.pt.trace.json").read_text())
    assert FLIGHT_RECORDER_KEY not in doc
    desync = ranks_json(folder, capsys)["desync"]
    assert desync and desync[0]["ranks"] == {"0": "allreduce", "1": "broadcast"}


def test_a_window_longer_than_the_recorders_buffer_keeps_every_collectives_facts(
        tmp_path, capsys):
    # 8 entries kept by torch, 4 collectives a step on rank 0, 10 steps: the buffer wraps
    # five times over; opscope reads it at the steps where half of it filled
    folder = run_subgroup_job(tmp_path / "small", flight_recorder=True, buffer=8, steps=10)
    doc = json.loads((folder / "job.rank0.pt.trace.json").read_text())
    ops = [e for e in doc["traceEvents"] if e.get("name", "").startswith("c10d::")]
    assert len(ops) == 40 and all("Seq" in e["args"] for e in ops)
    result = ranks_json(folder, capsys)
    assert result["desync"] == []
    solo = [c["seq"] for c in result["collectives"] if c["pg"] == "1"]
    assert solo == list(range(1, 11))
