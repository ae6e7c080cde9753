"""opscope.export.chrome_trace: torch 2.13's Chrome trace schema, on synthetic sessions."""

import collections
import gzip
import json
import math
import os

import pytest

from opscope.export.chrome_trace import (chrome_trace_to, forward_backward_links,
                                         write_chrome_trace)
from opscope.export.trace_header import trace_header, validate_metadata_json
from opscope.outputs import FORMATS, get_format
from synthetic import (
    CLOCK_BASE_NS, EPOCH_OFFSET_NS, SCOPE_BACKWARD_FUNCTION, SCOPE_USER, Op, TensorSpec,
    make_session,
)

ODD_NAME = 'say "hi"\\there\nnext\tline \x01 ünï 😀 </script>'
MAIN_TID, WORKER_TID = 4242, 4300


def training_step_ops():
    """A forward/backward step on the main thread plus a range on a worker thread."""
    return [
        Op("ProfilerStep#1", 0, 1000, scope=SCOPE_USER,
           stack=["profiler.py(10): step", "train.py(3): <module>"]),
        Op("aten::linear", 10.125, 60, seq=21,
           inputs=[TensorSpec((32, 64)), TensorSpec((128, 64)), TensorSpec((128,))],
           stack=["<built-in function linear>", "model.py(8): forward", "train.py(3): <module>"]),
        Op("aten::t", 11, 14, seq=22),
        Op("aten::addmm", 15, 55, seq=21,  # same seq as linear, nested: linear is outermost
           inputs=[TensorSpec((128,)), TensorSpec((32, 64)), TensorSpec((64, 128), (1, 64)), 1, 1]),
        Op("aten::relu", 70, 90, seq=23, inputs=[TensorSpec((32, 128))]),
        Op(ODD_NAME, 100, 150, scope=SCOPE_USER),
        Op("aten::sum", 200, 210, seq=24, rf_thread=2),  # recorded on another rf thread
        # backward: each links to the forward op with its seq on fwd thread 1
        Op("autograd::engine::evaluate_function: ReluBackward0", 300, 330, seq=23, fwd_thread=1),
        Op("ReluBackward0", 301, 329, scope=SCOPE_BACKWARD_FUNCTION, seq=23, fwd_thread=1),
        Op("AddmmBackward0", 340, 400, scope=SCOPE_BACKWARD_FUNCTION, seq=21, fwd_thread=1),
        Op("aten::mm", 345, 360),
        Op("SumBackward0", 410, 420, scope=SCOPE_BACKWARD_FUNCTION, seq=24, fwd_thread=1),
        Op("OrphanBackward0", 430, 440, scope=SCOPE_BACKWARD_FUNCTION, seq=99, fwd_thread=1),
        Op("worker range", 500, 520, thread=1, scope=SCOPE_USER),
    ]


@pytest.fixture
def session():
    return make_session(training_step_ops(), thread_ids=(MAIN_TID, WORKER_TID),
                        options={"record_shapes": True, "with_stack": True},
                        metadata={"distributedInfo": '{"backend":"gloo","rank":0,"world_size":1}'})


def write_and_load(session, path):
    write_chrome_trace(session, path)
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        text = f.read()
    return text, json.loads(text, parse_constant=lambda c: pytest.fail(f"{c} in output"))


def ops_by_name(doc):
    return {e["name"]: e for e in doc["traceEvents"]
            if e["ph"] == "X" and e.get("cat") in ("cpu_op", "user_annotation")}


def test_top_level_keys_in_torch_order(session, tmp_path):
    _, doc = write_and_load(session, tmp_path / "t.json")
    assert list(doc) == ["schemaVersion", "deviceProperties", "with_stack", "record_shapes",
                         "distributedInfo", "trace_id", "displayTimeUnit",
                         "baseTimeNanoseconds", "traceEvents", "traceName"]
    assert doc["schemaVersion"] == 1 and doc["deviceProperties"] == []
    assert doc["with_stack"] == 1 and doc["record_shapes"] == 1
    assert doc["displayTimeUnit"] == "ms"
    assert doc["traceName"] == str(tmp_path / "t.json")
    assert len(doc["trace_id"]) == 32 and doc["trace_id"] == doc["trace_id"].upper()
    int(doc["trace_id"], 16)


