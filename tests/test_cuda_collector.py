"""The CUDA device collector without a GPU: CUPTI records built from the headers' structs.

The collector (collect/native/cupti_observer.cpp) is compiled against the installed
CUPTI headers; ``record_bytes`` lays out each record with the header's own
struct, and ``decode_buffer`` runs the decoder that CUPTI's buffer callback
runs. The records then go through the same path as a live window's: the
clock move, the thread match, the link to the ops of a real training step
(forward, backward, optimizer step, recorded by the native collector), and
every output. ../shared/gpu/check_cuda.py checks the same on a real GPU.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import threading
import warnings

import numpy as np
import pytest
import torch

from opscope.collect.native import cupti

pytestmark = pytest.mark.skipif(
    cupti.find_headers() is None,
    reason="no CUPTI headers (pip install nvidia-cuda-cupti nvidia-cuda-runtime nvidia-cuda-crt)")

MAIN_KEY = None  # CUPTI's id of the main thread, from the extension
OTHER_KEY = 424242  # a thread CUPTI names that the collector never saw start
RUNTIME_NAMES = {211: "cudaLaunchKernel_v7000", 51: "cudaMemcpyAsync_v3020",
                 48: "cudaMemsetAsync_v3020"}


@pytest.fixture(scope="module")
def ext():
    module = cupti.OBSERVER.load()
    assert module is not None, cupti.OBSERVER.failure_reason()
    module.take()
    return module


def _record(ext, kind, start, end, corr, *, device=0, stream=7, thread=0, cbid=0, nbytes=0,
            copy_kind=0, src=0, dst=0, name=""):
    return ext.record_bytes(kind, start, end, corr, device, stream, thread, cbid, nbytes,
                            copy_kind, src, dst, name)


def test_decoder_reads_each_kind_from_the_header_structs(ext):
    buf = b"".join([
        _record(ext, ext.CUPTI_KERNEL, 1000, 3000, 11, name="_Z6kernelPfi"),
        _record(ext, ext.CUPTI_MEMCPY, 4000, 5000, 12, nbytes=4096, copy_kind=1, src=2, dst=3),
        _record(ext, ext.CUPTI_MEMSET, 6000, 6500, 13, nbytes=64, src=3),
        _record(ext, ext.CUPTI_OVERHEAD, 0, 0, 0),  # a kind not asked for: skipped
        _record(ext, ext.CUPTI_RUNTIME, 100, 900, 11, device=-1, thread=77, cbid=211),
        _record(ext, ext.CUPTI_DRIVER, 950, 990, 14, device=-1, thread=77, cbid=307),
    ])
    ext.decode_buffer(buf)
    fields = cupti.taken_fields(ext, [], {})
    dev = fields["device"]
    assert dev["kind"].tolist() == [1, 2, 3, 4, 5]
    assert dev["correlation"].tolist() == [11, 12, 13, 11, 14]
    assert dev["start_ns"].tolist() == [1000, 4000, 6000, 100, 950]
    assert dev["bytes"].tolist() == [0, 4096, 64, 0, 0]
    kernel = dev[0]
    assert kernel["grid"].tolist() == [4, 2, 1] and kernel["block"].tolist() == [128, 1, 1]
    assert (kernel["registers"], kernel["shared_static"], kernel["stream"]) == (32, 16, 7)
    assert fields["device_names"][kernel["name_id"]] == "kernel(float*, int)"  # demangled
    assert dev["thread"].tolist()[3:] == [77, 77]
    names = fields["device_names"]
    assert names[dev["name_id"][3]] in ("cudaLaunchKernel_v7000", "cuda_runtime_211")


@pytest.fixture(scope="module")
def step_session(ext):
    """A real training step (forward, backward, optimizer step) and a second thread's op."""
    import opscope
    from opscope.model.records import RawSession  # noqa: F401

    global MAIN_KEY
    MAIN_KEY = int(ext.thread_key())
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(8, 16)
    import opscope.api.profiler as profiler_module

    # the window's RawSession as the collector gave it (a built session keeps no records)
    raws, build = [], profiler_module.build_session
    profiler_module.build_session = lambda raw, **kw: build(raws.append(raw) or raw, **kw)
    try:
        with opscope.profile(activities=[opscope.ProfilerActivity.CPU],
                             with_modules=True) as prof:
            with opscope.record_function("train_step"):
                model(x).sum().backward()
                opt.step()
            worker = threading.Thread(target=lambda: torch.mm(x, x.t()), name="side")
            worker.start()
            worker.join()
    finally:
        profiler_module.build_session = build
    prof._session.table.raw = raws[-1]
    return prof._session, threading.get_native_id()


