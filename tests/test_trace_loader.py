"""Loading saved traces back into sessions: opscope's round trip, torch.profiler's traces, errors.

The oracle for opscope's own traces is the live session: times round-trip to
the nanosecond, so the key_averages tables rebuilt from the file equal the
live tables character for character. For torch.profiler traces it is torch's
own key_averages on the same profile.
"""

from __future__ import annotations

import concurrent.futures
import gzip
import inspect
import json
import os

import numpy as np
import pytest
import torch

import opscope
from opscope.analysis.aggregate import key_averages
from opscope.event_list import EventList
from opscope.export.chrome_trace import write_chrome_trace
from opscope.model.records import SCOPE_BACKWARD_FUNCTION, SCOPE_USER, decode_inputs
from opscope.load.trace_inputs import encode_trace_inputs
from opscope.analysis.build import load_session
from opscope.load import TraceLoadError
from opscope.model.session import ProfileSession

from synthetic import Op, TensorSpec, make_session
from workloads import mlp_step_fn, torch_profiler_trace

RANGE_NAME = 'train "step" \\ 1'  # quotes and a backslash must survive the round trip


def _profile_mlp(steps: int = 2, **options) -> opscope.profile:
    step = mlp_step_fn()
    step()  # warm-up outside the profile
    with opscope.profile(**options) as prof:
        for _ in range(steps):
            with opscope.record_function(RANGE_NAME):
                step()
    return prof


def _table(rows, **kwargs) -> str:
    return EventList(rows, profile_memory=kwargs.pop("profile_memory", False),
                     with_flops=kwargs.pop("with_flops", False)).table(
        sort_by="self_cpu_time_total", row_limit=-1, **kwargs)


@pytest.fixture(scope="module")
def mlp_traces(tmp_path_factory):
    """Live profiles of MLP train steps and their exported traces (.json, .json.gz)."""
    folder = tmp_path_factory.mktemp("traces")
    out = {}
    for shapes, name in ((False, "plain.pt.trace.json"), (True, "shapes.pt.trace.json.gz")):
        prof = _profile_mlp(record_shapes=shapes)
        path = str(folder / name)
        prof.export_chrome_trace(path)
        out[shapes] = (prof, path)
    return out


# -- opscope round trip -------------------------------------------------------------------

@pytest.mark.parametrize("shapes", [False, True])
def test_round_trip_key_averages_table_is_identical(mlp_traces, shapes):
    prof, path = mlp_traces[shapes]
    loaded = load_session(path)
    assert isinstance(loaded, ProfileSession)
    assert loaded.source_path == path
    assert loaded.options["record_shapes"] is shapes
    live_text = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=-1)
    assert _table(key_averages(loaded.table)) == live_text
    assert any(r.key == RANGE_NAME for r in key_averages(loaded.table))
    if shapes:
        live_by_shape = prof.key_averages(group_by_input_shape=True).table(
            sort_by="self_cpu_time_total", row_limit=-1)
        assert _table(key_averages(loaded.table, group_by_input_shape=True)) == live_by_shape


@pytest.mark.parametrize("shapes", [False, True])
def test_round_trip_keeps_every_event_column(mlp_traces, shapes):
    prof, path = mlp_traces[shapes]
    live, loaded = prof.session.table, load_session(path).table
    assert len(loaded) == len(live) > 100
    assert [loaded.name(i) for i in range(len(loaded))] == [live.name(i) for i in range(len(live))]
    assert np.array_equal(loaded.duration_ns, live.duration_ns)
    assert np.array_equal(loaded.start_ns - loaded.start_ns[0], live.start_ns - live.start_ns[0])
    for column in ("parent", "self_ns", "seq_nr", "scope", "rf_thread_id"):
        assert np.array_equal(getattr(loaded, column), getattr(live, column)), column
    # the trace writes "Fwd thread id" only with a sequence number (as torch does)
    has_seq = live.seq_nr >= 0
    assert np.array_equal(loaded.fwd_thread_id[has_seq], live.fwd_thread_id[has_seq])
    assert (loaded.scope == SCOPE_BACKWARD_FUNCTION).sum() > 0
    assert (loaded.scope == SCOPE_USER).sum() == 2 + 2 * 2  # ranges, zero_grad, step
    if shapes:
        for i in np.flatnonzero(live.input_offset != 0xFFFFFFFF)[:200].tolist():
            recorded = live.inputs(i)
            if recorded.types:  # ranges record zero inputs, and the trace writes none
                assert loaded.inputs(i) == recorded, live.name(i)


