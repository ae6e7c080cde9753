"""The profile API on real workloads: ranges, threads, results, metadata, bad input."""

from __future__ import annotations

import json
import os
import threading

import pytest
import torch

import opscope
from workloads import mlp_step_fn


def names_of(prof):
    return [e.name for e in prof.events()]


def test_every_torch_profiler_name_exists():
    for name in torch.profiler.__all__:
        assert hasattr(opscope, name), name
    assert set(opscope.__all__) >= set(torch.profiler.__all__)


def test_kineto_available_reports_native_collector():
    assert opscope.kineto_available() is True


def test_train_step_records_ops_ranges_and_autograd(collector_name):
    step = mlp_step_fn()
    step()
    with opscope.profile() as prof:
        with opscope.record_function("opscope_range"):
            with torch.profiler.record_function("torch_range"):
                step()
    names = set(names_of(prof))
    assert {"opscope_range", "torch_range", "Optimizer.step#SGD.step",
            "Optimizer.zero_grad#SGD.zero_grad"} <= names
    assert "aten::addmm" in names or "aten::mm" in names
    if collector_name == "native":
        assert "aten::linear" in names
        assert "autograd::engine::evaluate_function: AddmmBackward0" in names
        assert "AddmmBackward0" in names
    events = {e.name: e for e in prof.events()}
    outer, inner = events["opscope_range"], events["torch_range"]
    assert inner.cpu_parent is outer
    assert outer.time_range.start <= inner.time_range.start
    assert inner.time_range.end <= outer.time_range.end
    # self time = total minus children, for every event
    for e in prof.events():
        children = sum(c.cpu_time_total for c in e.cpu_children)
        assert e.self_cpu_time_total == pytest.approx(e.cpu_time_total - children, abs=1e-6)


def test_record_function_as_decorator_and_user_annotation(native_only):
    @opscope.record_function("decorated")
    def work(n):
        torch.ones(n)  # a second child, so torch's same-name folding does not apply
        return torch.ones(n).sum() if n <= 1 else work(n - 1)

    with opscope.profile() as prof:
        work(3)
    decorated = [e for e in prof.events() if e.name == "decorated"]
    assert len(decorated) == 3
    assert all(e.is_user_annotation for e in decorated)
    # recursion nests: the 2nd is inside the 1st, the 3rd inside the 2nd
    assert decorated[1].cpu_parent is decorated[0]
    assert decorated[2].cpu_parent is decorated[1]


def test_same_name_only_child_is_folded_like_torch(native_only):
    def nested(prof_mod):
        with prof_mod.record_function("same"):
            with prof_mod.record_function("same"):
                torch.ones(2).add(1)

    with torch.profiler.profile() as tp:
        nested(torch.profiler)
    with opscope.profile() as op:
        nested(opscope)
    torch_same = [e for e in tp.events() if e.name == "same"]
    ours = [e for e in op.events() if e.name == "same"]
    assert len(ours) == len(torch_same) == 1
    assert sorted(c.name for c in ours[0].cpu_children) == \
        sorted(c.name for c in torch_same[0].cpu_children)


def test_record_function_idle_is_a_no_op():
    rf = opscope.record_function("idle")
    with rf:
        assert rf._handle is None
    assert rf._handle is None
    with pytest.raises(TypeError, match="name"):
        opscope.record_function(42)


def test_ops_on_a_second_thread_carry_that_thread(collector_name, tmp_path):
    seen = {}

    def worker():
        seen["tid"] = threading.get_native_id()
        with torch.profiler.record_function("worker_range"):
            torch.ones(3).mul(2)

    with opscope.profile() as prof:
        t = threading.Thread(target=worker)
        t.start()
        t.join()
        torch.ones(3).add(1)
    events = prof.events()
    worker_range = next(e for e in events if e.name == "worker_range")
    main_add = next(e for e in events if e.name == "aten::add")
    assert worker_range.thread != main_add.thread
    mul = next(e for e in events if e.name == "aten::mul")
    assert mul.cpu_parent is worker_range
    path = tmp_path / "t.json"
    prof.export_chrome_trace(str(path))
    trace = json.loads(path.read_text())
    tids = {e["tid"] for e in trace["traceEvents"] if e.get("name") == "worker_range"}
    assert tids == {seen["tid"]}
    assert {e["tid"] for e in trace["traceEvents"] if e.get("name") == "aten::add"} == \
        {threading.get_native_id()}


