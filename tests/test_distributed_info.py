"""The trace's distributedInfo, with a real single-process gloo group."""

from __future__ import annotations

import json
import warnings

import pytest
import torch
import torch.distributed as dist

import opscope
from workloads import mlp_step_fn

pytestmark = pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(),
                                reason="torch.distributed with gloo is not available")


@pytest.fixture
def gloo_group(tmp_path):
    """World size 1, rendezvous through a FileStore in the test's own folder."""
    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def exported(prof, path):
    prof.export_chrome_trace(str(path))
    return json.loads(path.read_text())


def test_trace_carries_distributed_info(gloo_group, tmp_path):
    step = mlp_step_fn()
    sub = dist.new_group([0])
    with opscope.profile() as prof:
        step()
        grads = torch.ones(8)
        dist.all_reduce(grads)
        dist.all_reduce(grads, group=sub)
    info = exported(prof, tmp_path / "trace.json")["distributedInfo"]
    assert info["backend"] == "gloo"
    assert info["rank"] == 0 and info["world_size"] == 1
    assert info["pg_count"] == 2 == len(info["pg_config"])
    assert all(pg["pg_size"] == 1 and pg["ranks"] == [0] for pg in info["pg_config"])
    assert torch.equal(grads, torch.ones(8))  # world size 1: the sum of one rank


def test_distributed_info_equals_torch_profilers(gloo_group, tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with torch.profiler.profile() as theirs:
            dist.all_reduce(torch.ones(2))
    theirs.export_chrome_trace(str(tmp_path / "torch.json"))
    expected = json.loads((tmp_path / "torch.json").read_text())["distributedInfo"]
    with opscope.profile() as ours:
        dist.all_reduce(torch.ones(2))
    assert exported(ours, tmp_path / "ours.json")["distributedInfo"] == expected


def test_collective_ops_are_recorded(gloo_group, native_only):
    with opscope.profile() as prof:
        dist.all_reduce(torch.ones(4))
    assert "c10d::allreduce_" in [row.key for row in prof.key_averages()]


def test_no_distributed_info_without_a_group(tmp_path):
    assert not dist.is_initialized()
    with opscope.profile() as prof:
        _ = torch.ones(2) + 1
    assert "distributedInfo" not in exported(prof, tmp_path / "trace.json")