def test_round_trip_rewrites_the_same_trace(mlp_traces, tmp_path):
    """Loaded and written again, a trace has the same events (flows included)."""
    _, path = mlp_traces[True]
    again = write_chrome_trace(load_session(path), str(tmp_path / "again.json"))
    with gzip.open(path, "rt") as f:
        first = json.load(f)
    with open(again) as f:
        second = json.load(f)
    assert second["traceEvents"] == first["traceEvents"]
    assert any(e.get("cat") == "fwdbwd" for e in second["traceEvents"])
    same_keys = set(first) - {"trace_id", "traceName"}
    assert {k: second.get(k) for k in same_keys} == {k: first[k] for k in same_keys}


def test_round_trip_under_the_python_collector(tmp_path, monkeypatch):
    monkeypatch.setenv("OPSCOPE_COLLECTOR", "python")
    prof = _profile_mlp(record_shapes=True)
    path = str(tmp_path / "python.json")
    prof.export_chrome_trace(path)
    loaded = load_session(path)
    assert _table(key_averages(loaded.table)) == prof.key_averages().table(
        sort_by="self_cpu_time_total", row_limit=-1)


def test_round_trip_with_modules_and_flops(tmp_path):
    prof = _profile_mlp(with_modules=True, with_flops=True, record_shapes=True)
    path = str(tmp_path / "modules.json")
    prof.export_chrome_trace(path)
    loaded = load_session(path)
    assert set(loaded.modules) == set(prof.session.modules)
    assert loaded.modules["head (Linear)"] == prof.session.modules["head (Linear)"]
    assert np.array_equal(loaded.flops, prof.session.flops) and loaded.flops.sum() > 0
    live_text = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=-1)
    assert _table(key_averages(loaded.table, flops=loaded.flops), with_flops=True) == live_text

    from opscope.analysis.modules import module_rows
    from opscope.event_list import ModuleList

    assert ModuleList(module_rows(loaded), with_flops=True).table() == prof.module_table()


def test_round_trip_with_memory_and_stacks(tmp_path):
    prof = _profile_mlp(profile_memory=True, with_stack=True)
    path = str(tmp_path / "memory.json")
    prof.export_chrome_trace(path)
    loaded = load_session(path)
    live = prof.session
    assert len(loaded.memory) == len(live.memory) > 0
    fields = ["time_ns", "addr", "bytes", "total_allocated", "device_type", "device_index"]
    shift = int(loaded.start_ns) - int(live.start_ns)
    assert np.array_equal(loaded.memory["time_ns"] - shift, live.memory["time_ns"])
    assert np.array_equal(loaded.memory[fields[1:]], live.memory[fields[1:]])
    assert loaded.stacks == live.stacks and sum(map(bool, loaded.stacks)) > 100
    for kwargs in ({}, {"group_by_stack_n": 3}):
        rows = key_averages(loaded.table, stacks=loaded.stacks, memory=loaded.event_memory,
                            **kwargs)
        assert _table(rows, profile_memory=True) == prof.key_averages(**kwargs).table(
            sort_by="self_cpu_time_total", row_limit=-1)
    again = write_chrome_trace(loaded, str(tmp_path / "again.json"))
    with open(path) as f, open(again) as g:
        assert json.load(g)["traceEvents"] == json.load(f)["traceEvents"]