def _device_window(ext, session, main_tid):
    """CUPTI records for every addmm/mm of the step: a launch inside it, a kernel after.

    Returns the RawSession with them, and per correlation the op that launched it
    (name, start, OS thread id).
    One more kernel's launch record is missing, as when its buffer was lost.
    """
    table = session.table
    raw = table.raw
    end = int(table.end_ns.max())
    records, expected = [], {}
    corr = 100
    tids = table.os_tid
    for row in range(len(table)):
        name = table.name(row)
        if name not in ("aten::addmm", "aten::mm"):
            continue
        corr += 1
        s, e = int(table.start_ns[row]), int(table.end_ns[row])
        # the call sits in the op's own time, away from its children
        kids = np.flatnonzero(table.parent == row)
        gap_start = int(table.end_ns[kids].max()) if len(kids) else s
        mid = (gap_start + e) // 2
        key = MAIN_KEY if tids[row] == main_tid else OTHER_KEY
        records.append(_record(ext, ext.CUPTI_RUNTIME, mid - 1, mid + 1, corr, device=-1,
                               thread=key, cbid=211))
        kernel = "_Z4gemmv" if name == "aten::mm" else "_Z5addmmv"
        records.append(_record(ext, ext.CUPTI_KERNEL, end + corr * 10_000,
                               end + corr * 10_000 + 5000, corr, name=kernel))
        expected[corr] = (name, s, int(tids[row]))
    # a kernel whose launch record was lost (its buffer never came) and one launched
    # before the window: both stay, with no owner
    records.append(_record(ext, ext.CUPTI_KERNEL, end + 9_000_000, end + 9_004_000, 999,
                           name="_Z4lostv"))
    ext.decode_buffer(b"".join(records))
    fields = cupti.taken_fields(ext, [], {MAIN_KEY: main_tid})
    names = [RUNTIME_NAMES.get(int(n.rsplit("_", 1)[-1]), n) if n.startswith("cuda_runtime_")
             else n for n in fields["device_names"]]
    fields["device_names"] = names
    return dataclasses.replace(raw, **fields), expected


@pytest.fixture(scope="module")
def device_session(ext, step_session):
    from opscope.analysis.build import build_session

    session, main_tid = step_session
    raw, expected = _device_window(ext, session, main_tid)
    return build_session(raw, options=session.options), expected, main_tid


def test_every_kernel_is_linked_to_the_op_that_launched_it(device_session):
    session, expected, _ = device_session
    table, device = session.table, session.device
    assert len(expected) >= 3  # two addmm forward, mm in backward, the side thread's mm
    by_corr = {int(c): (int(o), int(launch)) for c, o, launch in zip(
        device.records["correlation"], device.owner_row, device.launch_row)}
    for corr, op in expected.items():
        owner, launch = by_corr[corr]
        assert table.name(launch) == "cudaLaunchKernel"
        assert (table.name(owner), int(table.start_ns[owner]), int(table.os_tid[owner])) == op
    assert by_corr[999] == (-1, -1)  # the lost launch: kept, owned by nothing


def test_a_thread_cupti_names_is_matched_to_its_ops_by_time(device_session):
    session, expected, main_tid = device_session
    table = session.table
    launches = [r for r in range(len(table)) if table.name(r) == "cudaLaunchKernel"]
    side = [r for r in launches if table.os_tid[r] != main_tid]
    assert len(side) == 1  # the side thread's mm, on that thread's real OS id
    assert table.name(int(table.parent[side[0]])) == "aten::mm"