def test_all_option_flags_written_as_one_and_off_flags_omitted(tmp_path):
    options = {"with_stack": True, "profile_memory": True, "record_shapes": True,
               "with_modules": True, "with_flops": True}
    _, doc = write_and_load(make_session([Op("a", 0, 1)], options=options), tmp_path / "a.json")
    assert [k for k in doc if k in options] == list(options)
    assert all(doc[k] == 1 for k in options)
    _, doc = write_and_load(make_session([Op("a", 0, 1)]), tmp_path / "b.json")
    assert not set(options) & set(doc)


def test_distributed_info_is_a_json_object_with_standard_separators(session, tmp_path):
    text, doc = write_and_load(session, tmp_path / "t.json")
    assert doc["distributedInfo"] == {"backend": "gloo", "rank": 0, "world_size": 1}
    assert '"rank": 0' in text  # HTA finds the rank with the regex "rank":\s+(\d+)


def test_user_metadata_values_keep_their_json_types(tmp_path):
    metadata = {"note": '"a \\"quoted\\" string"', "count": "3", "flags": "[true, null]",
                "odd " + ODD_NAME: json.dumps({"k": ODD_NAME})}
    _, doc = write_and_load(make_session([Op("a", 0, 1)], metadata=metadata), tmp_path / "t.json")
    assert doc["note"] == 'a "quoted" string'
    assert doc["count"] == 3
    assert doc["flags"] == [True, None]
    assert doc["odd " + ODD_NAME] == {"k": ODD_NAME}


@pytest.mark.parametrize("text", ["not json", "{'single': 1}", "NaN", "[1, Infinity]", "", "1 2"])
def test_invalid_metadata_raises_naming_the_key_and_writes_nothing(tmp_path, text):
    session = make_session([Op("a", 0, 1)], metadata={"my_key": text})
    with pytest.raises(ValueError, match="my_key"):
        write_chrome_trace(session, tmp_path / "t.json")
    assert os.listdir(tmp_path) == []


def test_validate_metadata_json(tmp_path):
    assert validate_metadata_json("k", '{"rank": 3}') == {"rank": 3}
    with pytest.raises(ValueError, match="'k'.*not valid JSON"):
        validate_metadata_json("k", "{")
    with pytest.raises(ValueError, match="traceEvents.*reserved"):
        validate_metadata_json("traceEvents", "[]")
    with pytest.raises(ValueError, match="JSON text"):
        validate_metadata_json("k", 3)


def test_event_counts_by_phase_and_category(session, tmp_path):
    _, doc = write_and_load(session, tmp_path / "t.json")
    counts = collections.Counter(f'{e["ph"]}|{e.get("cat")}' for e in doc["traceEvents"])
    assert counts == {
        "M|None": 3 + 2 * 2,  # process name/labels/sort index, name + sort index per thread
        "X|cpu_op": 11,
        "X|user_annotation": 3,
        "s|fwdbwd": 2,
        "f|fwdbwd": 2,
        "X|Trace": 1,
        "i|None": 2,
    }


def test_metadata_events(session, tmp_path):
    _, doc = write_and_load(session, tmp_path / "t.json")
    meta = [e for e in doc["traceEvents"] if e["ph"] == "M"]
    assert [(e["name"], e["tid"], e["args"]) for e in meta] == [
        ("process_name", 0, {"name": "python"}),
        ("process_labels", 0, {"labels": "CPU"}),
        ("process_sort_index", 0, {"sort_index": 4242}),
        ("thread_name", MAIN_TID, {"name": f"thread {MAIN_TID} (python)"}),
        ("thread_sort_index", MAIN_TID, {"sort_index": MAIN_TID}),
        ("thread_name", WORKER_TID, {"name": f"thread {WORKER_TID} (python)"}),
        ("thread_sort_index", WORKER_TID, {"sort_index": WORKER_TID}),
    ]
    assert all(e["pid"] == 4242 for e in meta)