def test_metadata_and_options_come_back(tmp_path):
    step = mlp_step_fn()
    with opscope.profile(profile_memory=True) as prof:
        step()
    prof.add_metadata_json("distributedInfo", '{"rank": 3, "world_size": 8}')
    prof.add_metadata("note", "hello")
    path = str(tmp_path / "meta.json")
    prof.export_chrome_trace(path)
    loaded = load_session(path)
    assert loaded.options["profile_memory"] and not loaded.options["with_stack"]
    assert json.loads(loaded.metadata["distributedInfo"]) == {"rank": 3, "world_size": 8}
    assert json.loads(loaded.metadata["note"]) == "hello"
    assert loaded.start_ns <= int(loaded.table.start_ns.min())
    assert loaded.stop_ns >= int(loaded.table.end_ns.max())


# -- tensorboard_trace_handler folders ----------------------------------------------------

def test_folder_loads_its_newest_trace(tmp_path):
    folder = tmp_path / "log"
    step = mlp_step_fn()
    with opscope.profile(schedule=opscope.schedule(wait=0, warmup=1, active=1, repeat=2),
                         on_trace_ready=opscope.tensorboard_trace_handler(str(folder),
                                                                           use_gzip=True)) as p:
        for _ in range(4):
            step()
            p.step()
    files = sorted(str(f) for f in folder.iterdir())
    assert len(files) == 2 and all(f.endswith(".pt.trace.json.gz") for f in files)
    os.utime(files[0], (2_000_000_000, 2_000_000_000))  # the "older" one is now newest
    os.utime(files[1], (1_000_000_000, 1_000_000_000))
    (folder / "notes.json").write_text("{}")  # not a trace file name: ignored
    assert load_session(str(folder)).source_path == files[0]


# -- torch.profiler's own traces ----------------------------------------------------------

def _torch_rows(rows):
    return {(r.key, r.count, round(r.self_cpu_time_total, 3), round(r.cpu_time_total, 3))
            for r in rows}


def _attribution_blur_ns(prof) -> float:
    """How far from an op's edge torch.profiler may count an allocation in or out of the op.

    torch up to 2.8 finds an op's allocations by its start and end in float microseconds
    (``MemRecordsAcc.in_interval(start_us, end_us)``) of times that may count from the epoch:
    at today's dates a double holds them to 0.25 us. Later torch compares integer ns.
    """
    from torch.autograd.profiler_util import MemRecordsAcc

    if "start_ns" in inspect.signature(MemRecordsAcc.in_interval).parameters:
        return 1.0
    latest = max((e.start_ns() for e in prof.profiler.kineto_results.events()), default=0)
    return max(1.0, float(np.spacing(latest / 1000.0)) * 1000.0)


def _allocation_near_an_op_edge(loaded, blur_ns: float) -> bool:
    """Whether an allocation lies within ``blur_ns`` of an op's start or end."""
    edges = np.sort(np.concatenate([loaded.table.start_ns, loaded.table.end_ns]))
    t = loaded.memory["time_ns"]
    if len(edges) == 0 or len(t) == 0:
        return False
    pos = np.searchsorted(edges, t)
    below = edges[np.clip(pos - 1, 0, len(edges) - 1)]
    above = edges[np.clip(pos, 0, len(edges) - 1)]
    return bool(((np.abs(t - below) <= blur_ns) | (np.abs(above - t) <= blur_ns)).any())