def test_key_averages_totals_and_dataframe(native_only):
    step = mlp_step_fn()
    with opscope.profile() as prof:
        step()
    rows = prof.key_averages()
    assert sum(r.count for r in rows) == len(prof.events())
    total = prof.total_average()
    assert total.key == "Total"
    assert total.count == len(prof.events())
    assert prof.self_cpu_time_total == pytest.approx(rows.self_cpu_time_total, rel=1e-9)
    df = rows.to_dataframe()
    assert list(df["key"]) == [r.key for r in rows]
    assert df["count"].sum() == len(prof.events())
    table = rows.table(sort_by="self_cpu_time_total", row_limit=5)
    assert "Self CPU time total:" in table
    assert "aten::" in table


def test_record_shapes_gives_input_shapes(native_only):
    a, b = torch.randn(3, 5), torch.randn(5, 7)
    with opscope.profile(record_shapes=True) as prof:
        torch.mm(a, b)
    mm = next(e for e in prof.events() if e.name == "aten::mm")
    assert mm.input_shapes == [[3, 5], [5, 7]]
    assert mm.input_dtypes == ["float", "float"]
    rows = prof.key_averages(group_by_input_shape=True)
    assert any(r.key == "aten::mm" and r.input_shapes == [[3, 5], [5, 7]] for r in rows)


def test_metadata_goes_into_the_trace(native_only, tmp_path):
    prof = opscope.profile(record_shapes=True, with_stack=True, with_flops=True,
                           with_modules=True, profile_memory=True)
    prof.preset_metadata_json("preset", '{"a": 1}')
    with prof:
        prof.add_metadata("run", 'name "with" quotes')
        prof.add_metadata_json("cfg", '[1, 2, {"k": null}]')
        torch.ones(1).add(1)
    with pytest.raises(ValueError, match="bad_json"):
        prof.add_metadata_json("bad_json", "{nope")
    path = tmp_path / "m.json"
    prof.export_chrome_trace(str(path))
    doc = json.loads(path.read_text())
    assert doc["run"] == 'name "with" quotes'
    assert doc["cfg"] == [1, 2, {"k": None}]
    assert doc["preset"] == {"a": 1}
    for flag in ("record_shapes", "with_stack", "with_flops", "with_modules", "profile_memory"):
        assert doc[flag] == 1


def test_use_cuda_is_deprecated_and_cuda_missing_warns(native_only):
    with pytest.warns(UserWarning, match="use_cuda is deprecated"):
        opscope.profile(use_cuda=False)
    if not torch.cuda.is_available():
        with pytest.warns(RuntimeWarning, match="CUDA"):
            prof = opscope.profile(activities=[opscope.ProfilerActivity.CPU,
                                               opscope.ProfilerActivity.CUDA])
        with prof:
            torch.ones(2).add(1)
        assert "aten::add" in names_of(prof)


# -- bad input ---------------------------------------------------------------------------

def test_nested_profile_raises_and_outer_survives(native_only):
    with opscope.profile() as outer:
        with pytest.raises(RuntimeError, match="not reentrant"):
            with opscope.profile():
                pass
        torch.ones(2).add(1)
    assert "aten::add" in names_of(outer)


def test_results_before_stop_raise(native_only):
    prof = opscope.profile()
    prof.start()
    try:
        with pytest.raises(RuntimeError, match="after the profiler stops"):
            prof.key_averages()
    finally:
        prof.stop()
    with pytest.raises(RuntimeError, match="no results"):
        opscope.profile().key_averages()


