"""os.fork() while recording: the child stops recording, frees the copy, can profile itself.

Each scenario runs in its own Python process (the pytest process is never
forked), with a timeout that kills the whole process group.
"""

from __future__ import annotations

import json
import os
import sys
import textwrap
from pathlib import Path

import pytest

from subprocesses import run_in_group

REPO = Path(__file__).resolve().parents[1]


def run_script(source: str, collector: str, timeout: float = 300) -> dict:
    """Run ``source`` in a fresh interpreter; it prints one JSON line last."""
    env = dict(os.environ, PYTHONPATH=str(REPO), OPSCOPE_COLLECTOR=collector)
    proc = run_in_group([sys.executable, "-c", textwrap.dedent(source)], env=env,
                        timeout=timeout)
    out, err = proc.stdout, proc.stderr
    assert proc.returncode == 0, f"exit {proc.returncode}\n{err[-3000:]}"
    return json.loads(out.strip().splitlines()[-1])


FORK_WHILE_RECORDING = """
    import json, os
    import psutil, torch
    import opscope
    from opscope.record_function import recording_collector

    prof = opscope.profile(record_shapes=True, profile_memory=True, with_modules=True)
    prof.start()
    torch.nn.Linear(2, 2)(torch.ones(1, 2))
    x = torch.ones(4)
    for _ in range(30_000):  # records in several chunks (a chunk holds 37k)
        x = x.add(1)
    read_end, write_end = os.pipe()
    with opscope.record_function("forking"):
        pid = os.fork()
        if pid == 0:
            os.close(read_end)
            try:
                from torch.nn.modules import module as nn_module
                from opscope.collect.module_hooks import installed_hooks
                from torch.optim import optimizer as optim_module
                from opscope.collect.memory_hooks import TensorSightings
                memory_hooks = [
                    h for h in list(nn_module._global_forward_pre_hooks.values())
                    + list(optim_module._global_optimizer_post_hooks.values())
                    if isinstance(getattr(h, "__self__", None), TensorSightings)]
                child = {"recording": prof._collector.is_recording(),
                         "wired": recording_collector() is not None,
                         "hooks": len(installed_hooks()) + len(memory_hooks)}
                if prof._collector.name == "native":
                    from opscope.collect.native.build import load_native
                    child["native_recording"] = load_native().is_recording()
                    child["held_bytes"] = prof._collector.held_record_bytes()
                    child["chunk_bytes"] = load_native().region_bytes
                me = psutil.Process()
                y = torch.ones(4)
                for _ in range(2_000):  # warm up the allocator
                    y = y.add(1)
                before = me.memory_info().rss
                for _ in range(300_000):
                    y = y.add(1)
                child["rss_growth"] = me.memory_info().rss - before
                prof.step()
                prof.stop()  # the parent's profiler: nothing to do in the child
                with opscope.profile() as own:
                    torch.ones(2).mul(3)
                child["own"] = {r.key: r.count for r in own.key_averages()}
                child["own_pid"] = own.session.process_id == os.getpid()
                os.write(write_end, json.dumps(child).encode())
            finally:
                os._exit(0)
    os.close(write_end)
    chunks = []
    while True:
        data = os.read(read_end, 65536)
        if not data:
            break
        chunks.append(data)
    _, status = os.waitpid(pid, 0)
    for _ in range(1_000):
        x = x.sub(1)
    prof.stop()
    counts = {r.key: r.count for r in prof.key_averages()}
    print(json.dumps({"child": json.loads(b"".join(chunks) or b"null"), "status": status,
                      "parent": counts}))
"""


@pytest.mark.parametrize("collector", ["native", "python"])
def test_fork_child_stops_recording_and_profiles_itself(collector):
    result = run_script(FORK_WHILE_RECORDING, collector)
    assert result["status"] == 0
    child = result["child"]
    assert child is not None, "the child wrote nothing"
    assert child["recording"] is False
    assert child["wired"] is False
    assert child["hooks"] == 0  # with_modules and profile_memory hooks gone too
    if collector == "native":
        assert child["native_recording"] is False
        # the records filled several chunks; only the one holding the open "forking" range stays
        assert 0 < child["held_bytes"] <= child["chunk_bytes"]
        records_per_chunk = child["chunk_bytes"] // 56  # a 48-byte record and its context
        assert sum(result["parent"].values()) > 2 * records_per_chunk
    assert child["rss_growth"] < 20 * 2**20, child["rss_growth"]
    assert child["own"]["aten::mul"] == 1  # once: the inherited callback is gone
    assert "aten::add" not in child["own"] and "aten::sub" not in child["own"]
    assert child["own_pid"]
    parent = result["parent"]
    assert parent["aten::add"] == 30_000  # before the fork
    assert parent["aten::sub"] == 1_000  # after it
    assert parent["forking"] == 1
    assert "aten::mul" not in parent
    assert parent["aten::linear" if collector == "native" else "aten::addmm"] == 1


DATALOADER = """
    import json
    import torch
    from torch.utils.data import DataLoader, Dataset
    import opscope

    class Squares(Dataset):
        def __len__(self):
            return 16
        def __getitem__(self, i):
            return torch.full((3,), float(i)) * float(i)

    loader = DataLoader(Squares(), batch_size=4, num_workers=2,
                        multiprocessing_context="fork")
    seen = []
    with opscope.profile() as prof:
        for batch in loader:
            seen.append(batch.sum().item())
            batch.add(1)
    counts = {r.key: r.count for r in prof.key_averages()}
    print(json.dumps({"seen": seen, "counts": counts}))
"""


@pytest.mark.parametrize("collector", ["native", "python"])
def test_dataloader_fork_workers_under_profiler(collector):
    result = run_script(DATALOADER, collector)
    expected = [3.0 * sum(float(i * i) for i in range(b, b + 4)) for b in range(0, 16, 4)]
    assert result["seen"] == expected
    counts = result["counts"]
    assert counts["aten::add"] == 4
    assert counts["aten::sum"] == 4
    nexts = [k for k in counts if k.startswith("enumerate(DataLoader)")]
    assert nexts, sorted(counts)
    # the workers' ops (torch.full, mul) ran in the children, not in this profile
    assert "aten::full" not in counts


MULTIPROCESSING_CHILD_PROFILES = """
    import json, multiprocessing as mp
    import torch
    import opscope

    def work(queue):
        with opscope.profile() as own:
            torch.ones(2).mul(3)
        queue.put(sorted(r.key for r in own.key_averages()))

    with opscope.profile() as prof:
        torch.ones(2).add(1)
        ctx = mp.get_context("fork")
        queue = ctx.Queue()
        worker = ctx.Process(target=work, args=(queue,))
        worker.start()
        child = queue.get(timeout=120)
        worker.join(120)
        torch.ones(2).sub(1)
    counts = {r.key: r.count for r in prof.key_averages()}
    print(json.dumps({"child": child, "exit": worker.exitcode, "parent": counts}))
"""


@pytest.mark.parametrize("collector", ["native", "python"])
def test_multiprocessing_fork_child_profiles_its_own_ops(collector):
    result = run_script(MULTIPROCESSING_CHILD_PROFILES, collector)
    assert result["exit"] == 0
    assert "aten::mul" in result["child"] and "aten::add" not in result["child"]
    assert result["parent"]["aten::add"] == 1 and result["parent"]["aten::sub"] == 1
    assert "aten::mul" not in result["parent"]
