"""opscope.ExecutionTraceObserver: torch's execution-trace JSON from our own observer.

torch's own ExecutionTraceObserver is the oracle: on the same training step
both must produce the same nodes."""

from __future__ import annotations

import gzip
import json
import os
import re
import subprocess
import sys
import textwrap
from collections import Counter

import pytest
import torch
from torch import nn
from torch.profiler import ExecutionTraceObserver as TorchExecutionTraceObserver

import opscope
from opscope.execution_trace import load_execution_trace

TOP_LEVEL_KEYS = ["schema", "pid", "time", "start_ts", "nodes", "finish_ts"]
NODE_KEYS = ["id", "name", "ctrl_deps", "inputs", "outputs", "attrs"]
PORT_KEYS = ["values", "shapes", "types", "strides"]
ATTR_NAMES = ["rf_id", "fw_parent", "seq_id", "scope", "tid", "fw_tid", "op_schema",
              "kernel_backend", "kernel_file", "tensor_range"]
THREAD_NODE = "[pytorch|profiler|execution_trace|thread]"
PROCESS_NODE = "[pytorch|profiler|execution_trace|process]"


def make_step(range_function=torch.profiler.record_function):
    """One MLP training step: forward in a named range, backward, SGD."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(3, 8), torch.randn(3, 4)

    def step():
        with range_function("## forward ##"):
            loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()

    step()  # warm up: lazy initialisation stays out of the traces
    return step


@pytest.fixture(autouse=True)
def no_observer_left_registered():
    yield
    from opscope.collect.native.execution_trace import EXTENSION

    ext = EXTENSION._loaded
    assert ext is None or not ext.is_registered(), "an ExecutionTraceObserver is still registered"


def attrs(node):
    return {a["name"]: a["value"] for a in node["attrs"]}


def op_nodes(trace):
    return [n for n in trace["nodes"] if n["name"] not in (THREAD_NODE, PROCESS_NODE)]


def record_one_step(observer, step, path):
    observer.register_callback(str(path))
    try:
        observer.start()
        step()
        observer.stop()
    finally:
        observer.unregister_callback()
    return load_execution_trace(str(path))


@pytest.fixture(scope="module")
def our_trace(tmp_path_factory):
    path = tmp_path_factory.mktemp("et") / "ours.json"
    return record_one_step(opscope.ExecutionTraceObserver(), make_step(), path)


def test_same_step_gives_exactly_torchs_nodes(tmp_path):
    """Both observers watch the same step: ids, names, parents, tensors, attrs all agree."""
    step = make_step()
    ours = opscope.ExecutionTraceObserver().register_callback(str(tmp_path / "ours.json"))
    theirs = TorchExecutionTraceObserver().register_callback(str(tmp_path / "torch.json"))
    try:
        theirs.start()
        ours.start()
        step()
        ours.stop()
        theirs.stop()
    finally:
        theirs.unregister_callback()
        ours.unregister_callback()
    mine = load_execution_trace(str(tmp_path / "ours.json"))
    reference = load_execution_trace(str(tmp_path / "torch.json"))
    assert list(mine) == list(reference)
    assert mine["schema"] == reference["schema"]
    assert len(mine["nodes"]) == len(reference["nodes"]) > 50
    for got, want in zip(mine["nodes"], reference["nodes"]):
        assert got == want
    # the layout too: everything after the header line is byte-identical
    # (finish_ts may differ by a millisecond, so it is cut off)
    body = [(tmp_path / name).read_text().split("\n", 2)[2].rsplit('"finish_ts"', 1)[0]
            for name in ("ours.json", "torch.json")]
    assert body[0] == body[1]


def test_separate_runs_have_torchs_op_names_and_counts(tmp_path, our_trace):
    reference = record_one_step(TorchExecutionTraceObserver(), make_step(),
                                tmp_path / "torch.json")
    mine = Counter(n["name"] for n in op_nodes(our_trace))
    theirs = Counter(n["name"] for n in op_nodes(reference))
    assert mine == theirs
    for name in ("## forward ##", "aten::linear", "aten::addmm", "aten::mse_loss",
                 "MseLossBackward0", "AddmmBackward0", "Optimizer.step#SGD.step", "aten::add_"):
        assert mine[name] >= 1, name
    assert mine["aten::linear"] == 2


@pytest.fixture(scope="module")
def torchs_layout(tmp_path_factory):
    """(schema, port keys, attr names) that the installed torch's own observer writes.

    torch 2.4 writes schema 1.1.0 without strides and tensor_range; later ones 1.1.1
    with both (PORT_KEYS, ATTR_NAMES): the installed torch is asked, not assumed.
    """
    path = tmp_path_factory.mktemp("et_layout") / "torch.json"
    trace = record_one_step(TorchExecutionTraceObserver(), lambda: torch.ones(2).relu(), path)
    relu = next(n for n in trace["nodes"] if n["name"] == "aten::relu")
    return trace["schema"], list(relu["inputs"]), [a["name"] for a in relu["attrs"]]


def test_schema_and_keys(our_trace, torchs_layout):
    schema, port_keys, attr_names = torchs_layout
    assert port_keys == PORT_KEYS[:len(port_keys)]
    assert attr_names == ATTR_NAMES[:len(attr_names)]
    assert list(our_trace) == TOP_LEVEL_KEYS
    assert our_trace["schema"] == schema
    assert our_trace["pid"] == os.getpid()
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d", our_trace["time"])
    assert our_trace["start_ts"] <= our_trace["finish_ts"]
    for node in our_trace["nodes"]:
        assert list(node) == NODE_KEYS
        assert [a["name"] for a in node["attrs"]] == attr_names
        for port in ("inputs", "outputs"):
            assert list(node[port]) == port_keys
            lengths = {len(node[port][key]) for key in port_keys}
            assert len(lengths) == 1, (node["name"], port)
    addmm = next(n for n in our_trace["nodes"] if n["name"] == "aten::addmm")
    assert addmm["inputs"]["types"][:3] == ["Tensor(float)"] * 3
    assert attrs(addmm)["op_schema"].startswith("aten::addmm(Tensor self, Tensor mat1")
    assert attrs(addmm)["scope"] == 0
    forward = next(n for n in our_trace["nodes"] if n["name"] == "## forward ##")
    assert attrs(forward)["scope"] == 7  # a user range
    backward = next(n for n in our_trace["nodes"] if n["name"] == "MseLossBackward0")
    assert attrs(backward)["scope"] == 1 and attrs(backward)["seq_id"] >= 0


def test_parent_links_form_a_tree(our_trace):
    nodes = {n["id"]: n for n in our_trace["nodes"]}
    assert len(nodes) == len(our_trace["nodes"]), "node ids are unique"
    root = nodes[1]
    assert root["name"] == PROCESS_NODE and root["ctrl_deps"] == 1
    assert our_trace["nodes"][-1] is root
    for node in our_trace["nodes"]:
        seen = set()
        current = node
        while current["id"] != 1:
            assert current["id"] not in seen, "cycle"
            seen.add(current["id"])
            current = nodes[current["ctrl_deps"]]
    threads = [n for n in nodes.values() if n["name"] == THREAD_NODE]
    assert len(threads) == 1 and threads[0]["ctrl_deps"] == 1
    forward = next(n for n in nodes.values() if n["name"] == "## forward ##")
    linears = [n for n in nodes.values() if n["name"] == "aten::linear"]
    assert all(n["ctrl_deps"] == forward["id"] for n in linears)
    for addmm in (n for n in nodes.values() if n["name"] == "aten::addmm"):
        assert nodes[addmm["ctrl_deps"]]["name"] == "aten::linear"
    step = next(n for n in nodes.values() if n["name"] == "Optimizer.step#SGD.step")
    adds = [n for n in nodes.values() if n["name"] == "aten::add_"]
    assert len(adds) == 4 and all(n["ctrl_deps"] == step["id"] for n in adds)


def test_tensor_identity_rebuilds_data_dependencies(our_trace):
    nodes = sorted(our_trace["nodes"], key=lambda n: n["id"])  # ids follow start order
    linear1, linear2 = [n for n in nodes if n["name"] == "aten::linear"]
    relu = next(n for n in nodes if n["name"] == "aten::relu")
    # layer 1's output is relu's input, relu's output is layer 2's input
    assert linear1["outputs"]["values"][0] == relu["inputs"]["values"][0]
    assert relu["outputs"]["values"][0] == linear2["inputs"]["values"][0]
    # a tensor value is [tensor id, storage id, offset, numel, itemsize, device]
    x, weight, bias = linear1["inputs"]["values"]
    assert linear1["inputs"]["shapes"] == [[3, 8], [16, 8], [16]]
    assert weight[2:] == [0, 128, 4, "cpu"] and bias[2:] == [0, 16, 4, "cpu"]
    # a view shares its base's storage: weight.t() has a new tensor id, same storage
    t = next(n for n in nodes if n["name"] == "aten::t" and n["ctrl_deps"] == linear1["id"])
    view = t["outputs"]["values"][0]
    assert view[0] != weight[0] and view[1] == weight[1]
    # SGD updates the very parameters the forward pass read, in place
    updated = {tuple(n["inputs"]["values"][0]) for n in nodes if n["name"] == "aten::add_"}
    assert tuple(weight) in updated and tuple(bias) in updated
    for n in nodes:
        if n["name"] == "aten::add_":
            assert n["outputs"]["values"][0] == n["inputs"]["values"][0]


def test_observer_methods(tmp_path):
    et = opscope.ExecutionTraceObserver()
    assert not et.is_registered and not et.is_running()
    with pytest.raises(RuntimeError, match="register_callback"):
        et.get_output_file_path()
    et.start()  # not registered: nothing happens, as in torch
    assert not et.is_running()

    path = tmp_path / "et.json"
    assert et.register_callback(str(path)) is et
    try:
        assert et.is_registered and et.get_output_file_path() == str(path)
        assert et.register_callback(str(tmp_path / "other.json")) is et  # no-op
        assert et.get_output_file_path() == str(path)
        et.start()
        assert et.is_running()
        torch.ones(4).add(1)
        et.stop()
        assert not et.is_running()
        torch.ones(4).mul(2)  # stopped: not recorded
        et.start()
        torch.ones(4).sub(1)
        et.stop()
        assert not path.exists(), "the file appears only when it is complete"
    finally:
        et.cleanup()
    assert not et.is_registered
    with pytest.raises(RuntimeError):
        et.get_output_file_path()
    et.cleanup()  # twice is fine
    assert os.listdir(tmp_path) == ["et.json"], "no temp file left behind"
    names = [n["name"] for n in load_execution_trace(str(path))["nodes"]]
    assert "aten::add" in names and "aten::sub" in names and "aten::mul" not in names
    assert names.count(THREAD_NODE) == 1


def test_gz_output_and_ids_restart_per_registration(tmp_path):
    traces = []
    for name in ("a.json.gz", "b.json.gz"):
        et = opscope.ExecutionTraceObserver().register_callback(str(tmp_path / name))
        et.start()
        torch.ones(2).add(1)
        et.cleanup()  # stops, then writes
        with gzip.open(tmp_path / name, "rt") as f:
            traces.append(json.load(f))
    assert [n["id"] for n in traces[0]["nodes"]] == [n["id"] for n in traces[1]["nodes"]]
    assert traces[0]["nodes"][0]["id"] == 2 and traces[0]["nodes"][0]["name"] == THREAD_NODE


def test_one_registered_observer_per_process(tmp_path):
    first = opscope.ExecutionTraceObserver().register_callback(str(tmp_path / "1.json"))
    try:
        with pytest.raises(RuntimeError, match="already registered"):
            opscope.ExecutionTraceObserver().register_callback(str(tmp_path / "2.json"))
    finally:
        first.unregister_callback()
    second = opscope.ExecutionTraceObserver().register_callback(str(tmp_path / "2.json"))
    second.unregister_callback()
    assert (tmp_path / "1.json").exists() and (tmp_path / "2.json").exists()


def test_missing_folder_is_a_clear_error(tmp_path):
    et = opscope.ExecutionTraceObserver()
    with pytest.raises(FileNotFoundError, match="does not exist"):
        et.register_callback(str(tmp_path / "missing" / "et.json"))
    assert not et.is_registered
    with pytest.raises(TypeError, match="output_file_path"):
        et.register_callback(3)


def test_profile_drives_it_during_active_steps_only(tmp_path, collector_name):
    step = make_step(opscope.record_function)
    path = tmp_path / "et.json"
    et = opscope.ExecutionTraceObserver().register_callback(str(path))
    running = []
    sched = opscope.schedule(wait=1, warmup=1, active=2, repeat=1)
    with opscope.profile(schedule=sched, execution_trace_observer=et) as prof:
        for _ in range(5):
            step()
            running.append(et.is_running())
            prof.step()
    assert running == [False, False, True, True, False]
    assert not et.is_registered, "the profiler cleans the observer up when it exits"
    trace = load_execution_trace(str(path))
    names = Counter(n["name"] for n in op_nodes(trace))
    assert names["aten::linear"] == 4 and names["Optimizer.step#SGD.step"] == 2
    if collector_name == "native":
        # (the Python collector's dispatch mode re-dispatches each aten op it
        # sees, so every observer sees those twice; the native one adds nothing)
        profiled = Counter(e.name for e in prof.events())
        assert names["aten::addmm"] == profiled["aten::addmm"] == 4
        # the profiler's step ranges and the user range are real RecordFunctions here
        steps = sorted(n["name"] for n in trace["nodes"] if n["name"].startswith("ProfilerStep"))
        assert steps == ["ProfilerStep#2", "ProfilerStep#3"]
        assert names["## forward ##"] == 2
        by_id = {n["id"]: n for n in trace["nodes"]}
        for node in op_nodes(trace):
            if not node["name"].startswith("ProfilerStep"):
                ancestor = node
                while not ancestor["name"].startswith("ProfilerStep"):
                    ancestor = by_id[ancestor["ctrl_deps"]]
                    assert ancestor["id"] != 1, f"{node['name']} outside a profiler step"


BUILD_FAILURE_SCRIPT = textwrap.dedent("""
    import sys, opscope
    et = opscope.ExecutionTraceObserver()
    try:
        et.register_callback(sys.argv[1])
    except RuntimeError as exc:
        print("ERROR", exc)
    print("REGISTERED", et.is_registered)
""")


def test_failed_build_is_a_clear_runtime_error(tmp_path):
    env = dict(os.environ, OPSCOPE_FORCE_BUILD_FAILURE="1",
               OPSCOPE_CACHE_DIR=str(tmp_path / "cache"))
    out = tmp_path / "et.json"
    proc = subprocess.run([sys.executable, "-c", BUILD_FAILURE_SCRIPT, str(out)],
                          capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "ERROR opscope.ExecutionTraceObserver needs its native observer" in proc.stdout
    assert "could not be built" in proc.stdout and "REGISTERED False" in proc.stdout
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("opscope:")]
    assert len(lines) == 1 and "execution trace observer unavailable" in lines[0]
    assert not out.exists()