def test_op_events_fields_and_ids(session, tmp_path):
    _, doc = write_and_load(session, tmp_path / "t.json")
    xs = [e for e in doc["traceEvents"] if e.get("cat") in ("cpu_op", "user_annotation")]
    assert [e["args"]["External id"] for e in xs] == list(range(1, len(xs) + 1))
    assert [e["args"]["Ev Idx"] for e in xs] == list(range(len(xs)))
    assert [e["ts"] for e in xs] == sorted(e["ts"] for e in xs)
    for e in xs:
        assert list(e)[:8] == ["ph", "cat", "name", "pid", "tid", "ts", "dur", "args"]
        assert e["pid"] == 4242 and e["args"]["Record function id"] == 0
    by_name = ops_by_name(doc)
    assert by_name["worker range"]["tid"] == WORKER_TID
    assert by_name["aten::relu"]["tid"] == MAIN_TID
    assert by_name["ProfilerStep#1"]["cat"] == "user_annotation"
    assert by_name["aten::relu"]["cat"] == "cpu_op"
    assert by_name["ReluBackward0"]["cat"] == "cpu_op"


def test_timestamps_are_unix_microseconds_since_base_with_ns_precision(session, tmp_path):
    text, doc = write_and_load(session, tmp_path / "t.json")
    base = doc["baseTimeNanoseconds"]
    assert base % 1_000_000_000 == 0
    linear = ops_by_name(doc)["aten::linear"]
    unix_start = CLOCK_BASE_NS + 10_125 + EPOCH_OFFSET_NS
    assert round(linear["ts"] * 1000) + base == unix_start
    assert linear["dur"] == pytest.approx(49.875, abs=1e-9)
    expected = f'"ts": {(unix_start - base) // 1000}.{(unix_start - base) % 1000:03d}'
    assert expected in text
    assert all(e["ts"] >= 0 for e in doc["traceEvents"])


def test_sequence_number_and_fwd_thread_id_only_with_a_sequence_number(session, tmp_path):
    _, doc = write_and_load(session, tmp_path / "t.json")
    by_name = ops_by_name(doc)
    assert by_name["aten::relu"]["args"]["Sequence number"] == 23
    assert by_name["aten::relu"]["args"]["Fwd thread id"] == 0
    assert by_name["AddmmBackward0"]["args"]["Sequence number"] == 21
    assert by_name["AddmmBackward0"]["args"]["Fwd thread id"] == 1
    for name in ("aten::mm", "ProfilerStep#1", "worker range"):
        assert "Sequence number" not in by_name[name]["args"]
        assert "Fwd thread id" not in by_name[name]["args"]


def test_recorded_inputs(session, tmp_path):
    _, doc = write_and_load(session, tmp_path / "t.json")
    args = ops_by_name(doc)["aten::addmm"]["args"]
    assert args["Input Dims"] == [[128], [32, 64], [64, 128], [], []]
    assert args["Input Strides"] == [[1], [64, 1], [1, 64], [], []]
    assert args["Input type"] == ["float", "float", "float", "Scalar", "Scalar"]
    assert args["Concrete Inputs"] == ["", "", "", "1", "1"]
    for name in ("aten::mm", "aten::t", "ProfilerStep#1"):
        assert "Input Dims" not in ops_by_name(doc)[name]["args"]


def test_call_stack_innermost_first_with_trailing_semicolon(session, tmp_path):
    _, doc = write_and_load(session, tmp_path / "t.json")
    by_name = ops_by_name(doc)
    assert by_name["aten::linear"]["args"]["Call stack"] == (
        "<built-in function linear>;model.py(8): forward;train.py(3): <module>;")
    assert by_name["ProfilerStep#1"]["args"]["Call stack"] == (
        "profiler.py(10): step;train.py(3): <module>;")
    assert "Call stack" not in by_name["aten::relu"]["args"]