@pytest.mark.parametrize("with_stack", [False, True])
def test_torch_profiler_trace_matches_its_key_averages(tmp_path, with_stack):
    step = mlp_step_fn()
    step()
    path = str(tmp_path / "torch.json")
    for _ in range(5):  # a recording whose allocations all lie clear of the ops' edges
        with torch.profiler.profile(record_shapes=True, profile_memory=True,
                                    with_stack=with_stack) as prof:
            for _ in range(2):
                with torch.profiler.record_function("my_step"):
                    step()
        prof.export_chrome_trace(path)
        loaded = load_session(path)
        blur_ns = _attribution_blur_ns(prof)
        clear = not _allocation_near_an_op_edge(loaded, blur_ns)
        if clear:
            break
    assert _torch_rows(key_averages(loaded.table)) == _torch_rows(prof.key_averages())
    by_shape = lambda rows: {(r.key, str(r.input_shapes), r.count) for r in rows}  # noqa: E731
    assert by_shape(key_averages(loaded.table, group_by_input_shape=True)) == \
        by_shape(prof.key_averages(group_by_input_shape=True))
    # with_stack: Python functions are rows only where the installed torch counts them
    # (test_torch_traces_by_version.py checks each torch's rule)
    events = [e for e in prof.events() if not getattr(e, "is_python_function", False)
              or loaded.python_functions == "counted"]
    assert len(loaded.table) == len(events)
    assert bool(loaded.python_function_rows.any()) is \
        (with_stack and loaded.python_functions == "counted")
    # [memory] events become allocator records, attributed to ops as torch does (where
    # torch's own attribution is sharp: no allocation within its blur of an op's edge)
    # torch counts an allocation in every op whose span holds it, on any thread (docs/guide.md,
    # "Differences"); opscope in the ops of its own thread: compared on the keys of events
    # of threads that allocate (another thread's frames, e.g. an idle pool's, are left out,
    # and so is a key with events on both: under pytest-xdist, execnet's `run` frame is open
    # on the main thread and on its I/O thread)
    on_allocating = np.isin(loaded.table.thread_index, loaded.memory["thread_index"])
    names = loaded.table.symbols.names
    keys = ({names[i] for i in np.unique(loaded.table.name_id[on_allocating])}
            - {names[i] for i in np.unique(loaded.table.name_id[~on_allocating])})
    memory_rows = lambda rows: {(r.key, r.count, r.cpu_memory_usage,  # noqa: E731
                                 r.self_cpu_memory_usage) for r in rows if r.key in keys}
    if clear or blur_ns <= 1.0:
        assert memory_rows(key_averages(loaded.table, memory=loaded.event_memory)) == \
            memory_rows(prof.key_averages())
    assert len(loaded.memory) and (loaded.memory["bytes"] > 0).any()
    assert (loaded.memory["bytes"] < 0).any()
    assert loaded.start_ns <= loaded.memory["time_ns"].min()
    assert loaded.memory["time_ns"].max() <= loaded.stop_ns


def test_an_idle_threads_frames_get_no_memory_of_other_threads(tmp_path):
    """torch.profiler counts the main thread's allocations in an idle pool thread's Python
    frames (their span holds them); opscope counts none there (docs/guide.md, "Differences")."""
    step = mlp_step_fn()
    step()
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        pool.submit(int).result()  # the worker now waits in _worker, its frames open
        with torch.profiler.profile(profile_memory=True, with_stack=True) as prof:
            step()
        path = str(tmp_path / "torch.json")
        prof.export_chrome_trace(path)
    loaded = load_session(path)
    ours = {r.key: r.cpu_memory_usage
            for r in key_averages(loaded.table, memory=loaded.event_memory)}
    theirs = {r.key: r.cpu_memory_usage for r in prof.key_averages()}
    pool_frames = [k for k in theirs if k.startswith("concurrent/futures/thread.py")]
    if not pool_frames:  # torch 2.4 and 2.15 record no open frames of other threads
        pytest.skip(f"torch {torch.__version__} records no Python frames of an idle thread")
    assert all(theirs[k] != 0 for k in pool_frames)
    assert all(ours[k] == 0 for k in pool_frames)


def table_cells(text: str) -> list:
    """Rows of a printed table as (name, self CPU, CPU total, calls): the exact sums.

    The average and percent columns are left out: they divide sums whose last
    float bits depend on summation order, so a value exactly halfway between
    two printed decimals may round either way.
    """
    rows = []
    for line in text.splitlines()[3:]:
        if line.startswith("-") or not line.strip():
            break
        cells = [c for c in line.strip().split("  ") if c.strip()]
        rows.append((cells[0].strip(), cells[2].strip(), cells[4].strip(), cells[-1].strip()))
    return rows