def test_key_averages_and_table_carry_device_time(device_session):
    session, expected, _ = device_session
    from opscope.analysis.aggregate import session_key_averages
    from opscope.event_list import EventList

    rows = {(r.key, r.is_user_annotation, str(r.device_type)): r
            for r in session_key_averages(session)}
    gemm = rows[("gemm()", False, "DeviceType.CUDA")]
    assert gemm.count == sum(1 for op in expected.values() if op[0] == "aten::mm")
    assert gemm.self_cuda_time_total == pytest.approx(5.0 * gemm.count)
    assert gemm.cpu_time_total == 0
    addmm = rows[("aten::addmm", False, "DeviceType.CPU")]
    assert addmm.self_device_time_total == pytest.approx(5.0 * addmm.count)
    assert rows[("cudaLaunchKernel", False, "DeviceType.CPU")].count == len(expected)
    step = rows[("train_step", True, "DeviceType.CPU")]
    assert step.device_time_total > step.self_device_time_total == 0
    span = rows[("train_step", True, "DeviceType.CUDA")]  # torch's gpu_user_annotation row
    assert span.count == 1 and span.self_cuda_time_total > 0
    text = EventList(session_key_averages(session)).table(sort_by="self_cuda_time_total")
    assert "Self CUDA" in text and "CUDA total" in text and "Self CUDA time total" in text


def test_events_carry_kernels_and_device_events(device_session):
    from opscope.analysis.function_events import function_events

    session, expected, _ = device_session
    events = function_events(session)
    addmm = [e for e in events if e.name == "aten::addmm"]
    assert addmm and all(len(e.kernels) == 1 for e in addmm)
    assert addmm[0].kernels[0][0] == "addmm()"
    kernels = [e for e in events if str(e.device_type) == "DeviceType.CUDA"]
    assert {e.name for e in kernels} >= {"addmm()", "gemm()", "lost()", "train_step"}
    assert all(e.cpu_time_total == 0 for e in kernels)


def test_chrome_trace_has_torch_device_schema(device_session, tmp_path):
    from opscope.export.chrome_trace import write_chrome_trace

    session, expected, _ = device_session
    path = tmp_path / "gpu.pt.trace.json"
    write_chrome_trace(session, str(path))
    events = json.loads(path.read_text())["traceEvents"]
    cats = collections.Counter(e.get("cat") for e in events if e["ph"] == "X")
    assert cats["kernel"] == len(expected) + 1 and cats["cuda_runtime"] == len(expected)
    assert cats["gpu_user_annotation"] == 1
    runtime = {e["args"]["correlation"]: e for e in events if e.get("cat") == "cuda_runtime"}
    kernels = [e for e in events if e.get("cat") == "kernel"]
    flows = collections.defaultdict(dict)
    for e in events:
        if e.get("cat") == "ac2g":
            flows[e["id"]][e["ph"]] = e
    for k in kernels:
        corr = k["args"]["correlation"]
        if corr == 999:
            assert "External id" not in k["args"] and corr not in flows
            continue
        call = runtime[corr]
        assert flows[corr]["s"]["tid"] == call["tid"] and flows[corr]["s"]["ts"] == call["ts"]
        assert flows[corr]["f"]["pid"] == k["pid"] == 0 and flows[corr]["f"]["tid"] == 7
        assert flows[corr]["f"]["bp"] == "e"
        parent = next(e for e in events if e.get("ph") == "X" and e.get("cat") == "cpu_op"
                      and e["args"].get("External id") == k["args"]["External id"])
        assert parent["tid"] == call["tid"]
        assert parent["ts"] <= call["ts"] <= parent["ts"] + parent["dur"]
    meta = {(e["name"], e["pid"]): e["args"] for e in events if e["ph"] == "M"}
    assert meta[("process_labels", 0)] == {"labels": "GPU 0"}
    assert any(e["ph"] == "M" and e["pid"] == 0 and e["args"] == {"name": "stream 7"}
               for e in events)


def test_holistic_trace_analysis_reads_the_device_trace(device_session, tmp_path):
    hta = pytest.importorskip("hta.trace_analysis", reason="HolisticTraceAnalysis not importable")
    from opscope.export.chrome_trace import write_chrome_trace

    session, expected, _ = device_session
    session.metadata["distributedInfo"] = '{"backend": "nccl", "rank": 0, "world_size": 1}'
    try:
        write_chrome_trace(session, str(tmp_path / "rank0.json"))
    finally:
        del session.metadata["distributedInfo"]
    analysis = hta.TraceAnalysis(trace_dir=str(tmp_path))
    df = analysis.t.get_trace(0)
    symbols = analysis.t.symbol_table.get_sym_table()
    cats = collections.Counter(symbols[i] for i in df["cat"])
    assert cats["kernel"] == len(expected) + 1
    by_type, by_kernel = analysis.get_gpu_kernel_breakdown(visualize=False)
    assert {"gemm()", "addmm()"} <= set(by_kernel["name"])
    assert set(by_type["kernel_type"]) == {"COMPUTATION"}
    temporal = analysis.get_temporal_breakdown(visualize=False)
    assert temporal["compute_time(us)"].iloc[0] > 0


