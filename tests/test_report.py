"""The HTML report's data and file, without a browser (tests/test_report_browser.py opens it).

Synthetic sessions with fixed times check what each view is given (step breakdown,
operator rows, flame tree, decimated timeline, recommendations and the numbers they
cite); a real training profile checks the rows against ``prof.key_averages()``; a
synthetic million-event session checks the size bound; the entry points
(``prof.export_report``, ``opscope.report_handler``, ``opscope report``, ``opscope
demo``) and their errors are run as users run them.
"""

from __future__ import annotations

import gzip
import json
import os
import re

import numpy as np
import pytest

import opscope
from opscope.analysis.collapsed import collapsed_stacks
from opscope.report import write_report
from opscope.analysis.categories import CATEGORY_NAMES, op_kind
from opscope.report.data import report_data
from opscope.report.timeline import timeline_lanes
from report_sessions import large_report, training_profile
from synthetic import SCOPE_BACKWARD_FUNCTION, SCOPE_USER, Op, TensorSpec, make_session

DATA_BLOCK = re.compile(r'<script id="opscope-data" type="application/json">(.*?)</script>', re.S)
MAX_REPORT_BYTES = 20 * 1024 * 1024


def page_data(path) -> dict:
    """The JSON the page embeds, read back from the written file."""
    text = open(path, encoding="utf-8").read()
    found = DATA_BLOCK.search(text)
    assert found, "no data block in the report"
    return json.loads(found.group(1))


def two_steps():
    """Two steps with every category: ops, optimizer, backward, data loading, a user range."""
    ops = []
    for k, t in enumerate((0, 1000)):
        ops += [
            Op(f"ProfilerStep#{k + 1}", t, t + 1000, scope=SCOPE_USER),
            Op("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", t + 10, t + 110,
               scope=SCOPE_USER),
            Op("aten::copy_", t + 20, t + 60),
            Op("forward", t + 120, t + 520, scope=SCOPE_USER),
            Op("aten::linear", t + 130, t + 430, inputs=[TensorSpec((8, 4)), TensorSpec((2, 4))]),
            Op("aten::t", t + 140, t + 150),
            Op("aten::addmm", t + 160, t + 420),
            Op("aten::relu", t + 440, t + 500),
            Op("autograd::engine::evaluate_function: AddmmBackward0", t + 530, t + 730),
            Op("AddmmBackward0", t + 540, t + 720, scope=SCOPE_BACKWARD_FUNCTION),
            Op("aten::mm", t + 550, t + 700),
            Op("Optimizer.step#SGD.step", t + 740, t + 940, scope=SCOPE_USER),
            Op("aten::add_", t + 750, t + 900),
        ]
    return make_session(ops, options={"record_shapes": True})


def parts_of(overview, step):
    return {c: v for c, v in zip(overview["categories"], step["parts"]) if v}


# -- what each view gets ------------------------------------------------------------

def test_step_breakdown_adds_up_to_each_step():
    data = report_data(two_steps())
    ov = data["overview"]
    assert [s["name"] for s in ov["steps"]] == ["ProfilerStep#1", "ProfilerStep#2"]
    assert ov["has_steps"] and ov["spread"]["count"] == 2
    for step in ov["steps"]:
        assert step["dur_us"] == 1000.0
        assert parts_of(ov, step) == {
            "data loading": 100.0, "matmul/conv": 300.0, "elementwise": 60.0,
            "backward": 200.0, "optimizer": 200.0, "Python/other": 40.0, "idle": 100.0}
        assert sum(step["parts"]) == pytest.approx(step["dur_us"])
    assert [r["name"] for r in ov["top_ops"]][:3] == ["aten::addmm", "aten::mm", "aten::add_"]


def test_without_steps_the_session_is_one_step_with_idle_gaps():
    s = make_session([Op("aten::mm", 0, 30), Op("aten::add", 50, 60)], start_us=0, stop_us=100)
    ov = report_data(s)["overview"]
    assert not ov["has_steps"] and len(ov["steps"]) == 1
    assert parts_of(ov, ov["steps"][0]) == {"matmul/conv": 30.0, "elementwise": 10.0, "idle": 60.0}