def test_export_to_missing_folder_names_the_path(native_only, tmp_path):
    with opscope.profile() as prof:
        torch.ones(2).add(1)
    target = tmp_path / "does_not_exist" / "trace.json"
    with pytest.raises(FileNotFoundError, match="does_not_exist"):
        prof.export_chrome_trace(str(target))
    assert not target.parent.exists()
    assert os.listdir(tmp_path) == []
    # nothing recorded was lost: exporting to a good path still works
    prof.export_chrome_trace(str(tmp_path / "ok.json"))
    assert json.loads((tmp_path / "ok.json").read_text())["traceEvents"]


def test_exception_inside_block_stops_cleanly(collector_name):
    with pytest.raises(ZeroDivisionError):
        with opscope.profile() as prof:
            torch.ones(2).add(1)
            1 / 0
    assert "aten::add" in names_of(prof)
    with opscope.profile() as again:
        torch.ones(2).mul(3)
    assert "aten::mul" in names_of(again)


def test_tensorboard_trace_handler_names_and_errors(native_only, tmp_path):
    out = tmp_path / "tb"
    handler = opscope.tensorboard_trace_handler(str(out), worker_name="w0", use_gzip=True)
    with opscope.profile(schedule=opscope.schedule(wait=0, warmup=1, active=1, repeat=2),
                         on_trace_ready=handler) as prof:
        for _ in range(4):
            torch.ones(2).add(1)
            prof.step()
    files = sorted(os.listdir(out))
    assert len(files) == 2
    for name in files:
        assert name.startswith("w0.") and name.endswith(".pt.trace.json.gz")
        assert name.split(".")[1].isdigit()
    blocked = tmp_path / "file_not_dir"
    blocked.write_text("x")
    bad = opscope.tensorboard_trace_handler(str(blocked / "sub"))
    with opscope.profile() as prof:
        torch.ones(2).add(1)
    with pytest.warns(Warning, match="file_not_dir"):  # never stops training (issue 28)
        bad(prof)


def test_default_worker_name_is_host_and_pid(native_only, tmp_path):
    import socket

    handler = opscope.tensorboard_trace_handler(str(tmp_path))
    with opscope.profile() as prof:
        torch.ones(2).add(1)
    handler(prof)
    (name,) = os.listdir(tmp_path)
    assert name.startswith(f"{socket.gethostname()}_{os.getpid()}.")
    assert name.endswith(".pt.trace.json")


ODD_NAMES = ['quote " inside', "back\\slash", "new\nline", "ünïcödé ✓ 🚀", "</script>"]


def test_odd_range_names_round_trip_through_the_trace(collector_name, tmp_path):
    with opscope.profile() as prof:
        for name in ODD_NAMES:
            with opscope.record_function(name):
                torch.ones(1).add(1)
    assert {e.name for e in prof.events()} >= set(ODD_NAMES)
    for path in (tmp_path / "odd.json", tmp_path / "odd.json.gz"):
        prof.export_chrome_trace(str(path))
        if path.suffix == ".gz":
            import gzip

            with gzip.open(path, "rt", encoding="utf-8") as f:
                doc = json.load(f)
        else:
            doc = json.loads(path.read_text(encoding="utf-8"))
        names = {e["name"] for e in doc["traceEvents"] if e.get("cat") == "user_annotation"}
        assert names >= set(ODD_NAMES)


def test_export_stacks_puts_the_op_at_the_leaf(native_only, tmp_path):
    with opscope.profile() as prof:
        with opscope.record_function("outer"):
            torch.mm(torch.randn(64, 64), torch.randn(64, 64))
    path = tmp_path / "stacks.txt"
    prof.export_stacks(str(path))
    lines = path.read_text().splitlines()
    assert lines, "no stack lines written"
    for line in lines:
        frames, value = line.rsplit(" ", 1)
        assert int(value) > 0
        assert frames.startswith("outer")
    assert any(line.rsplit(" ", 1)[0].split(";")[-1] == "aten::mm" for line in lines)
    with pytest.raises(ValueError, match="metric"):
        prof.export_stacks(str(tmp_path / "bad.txt"), metric="wall_time")
    assert not (tmp_path / "bad.txt").exists()