def test_fwdbwd_flows_link_backward_to_outermost_forward(session, tmp_path):
    _, doc = write_and_load(session, tmp_path / "t.json")
    by_name = ops_by_name(doc)
    starts = {e["id"]: e for e in doc["traceEvents"] if e["ph"] == "s"}
    finishes = {e["id"]: e for e in doc["traceEvents"] if e["ph"] == "f"}
    assert sorted(starts) == sorted(finishes) == [1, 2]
    pairs = []
    for k in sorted(starts):
        s, f = starts[k], finishes[k]
        assert (s["cat"], s["name"], f["cat"], f["name"]) == ("fwdbwd",) * 4
        assert f["bp"] == "e" and "bp" not in s
        fwd = [n for n, e in by_name.items() if e["ts"] == s["ts"] and e["tid"] == s["tid"]]
        bwd = [n for n, e in by_name.items() if e["ts"] == f["ts"] and e["tid"] == f["tid"]]
        pairs.append((fwd, bwd))
    # ids in backward time order; addmm (same seq, nested) loses to linear;
    # SumBackward0 (its forward ran on rf thread 2) and the orphan get no flow
    assert pairs == [(["aten::relu"], ["ReluBackward0"]),
                     (["aten::linear"], ["AddmmBackward0"])]


def test_forward_backward_links_matches_rf_thread(tmp_path):
    session = make_session([
        Op("aten::mul", 0, 10, seq=5, rf_thread=1),
        Op("engine op", 12, 14, seq=5, rf_thread=2, fwd_thread=1),  # not a forward op
        Op("aten::mul", 20, 30, seq=5, rf_thread=2),
        Op("MulBackward0", 40, 50, scope=SCOPE_BACKWARD_FUNCTION, seq=5, fwd_thread=2),
        Op("MulBackward0", 60, 70, scope=SCOPE_BACKWARD_FUNCTION, seq=5, fwd_thread=1),
        Op("MulBackward0", 80, 90, scope=SCOPE_BACKWARD_FUNCTION, seq=6, fwd_thread=1),
    ])
    assert forward_backward_links(session) == [(2, 3), (0, 4)]


def test_trace_span_and_window_markers(session, tmp_path):
    _, doc = write_and_load(session, tmp_path / "t.json")
    events = doc["traceEvents"]
    span = [e for e in events if e.get("cat") == "Trace"]
    assert len(span) == 1
    span = span[0]
    assert (span["name"], span["pid"], span["tid"], span["args"]) == (
        "PyTorch Profiler (0)", "Spans", "PyTorch Profiler", {"Op count": 0})
    marks = [e for e in events if e["ph"] == "i"]
    assert [(m["name"], m["pid"], m["tid"], m["s"]) for m in marks] == [
        ("Iteration Start: PyTorch Profiler", "Traces", "Trace PyTorch Profiler", "g"),
        ("Record Window End", "", "", "g")]
    # window: 1 us before the first op to 1 us after the last
    assert span["dur"] == pytest.approx(1002.0)
    assert marks[0]["ts"] == span["ts"]
    assert marks[1]["ts"] == pytest.approx(span["ts"] + span["dur"])
    first = min(e["ts"] for e in events if e.get("cat") == "user_annotation")
    assert span["ts"] == pytest.approx(first - 1)


def test_odd_names_round_trip(tmp_path):
    session = make_session([Op(ODD_NAME, 0, 10, stack=[ODD_NAME, "a.py(1): <module>"]),
                            Op("", 20, 30), Op("\\", 40, 50), Op('"', 60, 70)],
                           options={"with_stack": True})
    text, doc = write_and_load(session, tmp_path / "t.json")
    names = [e["name"] for e in doc["traceEvents"] if e.get("cat") == "cpu_op"]
    assert names == [ODD_NAME, "", "\\", '"']
    assert ops_by_name(doc)[ODD_NAME]["args"]["Call stack"] == ODD_NAME + ";a.py(1): <module>;"
    text.encode("ascii")  # non-ASCII is escaped: readable whatever the reader's locale


