"""GPU traces read back: torch.profiler's own (recorded on an H200) and opscope's.

``torch_traces/torch-2.11.0-cu130-h200.trace.json.gz`` is what torch.profiler
2.11 (CUDA 13.0) wrote for ../shared/gpu/check_cuda.py's workload on an NVIDIA
H200: a two-block transformer's training step, a host-device copy, a memset
and a CUDA graph replay. torch linked each kernel to its op by pushing the op's
id through CUPTI (the kernel's ``External id``); opscope links a loaded
trace's kernels by nesting the launching call under its op in time, and the
two must name the same op for every kernel.
"""

from __future__ import annotations

import collections
import gzip
import json
from pathlib import Path

import pytest

from opscope.analysis.aggregate import session_key_averages
from opscope.analysis.build import load_session
from opscope.event_list import EventList

TRACE = Path(__file__).parent / "torch_traces" / "torch-2.11.0-cu130-h200.trace.json.gz"


@pytest.fixture(scope="module")
def torch_gpu():
    doc = json.load(gzip.open(TRACE))
    return doc["traceEvents"], load_session(str(TRACE))


def test_every_kernel_has_the_op_torch_linked_it_to(torch_gpu):
    events, session = torch_gpu
    ops = {e["args"]["External id"]: e for e in events if e.get("ph") == "X"
           and e.get("cat") in ("cpu_op", "user_annotation") and "External id" in e["args"]}
    base_us = int(min(e["ts"] for e in events if e.get("ph") == "X"
                      and isinstance(e.get("ts"), float)))
    work = [e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    torch_owner = {(e["args"]["correlation"], round((e["ts"] - base_us) * 1000) + base_us * 1000):
                   ops.get(e["args"].get("External id")) for e in work}
    table, device = session.table, session.device
    assert len(device) == len(torch_owner) == len(work) == 348
    linked = exact = 0
    for corr, start, owner in zip(device.records["correlation"].tolist(),
                                  device.records["start_ns"].tolist(), device.owner_row.tolist()):
        want = torch_owner[(corr, start)]
        if want is None:  # the CUDA graph's replay: launched outside any op, in torch's too
            assert owner == -1
            continue
        # the same op; where torch's trace kept a same-name only child (aten::mean in
        # aten::mean), the loaded table has folded it into its parent, which holds it
        assert table.name(owner) == want["name"]
        op_start = round((want["ts"] - base_us) * 1000) + base_us * 1000
        exact += table.start_ns[owner] == op_start
        assert table.start_ns[owner] <= op_start
        assert table.end_ns[owner] >= op_start + round(want["dur"] * 1000)
        linked += 1
    assert linked == 333 and exact == 333 - 12


def test_the_table_of_torchs_gpu_trace_has_its_device_columns(torch_gpu):
    events, session = torch_gpu
    rows = session_key_averages(session)
    kernels = collections.Counter(e["name"] for e in events if e.get("cat") == "kernel")
    by_key = {(r.key, str(r.device_type)): r for r in rows}
    for name, count in kernels.items():
        assert by_key[(name, "DeviceType.CUDA")].count == count
    total_kernel_us = sum(e["dur"] for e in events if e.get("cat") == "kernel")
    assert sum(by_key[(n, "DeviceType.CUDA")].self_cuda_time_total
               for n in kernels) == pytest.approx(total_kernel_us, rel=1e-6)
    spans = [e for e in events if e.get("cat") == "gpu_user_annotation"]
    step = by_key[("Optimizer.step#AdamW.step", "DeviceType.CUDA")]
    assert step.count == len(spans) == 3
    assert step.self_cuda_time_total == pytest.approx(sum(e["dur"] for e in spans), rel=0.01)
    text = EventList(rows).table(sort_by="self_cuda_time_total", row_limit=5)
    assert "Self CUDA %" in text and "CUDA time avg" in text


def test_opscope_rewrites_torchs_gpu_trace_with_the_same_links(torch_gpu, tmp_path):
    from opscope.export.chrome_trace import write_chrome_trace

    events, session = torch_gpu
    out = tmp_path / "again.pt.trace.json"
    write_chrome_trace(session, str(out))
    again = json.loads(out.read_text())["traceEvents"]
    for cat in ("kernel", "gpu_memcpy", "gpu_memset", "cuda_runtime", "cuda_driver",
                "gpu_user_annotation"):
        assert collections.Counter(e["name"] for e in again if e.get("cat") == cat) == \
            collections.Counter(e["name"] for e in events if e.get("cat") == cat), cat
    flows = [e for e in again if e.get("cat") == "ac2g"]
    assert len(flows) == 2 * 348
    reloaded = load_session(str(out))
    assert reloaded.device.owner_row.tolist() == session.device.owner_row.tolist()


def test_the_store_keeps_the_device_side(torch_gpu, tmp_path):
    pytest.importorskip("pyarrow")
    pytest.importorskip("duckdb")
    from opscope.store.connect import connect
    from opscope.store.read import load_store_session
    from opscope.store.write import StoreWriter

    events, session = torch_gpu
    store = tmp_path / "store"
    with StoreWriter(store) as writer:
        writer.write_window(session)
    again = load_store_session(store)
    assert again.device.owner_row.tolist() == session.device.owner_row.tolist()
    assert again.device.names == session.device.names
    before = {(r.key, str(r.device_type)): (r.count, round(r.self_cuda_time_total, 3))
              for r in session_key_averages(session)}
    after = {(r.key, str(r.device_type)): (r.count, round(r.self_cuda_time_total, 3))
             for r in session_key_averages(again)}
    assert after == before
    con = connect(store)
    top = con.sql("SELECT d.name, e.name AS op, count(*) AS n FROM device d "
                  "JOIN events e ON e.event_id = d.op_event AND e.rank = d.rank "
                  "AND e.window = d.window WHERE d.category = 'gpu_memcpy' "
                  "GROUP BY ALL ORDER BY n DESC").fetchall()
    copies = collections.Counter(e["name"] for e in events if e.get("cat") == "gpu_memcpy")
    assert sum(n for _, _, n in top) == sum(copies.values())
    assert {op for _, op, _ in top} <= {"aten::copy_", "aten::_to_copy", "aten::to"}