def test_table_options_reach_the_formatter(native_only):
    with opscope.profile() as prof:
        torch.ones(4).add(1)
    table = prof.key_averages().table(time_unit="ms", row_limit=3)
    assert "ms" in table.splitlines()[3]
    assert "us " not in table
    with pytest.raises(ValueError, match="self_cpu_time_total"):
        prof.key_averages().table(sort_by="fastest")
    events_df = prof.events().to_dataframe()
    assert "aten::add" in set(events_df["key"])


def test_distributed_info_when_torch_distributed_is_initialised(native_only, tmp_path):
    import torch.distributed as dist

    if not dist.is_available():
        pytest.skip("torch.distributed is not built in")
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0,
                            world_size=1)
    try:
        with opscope.profile() as prof:
            torch.ones(2).add(1)
    finally:
        dist.destroy_process_group()
    path = tmp_path / "dist.json"
    prof.export_chrome_trace(str(path))
    text = path.read_text()
    assert '"rank": 0' in text
    info = json.loads(text)["distributedInfo"]
    assert info["backend"] == "gloo" and info["world_size"] == 1
    # and without a process group there is none
    with opscope.profile() as plain:
        torch.ones(2).add(1)
    plain.export_chrome_trace(str(path))
    assert "distributedInfo" not in json.loads(path.read_text())


def test_threads_keep_running_across_repeated_start_and_stop(collector_name):
    """Ops on worker threads while sessions start and stop around them: no crash, no loss."""
    import time

    stop = threading.Event()
    iterations = {}

    def worker(k):
        x = torch.ones(4)
        while not stop.is_set():
            with torch.profiler.record_function("worker_iter"):
                x = x.add(1).mul(0.5)
            iterations[k] = iterations.get(k, 0) + 1

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(3)]
    for t in threads:
        t.start()
    try:
        seen = []
        for _ in range(5):
            with opscope.profile() as prof:
                before = {k: iterations.get(k, 0) for k in range(3)}
                deadline = time.monotonic() + 30
                # every worker completes two ranges inside this session
                while any(iterations.get(k, 0) < before[k] + 2 for k in range(3)):
                    assert time.monotonic() < deadline, "workers made no progress"
                    torch.ones(2).add(1)
            seen.append({e.thread for e in prof.events() if e.name == "worker_iter"})
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert all(len(threads_seen) == 3 for threads_seen in seen), seen


def test_range_open_across_stop_ends_at_stop_and_later_sessions_work(collector_name):
    rf = torch.profiler.record_function("spans_stop")
    prof = opscope.profile()
    prof.start()
    rf.__enter__()
    torch.ones(2).add(1)
    prof.stop()
    torch.ones(2).mul(2)
    rf.__exit__(None, None, None)  # its end arrives after the session stopped
    spans = [e for e in prof.events() if e.name == "spans_stop"]
    assert len(spans) == 1
    add = next(e for e in prof.events() if e.name == "aten::add")
    assert add.cpu_parent is spans[0]
    assert "aten::mul" not in names_of(prof)
    with opscope.profile() as again:
        torch.ones(2).sub(1)
    assert "aten::sub" in names_of(again) and "spans_stop" not in names_of(again)


# -- profile's own arguments: checked at the call, naming the argument -----------------

@pytest.mark.parametrize("name", ["record_shapes", "profile_memory", "with_stack",
                                  "with_flops", "with_modules"])
@pytest.mark.parametrize("value", ["yes", 2, None, 1.0])
def test_profile_bool_options_are_checked(name, value):
    with pytest.raises(TypeError, match=f"profile: {name} must be a bool"):
        opscope.profile(**{name: value})


def test_profile_bool_options_accept_0_and_1():
    prof = opscope.profile(record_shapes=1, with_stack=0)
    assert prof.record_shapes is True and prof.with_stack is False


@pytest.mark.parametrize("name", ["schedule", "on_trace_ready"])
def test_profile_callables_are_checked(name):
    with pytest.raises(TypeError, match=f"profile: {name} must be callable"):
        opscope.profile(**{name: "trace.json"})


def test_profile_execution_trace_observer_is_checked(tmp_path):
    with pytest.raises(TypeError, match="execution_trace_observer must be an "
                                        "opscope.ExecutionTraceObserver or None"):
        opscope.profile(execution_trace_observer=str(tmp_path / "et.json"))
    opscope.profile(execution_trace_observer=opscope.ExecutionTraceObserver())