def test_op_kinds():
    assert op_kind("aten::addmm") == "matmul/conv"
    assert op_kind("aten::convolution") == "matmul/conv"
    assert op_kind("aten::_to_copy") == "copy/cast"
    assert op_kind("aten::empty_strided") == "allocation"
    assert op_kind("aten::transpose") == "view/reshape"
    assert op_kind("aten::native_layer_norm") == "norm/reduce"
    assert op_kind("aten::mul_") == "elementwise"
    assert op_kind("aten::index_select") == "other ops"
    assert set(CATEGORY_NAMES) >= {"backward", "optimizer", "data loading", "idle"}


def test_operator_rows_are_key_averages_with_details():
    session = two_steps()
    ops = report_data(session)["operators"]
    from opscope.analysis.aggregate import key_averages

    expected = key_averages(session.table)
    assert [(r["name"], r["calls"]) for r in ops["rows"]] == [(e.key, e.count) for e in expected]
    assert [r["self_us"] for r in ops["rows"]] == [round(e.self_cpu_time_total, 3)
                                                   for e in expected]
    by_name = {r["name"]: r for r in ops["rows"]}
    assert by_name["ProfilerStep*"]["user"] and not by_name["aten::mm"]["user"]
    assert ops["has_shapes"] and not ops["has_stacks"]
    assert by_name["aten::linear"]["shapes"] == [["[[8, 4], [2, 4]]", 2, 60.0]]
    assert by_name["aten::mm"]["callers"] == [["AddmmBackward0", 2, 300.0]]
    assert by_name["aten::t"]["callers"] == [["aten::linear", 2, 20.0]]


def test_call_sites_come_from_stacks():
    s = make_session([Op("step", 0, 100, scope=SCOPE_USER, stack=["train.py(3): main"]),
                      Op("aten::mm", 10, 30, stack=["model.py(9): forward", "train.py(4): main"]),
                      Op("aten::mm", 40, 50, stack=["model.py(9): forward", "train.py(4): main"]),
                      Op("aten::mm", 60, 65, stack=["model.py(12): head", "train.py(4): main"])])
    rows = {r["name"]: r for r in report_data(s)["operators"]["rows"]}
    assert rows["aten::mm"]["stacks"] == [
        [["model.py(9): forward", "train.py(4): main"], 2, 30.0, None],
        [["model.py(12): head", "train.py(4): main"], 1, 5.0, None]]


def test_flame_tree_is_export_stacks_data():
    session = two_steps()
    flame = report_data(session)["flame"]
    names, root = flame["names"], flame["tree"]
    assert names[root[0]] == "all"
    assert root[1] == pytest.approx(sum(collapsed_stacks(session).values()) / 1000)
    # the two steps merge into one frame, whose children keep their original names
    assert [names[c[0]] for c in root[2]] == ["ProfilerStep*"]
    step = root[2][0]
    assert step[1] == 2000.0
    children = {names[c[0]]: c[1] for c in step[2]}
    assert children["autograd::engine::evaluate_function: AddmmBackward0"] == 400.0
    assert children["forward"] == 800.0


def test_timeline_keeps_the_longest_events_with_their_ancestors():
    ops = [Op("ProfilerStep#1", 0, 10_000, scope=SCOPE_USER)]
    for k in range(100):  # 100 ranges of 50 us, each with a 1 us and a 2 us op
        t = 10 + k * 90
        ops += [Op("range", t, t + 50, scope=SCOPE_USER),
                Op("aten::tiny", t + 5, t + 6), Op("aten::small", t + 10, t + 12)]
    session = make_session(ops)
    full = timeline_lanes(session)
    assert full["shown"] == full["total"] == 301 and full["min_dur_ns"] == 0
    capped = timeline_lanes(session, cap=250)
    lane = capped["lanes"][0]
    names = [capped["names"][k] for k in lane["name"]]
    assert capped["shown"] == len(names) == 201  # step + ranges + 2 us ops; all 1 us ops go
    assert "aten::tiny" not in names and names.count("aten::small") == 100
    assert capped["min_dur_ns"] == 2000
    assert np.cumsum(lane["start"])[:2].tolist() == [1000, 11000]  # delta-coded, since start
    assert set(lane["depth"]) == {0, 1, 2}