def test_torch_table_matches_torchs_own(tmp_path):
    path = str(tmp_path / "torch.json")
    prof = torch_profiler_trace(path)
    # every row (no row_limit): two ops with equal CPU totals may come in either order,
    # and a row_limit could cut between them
    expected = prof.key_averages().table(sort_by="cpu_time_total", row_limit=-1)
    got = EventList(key_averages(load_session(path).table)).table(sort_by="cpu_time_total",
                                                                  row_limit=-1)
    got_rows, expected_rows = table_cells(got), table_cells(expected)
    assert len(got_rows) >= 15
    assert [r[2] for r in got_rows] == [r[2] for r in expected_rows]  # same order of totals
    assert sorted(got_rows) == sorted(expected_rows)  # the same rows (ties in any order)
    assert got.splitlines()[:3] == expected.splitlines()[:3]
    assert got.splitlines()[-1] == expected.splitlines()[-1]  # Self CPU time total


# -- stacks, filtering, folding (synthetic trace) ------------------------------------------

def _event(name, ts, dur, cat="cpu_op", **args):
    return {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": 7, "ts": ts, "dur": dur,
            "args": args}


def test_stacks_follow_the_rows_build_session_keeps(tmp_path):
    doc = {"with_stack": 1, "traceEvents": [
        _event("aten::to", 3.0, 4.0, **{"Call stack": "inner.py(3): g;outer.py(1): f;"}),
        _event("aten::to", 3.0, 4.0, **{"Call stack": "folded;"}),  # same-name only child
        _event("aten::is_leaf", 8.0, 1.0, **{"Call stack": "dropped;"}),  # torch filters it
        _event("my_range", 0.0, 20.0, cat="user_annotation"),
        _event("aten::add", 10.0, 2.0, **{"Call stack": "a.py(9): h;outer.py(1): f;"}),
    ]}
    path = tmp_path / "stacks.json"
    path.write_text(json.dumps(doc))
    s = load_session(str(path))
    names = [s.table.name(i) for i in range(len(s.table))]
    assert names == ["my_range", "aten::to", "aten::add"]
    assert s.stacks == [None, ["inner.py(3): g", "outer.py(1): f"],
                        ["a.py(9): h", "outer.py(1): f"]]
    assert s.table.parent.tolist() == [-1, 0, 0]
    rows = key_averages(s.table, group_by_stack_n=1, stacks=s.stacks)
    assert [(r.key, r.stack) for r in rows] == [("my_range", []), ("aten::to", ["inner.py(3): g"]),
                                               ("aten::add", ["a.py(9): h"])]


def test_json_array_format_is_a_trace(tmp_path):
    """Chrome's other layout: the file is the event list itself."""
    path = tmp_path / "array.json"
    path.write_text(json.dumps([_event("aten::mm", 1.0, 2.0), {"ph": "M", "name": "x"}]))
    s = load_session(str(path))
    assert [s.table.name(i) for i in range(len(s.table))] == ["aten::mm"]


def test_times_are_exact_nanoseconds_at_kineto_magnitudes(tmp_path):
    """Kineto writes absolute microseconds (~4e12): still exact to the nanosecond."""
    base = 4432293442108.941
    doc = {"traceEvents": [_event("outer", base, 1054.566),
                           _event("inner", base + 0.001, 1054.564)]}
    path = tmp_path / "kineto.json"
    path.write_text(json.dumps(doc))
    t = load_session(str(path)).table
    assert t.duration_ns.tolist() == [1054566, 1054564]
    assert (t.start_ns[1] - t.start_ns[0]) == 1
    assert t.self_ns.tolist() == [2, 1054564]


# -- input re-encoding ---------------------------------------------------------------------

@pytest.mark.parametrize("dims, types, strides, concrete", [
    ([[2, 3], [3]], ["float", "c10::BFloat16"], [[3, 1], [1]], ["", ""]),
    ([[], [], [], []], ["Scalar", "Scalar", "Scalar", "ScalarList"], [[], [], [], []],
     ["1", "0.5", "True", "[2, -1]"]),
    ([[], [], [4]], ["TensorList", "String", "long int"], [[], [], [1]], ["", "", ""]),
    ([], [], [], []),
])
def test_inputs_reencode_to_what_the_trace_said(dims, types, strides, concrete):
    blob = np.array(encode_trace_inputs(dims, types, strides, concrete), dtype=np.int64)
    rec = decode_inputs(blob, 0)
    assert (rec.shapes, rec.types, rec.strides, rec.concrete) == (dims, types, strides, concrete)