def test_profile_experimental_config_is_checked():
    with pytest.raises(TypeError, match="experimental_config must be"):
        opscope.profile(experimental_config={"verbose": True})
    config = torch.profiler._ExperimentalConfig()
    assert opscope.profile(experimental_config=config).experimental_config is config


@pytest.fixture(scope="module")
def finished():
    with opscope.profile(profile_memory=True, with_modules=True) as prof:
        torch.nn.Linear(3, 2)(torch.ones(1, 3)).sum()
    return prof


@pytest.mark.parametrize("kwargs, error, words", [
    (dict(group_by_input_shape="yes"), TypeError, "group_by_input_shape must be a bool"),
    (dict(group_by_stack_n=-1), ValueError, "group_by_stack_n must be >= 0"),
    (dict(group_by_stack_n="5"), TypeError, "group_by_stack_n must be an int"),
    (dict(group_by_stack_n=True), TypeError, "group_by_stack_n must be an int"),
    (dict(group_by_overload_name=None), TypeError, "group_by_overload_name must be a bool"),
    (dict(group_by="name"), ValueError, "group_by must be None or 'module'"),
    (dict(group_by=["module"]), ValueError, "group_by must be None or 'module'"),
])
def test_key_averages_arguments_are_checked(finished, kwargs, error, words):
    with pytest.raises(error, match=f"key_averages: {words}"):
        finished.key_averages(**kwargs)


def test_key_averages_checks_before_needing_results():
    with pytest.raises(ValueError, match="group_by_stack_n"):
        opscope.profile().key_averages(group_by_stack_n=-2)


@pytest.mark.parametrize("top, error", [(0, ValueError), (-1, ValueError), ("3", TypeError),
                                        (2.5, TypeError), (True, TypeError)])
def test_memory_summary_top_is_checked(finished, top, error):
    with pytest.raises(error, match="memory_summary: top must be"):
        finished.memory_summary(top=top)


@pytest.mark.parametrize("method", ["add_metadata", "add_metadata_json",
                                    "preset_metadata_json"])
@pytest.mark.parametrize("key, error", [(5, TypeError), (None, TypeError),
                                        ("a\x00b", ValueError), ("\ud800", ValueError)])
def test_metadata_keys_are_checked(method, key, error):
    prof = opscope.profile()
    value = "v" if method == "add_metadata" else '"v"'
    with pytest.raises(error, match=f"{method}: key must"):
        getattr(prof, method)(key, value)
    assert key not in prof._metadata and key not in prof.preset_metadata


@pytest.mark.parametrize("method", ["export_chrome_trace", "export_memory_timeline",
                                    "export_stacks", "export_report"])
@pytest.mark.parametrize("path, error", [("", ValueError), (None, TypeError),
                                         (3, TypeError), ("a\x00b", ValueError)])
def test_export_paths_are_checked_at_the_call(method, path, error):
    # a profiler with no results: the path is refused before the session is asked for
    with pytest.raises(error, match=f"{method}: path must"):
        getattr(opscope.profile(profile_memory=True), method)(path)


@pytest.mark.parametrize("bad, error", [("a\x00b", ValueError), ("\ud800", ValueError)])
def test_collector_range_push_refuses_names_it_cannot_record(collector_name, bad, error):
    from opscope.collect import choose_collector

    collector = choose_collector()
    collector.start()
    try:
        with pytest.raises(error, match="name must"):
            collector.range_push(bad)
        handle = collector.range_push("fine")
        collector.range_pop(handle)
    finally:
        raw = collector.stop()
    names = [raw.names[i] for i in raw.records["name_id"]]
    assert "fine" in names and not any(n.startswith("a") and len(n) == 1 for n in names)


def test_native_range_push_refuses_nul_even_unchecked(native_only):
    from opscope.collect.native.build import load_native

    ext = load_native()
    with pytest.raises(ValueError, match="NUL"):
        ext.range_push("a\x00b")  # not recording: refused all the same
    assert not ext.is_recording()