def test_recommendations_cite_their_numbers():
    recs = {r["id"]: r for r in report_data(two_steps())["recommendations"]}
    # data loading: 100 of 1000 us a step (10% > 5%); optimizer: 200 of 1000 us (20%)
    assert "10.0% of step time" in recs["data-loading"]["evidence"][0]
    assert "20.0% of step time" in recs["optimizer"]["evidence"][0]
    assert "foreach=True" in recs["optimizer"]["advice"]
    assert "host-bound" not in recs and "small-copies" not in recs and "shapes" not in recs


def test_host_bound_small_copies_and_missing_shapes_rules():
    ops = [Op("ProfilerStep#1", 0, 5000, scope=SCOPE_USER), Op("aten::mm", 1, 401)]
    t = 500.0
    for _ in range(60):  # 60 copies of 5 us and 60 adds of 3 us: short ops dominate
        ops += [Op("aten::copy_", t, t + 5), Op("aten::add", t + 10, t + 13)]
        t += 40
    recs = {r["id"]: r for r in report_data(make_session(ops))["recommendations"]}
    host = recs["host-bound"]["evidence"]
    assert "120 of 121 top-level ops (99.2%) ran shorter than 10 us" in host[0]
    assert recs["small-copies"]["evidence"][0] == "60 calls (aten::copy_ x60), 60 per step"
    assert "average 5.0 us per call" in recs["small-copies"]["evidence"][1]
    assert recs["shapes"]["evidence"][0].startswith("aten::mm: ")
    assert "record_shapes=True" in recs["shapes"]["advice"]


def test_modules_and_memory_say_not_recorded_without_data():
    data = report_data(two_steps())
    assert data["modules"] is None and data["memory"] is None


# -- the file -------------------------------------------------------------------------

def test_report_is_one_self_contained_file(tmp_path):
    odd = 'say "hi" </script><!-- <b>x</b> \u2028 ünï'
    session = make_session([Op("ProfilerStep#1", 0, 100, scope=SCOPE_USER), Op(odd, 10, 20)])
    path = tmp_path / "r.html"
    write_report(session, path)
    text = path.read_text(encoding="utf-8")
    assert text.startswith("<!DOCTYPE html>")
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", text)
    assert "<link" not in text and "@import" not in text and "<script src" not in text
    assert text.count("<script") == text.count("</script>") == 2
    data = page_data(path)
    assert odd in [r["name"] for r in data["operators"]["rows"]]
    assert os.listdir(tmp_path) == ["r.html"]