def test_gzip_variant_holds_the_same_trace(session, tmp_path):
    _, plain = write_and_load(session, tmp_path / "t.json")
    _, zipped = write_and_load(session, tmp_path / "t.json.gz")
    assert (tmp_path / "t.json.gz").read_bytes()[:2] == b"\x1f\x8b"
    assert zipped["traceEvents"] == plain["traceEvents"]
    assert zipped["traceName"] == str(tmp_path / "t.json.gz")


def test_one_event_per_line(session, tmp_path):
    text, doc = write_and_load(session, tmp_path / "t.json")
    event_lines = [line for line in text.splitlines() if line.startswith('{"ph"')]
    assert len(event_lines) == len(doc["traceEvents"])
    assert [json.loads(line.rstrip(",")) for line in event_lines] == doc["traceEvents"]


def test_empty_session_is_a_valid_trace(tmp_path):
    _, doc = write_and_load(make_session([]), tmp_path / "t.json")
    assert [e["ph"] for e in doc["traceEvents"]] == ["M", "M", "M", "X", "i", "i"]
    assert_viewer_loadable(doc)


def test_failure_while_writing_leaves_no_file(tmp_path):
    session = make_session([Op("a", 0, 10, stack=["f.py(1): f"]), Op("b", 20, 30)])
    session.stacks[1] = [object()]  # not a string: fails in the middle of the events
    (tmp_path / "t.json").write_text("old")
    with pytest.raises(TypeError):
        write_chrome_trace(session, tmp_path / "t.json")
    assert os.listdir(tmp_path) == ["t.json"]
    assert (tmp_path / "t.json").read_text() == "old"