def _record_with_warnings(rec):
    """Run one recording window over an op: (its RawSession, its "not recorded" warnings)."""
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        rec.start()
        torch.ones(3).add(1)
        raw = rec.stop()
    return raw, [str(w.message) for w in seen if "activity not recorded" in str(w.message)]


def test_a_probe_that_cannot_start_warns_once_and_the_cpu_side_goes_on():
    from opscope.collect import choose_collector
    from opscope.collect.recording import Recording

    class Broken:
        name = "cuda"

        def start(self):
            raise cupti.CuptiUnavailable("CUPTI error 999 (no driver)")

        def stop(self):  # pragma: no cover - never started
            raise AssertionError("stop of a probe that did not start")

        def discard(self):  # pragma: no cover
            pass

    raw, lines = _record_with_warnings(Recording(choose_collector(), probes=[Broken()]))
    assert lines == ["opscope: cuda activity not recorded: CUPTI error 999 (no driver); "
                     "recording the CPU side"]
    assert raw.device is None and len(raw.records) > 0


def test_the_device_side_is_left_to_a_running_torch_profiler():
    """Kineto holds CUPTI's buffer callbacks while it records: opscope must not take them."""
    import torch.profiler as tp

    from opscope.collect import choose_collector
    from opscope.collect.recording import Recording

    with tp.profile(activities=[tp.ProfilerActivity.CPU]):
        raw, lines = _record_with_warnings(Recording(choose_collector(), device=True))
    assert lines == ["opscope: cuda activity not recorded: torch.profiler is recording in this "
                     "process and holds CUPTI; its trace has the device side; recording the "
                     "CPU side"]
    assert raw.device is None and len(raw.records) > 0


def test_module_table_has_each_modules_device_time(device_session):
    from opscope.analysis.aggregate import session_key_averages
    from opscope.analysis.modules import module_rows
    from opscope.export.module_table import format_module_table

    session, expected, _ = device_session
    rows = {r.key: r for r in module_rows(session)}
    linears = [r for r in rows.values() if r.class_name == "Linear"]
    assert len(linears) == 2
    in_step = sum(1 for op in expected.values() if op[2] == threading.get_native_id())
    # every addmm (forward) and mm (backward) kernel of the step is under a Linear
    assert sum(r.device_time_total for r in linears) == pytest.approx(5.0 * in_step)
    root = next(r for r in rows.values() if r.parent < 0)
    assert root.device_time_total == pytest.approx(5.0 * in_step)
    assert root.self_device_time_total == 0
    text = format_module_table(list(rows.values()))
    assert "Self CUDA" in text and "CUDA total" in text
    # a module range is no user range to torch: no gpu_user_annotation row of its own
    spans = [r.key for r in session_key_averages(session)
             if r.is_user_annotation and str(r.device_type) == "DeviceType.CUDA"]
    assert spans == ["train_step"]


def test_a_collector_that_cannot_build_says_so_in_one_line(tmp_path, monkeypatch, capfd):
    from opscope.collect.native.build import NativeExtension
    from opscope.collect.python.collector import PythonCollector
    from opscope.collect.recording import Recording

    monkeypatch.setenv("OPSCOPE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("OPSCOPE_FORCE_BUILD_FAILURE", "1")
    monkeypatch.setattr(cupti, "OBSERVER", NativeExtension(
        cupti.SOURCE, "opscope_cupti", "CUDA device collector", "recording the CPU side only",
        extra=cupti.build_options))
    rec = Recording(PythonCollector(), device=True)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        rec.start()
        torch.ones(2).add(1)
        raw = rec.stop()
    err = [line for line in capfd.readouterr().err.splitlines() if line]
    assert err == ["opscope: CUDA device collector unavailable (build disabled by "
                   "OPSCOPE_FORCE_BUILD_FAILURE); recording the CPU side only"]
    assert not [w for w in seen if "activity" in str(w.message)]
    assert raw.device is None and len(raw.records) > 0