def test_write_report_into_a_missing_folder_fails_and_leaves_nothing(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        write_report(two_steps(), tmp_path / "no" / "r.html")
    assert os.listdir(tmp_path) == []


def test_million_event_report_stays_under_20_mb():
    path, session = large_report()
    assert len(session.table) >= 999_000
    assert os.path.getsize(path) < MAX_REPORT_BYTES
    data = page_data(path)
    tl = data["timeline"]
    assert tl["total"] == len(session.table) and tl["shown"] <= tl["cap"] < tl["total"]
    assert sum(len(lane["start"]) for lane in tl["lanes"]) == tl["shown"]
    steps = sum(name.startswith("ProfilerStep#") for name in session.table.symbols.names)
    assert data["overview"]["spread"]["count"] == steps > len(data["overview"]["steps"])
    assert len(data["overview"]["steps"]) == data["overview"]["steps_shown"]
    assert sum(r["calls"] for r in data["operators"]["rows"]) == len(session.table)


# -- a real profile and the entry points ---------------------------------------------

def test_real_profile_rows_equal_key_averages(tmp_path, collector_name):
    prof = training_profile(steps=3, record_shapes=True)
    path = tmp_path / "r.html"
    prof.export_report(str(path))
    data = page_data(path)
    expected = prof.key_averages()
    assert [(r["name"], r["calls"]) for r in data["operators"]["rows"]] == \
        [(e.key, e.count) for e in expected]
    steps = [s["name"] for s in data["overview"]["steps"]]
    assert steps == ["ProfilerStep#1", "ProfilerStep#2"]
    names = {r["name"] for r in data["operators"]["rows"]}
    assert {"aten::addmm", "Optimizer.step#SGD.step", "train_step"} <= names
    assert data["operators"]["has_shapes"]
    parts = dict(zip(data["overview"]["categories"], data["overview"]["totals"]))
    assert parts["backward"] > 0 and parts["optimizer"] > 0 and parts["matmul/conv"] > 0


def test_report_handler_writes_one_report_per_window(tmp_path):
    from workloads import mlp_step_fn

    step = mlp_step_fn()
    folder = tmp_path / "reports"
    with opscope.profile(schedule=opscope.schedule(wait=0, warmup=1, active=1, repeat=2),
                         on_trace_ready=opscope.report_handler(str(folder), "w0")) as prof:
        for _ in range(4):
            step()
            prof.step()
    files = sorted(os.listdir(folder))
    assert len(files) == 2 and all(re.fullmatch(r"w0\.\d+\.report\.html", f) for f in files)
    steps = [page_data(folder / f)["overview"]["steps"][0]["name"] for f in files]
    assert sorted(steps) == ["ProfilerStep#1", "ProfilerStep#3"]


def cli(capsys, *args):
    from opscope.cli.main import main

    with pytest.raises(SystemExit) as exit_info:
        main(list(args))
    out, err = capsys.readouterr()
    return exit_info.value.code, out, err


def test_cli_report_of_a_trace_and_of_a_folder(tmp_path, capsys):
    prof = training_profile(steps=3)
    folder = tmp_path / "traces"
    folder.mkdir()
    trace = folder / "w.1.pt.trace.json.gz"
    prof.export_chrome_trace(str(trace))
    code, _, err = cli(capsys, "report", str(trace))
    assert code == 0, err
    assert (folder / "w.1.html").is_file() and f"wrote report {folder / 'w.1.html'}" in err
    code, _, err = cli(capsys, "report", str(folder), "-o", str(tmp_path / "x.html"),
                       "--title", "my run")
    assert code == 0, err
    data = page_data(tmp_path / "x.html")
    assert data["meta"]["title"] == "my run"
    assert [(r["name"], r["calls"]) for r in data["operators"]["rows"]] == \
        [(e.key, e.count) for e in prof.key_averages()]


@pytest.mark.parametrize("case", ["missing", "not json", "no traceEvents", "truncated gz",
                                  "output folder missing"])
def test_cli_report_errors_are_one_line(tmp_path, capsys, case):
    trace = tmp_path / "t.json"
    out = []
    if case == "not json":
        trace.write_text("hello")
    elif case == "no traceEvents":
        trace.write_text('{"schemaVersion": 1}')
    elif case == "truncated gz":
        trace = tmp_path / "t.json.gz"
        whole = gzip.compress(json.dumps({"traceEvents": [{"ph": "X", "name": f"op{i}"}
                                                          for i in range(500)]}).encode())
        trace.write_bytes(whole[: len(whole) // 2])
    elif case == "output folder missing":
        trace.write_text('{"traceEvents": []}')
        out = ["-o", str(tmp_path / "nope" / "r.html")]
    code, stdout, err = cli(capsys, "report", str(trace), *out)
    assert code == 2
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("opscope: error: "), err
    assert "Traceback" not in err
    named = str(tmp_path / "nope") if out else str(trace)
    assert named in lines[0]
    assert not list(tmp_path.glob("*.html"))


def test_demo_writes_the_report_too(tmp_path, capsys):
    code, stdout, err = cli(capsys, "demo", "-o", str(tmp_path), "--steps", "3")
    assert code == 0, err
    assert sorted(os.listdir(tmp_path)) == ["demo.html", "demo.pt.trace.json"]
    assert f"wrote report {tmp_path / 'demo.html'}" in err
    data = page_data(tmp_path / "demo.html")
    assert [s["name"] for s in data["overview"]["steps"]] == ["ProfilerStep#2"]


def test_callers_of_equal_time_come_in_name_order_whatever_the_names_numbering():
    # a trace file and a store number the same names differently: the page must not differ
    ops = [Op("b_caller", 0, 10), Op("a_caller", 20, 30), Op("aten::x", 1, 2),
           Op("aten::x", 21, 22)]
    numbered = [make_session(ops), make_session([ops[1], ops[0], *ops[2:]])]
    callers = []
    for session in numbered:
        rows = {r["name"]: r for r in report_data(session)["operators"]["rows"]}
        callers.append([c[0] for c in rows["aten::x"]["callers"]])
    assert callers == [["a_caller", "b_caller"]] * 2, callers