def test_unknown_input_type_keeps_its_shape():
    rec = decode_inputs(np.array(encode_trace_inputs([[5, 2]], ["c10::Float8_e8m0fnu_new"],
                                                     [[2, 1]], [""]), dtype=np.int64), 0)
    assert rec.shapes == [[5, 2]] and rec.types == [""]


def test_synthetic_session_round_trips_inputs_and_threads(tmp_path):
    session = make_session([
        Op("step", 0, 100, scope=SCOPE_USER),
        Op("aten::mm", 10, 30, inputs=[TensorSpec((2, 3)), TensorSpec((3, 4), strides=(1, 3))]),
        Op("aten::add", 40, 45, thread=1, rf_thread=2, inputs=[TensorSpec((4,)), 1, 2.5]),
    ], thread_ids=(11, 22), options={"record_shapes": True})
    path = write_chrome_trace(session, str(tmp_path / "synthetic.json"))
    loaded = load_session(path)
    assert loaded.table.os_tid.tolist() == [11, 11, 22]
    assert loaded.table.rf_thread_id.tolist() == [1, 1, 2]
    assert loaded.table.inputs(1) == session.table.inputs(1)
    assert loaded.table.inputs(2).concrete == ["", "1", "2.5"]
    assert loaded.start_ns + loaded.epoch_offset_ns == session.start_ns + session.epoch_offset_ns


# -- errors --------------------------------------------------------------------------------

def _broken_files(folder):
    """name -> (path, words the message must hold)."""
    (folder / "empty_dir").mkdir()
    (folder / "not_json.json").write_text("this is not a trace\n")
    (folder / "binary.json").write_bytes(bytes(range(256)))
    (folder / "empty.json").write_text("")
    (folder / "no_events.json").write_text(json.dumps({"schemaVersion": 1, "displayTimeUnit": "ms"}))
    (folder / "events_not_list.json").write_text(json.dumps({"traceEvents": {"a": 1}}))
    (folder / "number.json").write_text("42")
    (folder / "bad_ts.json").write_text(json.dumps({"traceEvents": [
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": "soon", "dur": 1}]}))
    whole = gzip.compress(json.dumps({"traceEvents": [_event("a", 0, 1)] * 200}).encode())
    (folder / "truncated.json.gz").write_bytes(whole[: len(whole) // 2])
    (folder / "corrupt.json.gz").write_bytes(whole[:10] + b"\x00" * 50 + whole[60:])
    return {
        "missing": (folder / "missing.json", ["no such file"]),
        "empty_dir": (folder / "empty_dir", ["*.pt.trace.json"]),
        "not_json": (folder / "not_json.json", ["not a trace", "not valid JSON"]),
        "binary": (folder / "binary.json", ["not a trace"]),
        "empty": (folder / "empty.json", ["empty"]),
        "no_events": (folder / "no_events.json", ["no 'traceEvents'"]),
        "events_not_list": (folder / "events_not_list.json", ["'traceEvents' is a dict"]),
        "number": (folder / "number.json", ["not a trace"]),
        "bad_ts": (folder / "bad_ts.json", ["aten::mm", "traceEvents[0].ts", "got string 'soon'"]),
        "truncated": (folder / "truncated.json.gz", ["truncated gzip"]),
        "corrupt": (folder / "corrupt.json.gz", ["gzip"]),
    }


def test_every_bad_file_is_one_line_naming_it(tmp_path):
    for name, (path, words) in _broken_files(tmp_path).items():
        with pytest.raises(TraceLoadError) as info:
            load_session(str(path))
        message = str(info.value)
        assert isinstance(info.value, ValueError)
        assert "\n" not in message, name
        assert message.startswith(f"trace {str(path)!r}: "), (name, message)
        for word in words:
            assert word in message, (name, word, message)