def test_missing_folder_is_named(session, tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist") as info:
        write_chrome_trace(session, tmp_path / "missing" / "t.json")
    assert str(tmp_path / "missing") in str(info.value)
    assert os.listdir(tmp_path) == []


def test_header_order_lets_metadata_override_a_flag(session):
    session.metadata["with_stack"] = "0"
    header = trace_header(session)
    assert header["with_stack"] == 0
    assert list(header).count("with_stack") == 1


def test_registry(session, tmp_path):
    assert get_format("chrome_trace").write is chrome_trace_to
    assert FORMATS["chrome_trace"].suffix == ".json"
    get_format("chrome_trace")(session, tmp_path / "r.json")
    assert json.loads((tmp_path / "r.json").read_text())["schemaVersion"] == 1
    with pytest.raises(ValueError, match="unknown export format 'html'.*chrome_trace.*stacks"):
        get_format("html")


# What chrome://tracing (catapult) and Perfetto's JSON importer need. No offline
# build of either is available here, so this checks their documented rules.
def assert_viewer_loadable(doc):
    assert isinstance(doc, dict) and isinstance(doc["traceEvents"], list)
    assert doc.get("displayTimeUnit", "ms") in ("ms", "ns")
    slices = collections.defaultdict(list)  # (pid, tid) -> [(start_ns, end_ns)]
    named_threads, named_processes = set(), set()
    flows = collections.defaultdict(list)
    for e in doc["traceEvents"]:
        assert isinstance(e.get("ph"), str) and len(e["ph"]) == 1, e
        assert isinstance(e.get("name"), str), e
        assert isinstance(e.get("pid"), (int, str)) and isinstance(e.get("tid"), (int, str)), e
        assert isinstance(e.get("ts"), (int, float)) and math.isfinite(e["ts"]), e
        assert e["ts"] >= 0, e
        if "args" in e:
            assert isinstance(e["args"], dict), e
        if "cat" in e:
            assert isinstance(e["cat"], str), e
        if e["ph"] == "M":
            assert e["name"] in ("process_name", "process_labels", "process_sort_index",
                                 "thread_name", "thread_sort_index"), e
            (named_threads if e["name"].startswith("thread") else named_processes).add(
                (e["pid"], e["tid"]) if e["name"].startswith("thread") else e["pid"])
        elif e["ph"] == "X":
            assert isinstance(e.get("dur"), (int, float)) and e["dur"] >= 0, e
            start = round(e["ts"] * 1000)
            slices[(e["pid"], e["tid"])].append((start, start + round(e["dur"] * 1000)))
        elif e["ph"] == "i":
            assert e.get("s", "t") in ("g", "p", "t"), e
        elif e["ph"] in ("s", "f"):
            assert isinstance(e.get("id"), (int, str)) and isinstance(e.get("cat"), str), e
            flows[(e["cat"], e["name"], e["id"])].append(e)
        else:
            pytest.fail(f"unexpected phase {e['ph']!r}")
    for (pid, tid), spans in slices.items():
        if isinstance(pid, int):
            assert pid in named_processes and (pid, tid) in named_threads, (pid, tid)
        # slices on one thread nest (a slice may not end inside a sibling)
        stack = []
        for start, end in sorted(spans, key=lambda s: (s[0], -s[1])):
            while stack and start >= stack[-1]:
                stack.pop()
            assert not stack or end <= stack[-1], (pid, tid, start, end)
            stack.append(end)
    for key, pair in flows.items():
        assert sorted(e["ph"] for e in pair) == ["f", "s"], key
        start, finish = sorted(pair, key=lambda e: e["ph"], reverse=True)
        assert finish.get("bp") == "e" and finish["ts"] >= start["ts"], key
        # each end binds to a slice that encloses it on its own thread
        for end in pair:
            t = round(end["ts"] * 1000)
            assert any(s <= t <= f for s, f in slices[(end["pid"], end["tid"])]), end


def test_trace_is_loadable_by_chrome_and_perfetto_rules(session, tmp_path):
    _, doc = write_and_load(session, tmp_path / "t.json")
    assert_viewer_loadable(doc)


def test_structural_checker_catches_broken_traces(session, tmp_path):
    _, doc = write_and_load(session, tmp_path / "t.json")
    broken = json.loads(json.dumps(doc))
    broken["traceEvents"] = [e for e in broken["traceEvents"] if e["ph"] != "f"]
    with pytest.raises(AssertionError):
        assert_viewer_loadable(broken)
    broken = json.loads(json.dumps(doc))
    next(e for e in broken["traceEvents"] if e["ph"] == "X")["dur"] = -1
    with pytest.raises(AssertionError):
        assert_viewer_loadable(broken)


def test_holistic_trace_analysis_parses_the_trace(session, tmp_path):
    hta = pytest.importorskip("hta.trace_analysis",
                             reason="HolisticTraceAnalysis (and its psutil dependency) "
                                    "not importable")
    folder = tmp_path / "traces"
    folder.mkdir()
    session.metadata["distributedInfo"] = '{"backend": "gloo", "rank": 3, "world_size": 4}'
    write_chrome_trace(session, folder / "rank3.json")
    analysis = hta.TraceAnalysis(trace_dir=str(folder))
    assert analysis.t.get_ranks() == [3]
    df = analysis.t.get_trace(3)
    symbols = analysis.t.symbol_table.get_sym_table()
    names = collections.Counter(symbols[i] for i in df["name"])
    cats = collections.Counter(symbols[i] for i in df["cat"])
    expected = collections.Counter(op.name for op in training_step_ops())
    assert names == expected
    assert cats == {"cpu_op": 11, "user_annotation": 3}
    addmm = df[df["name"] == symbols.index("aten::addmm")].iloc[0]
    assert addmm["input_dims"] == [[128], [32, 64], [64, 128], [], []]
