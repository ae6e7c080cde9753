"""Traces written by opscope open in a real viewer: Catapult's trace viewer (chrome://tracing).

Each test profiles a real train step (forward, backward, SGD step, a range on a second
thread), writes the trace with ``export_chrome_trace`` and imports the file, as written,
into Catapult's trace viewer running in headless Chromium (see ``viewer_driver``). The
viewer's model is then checked against what the JSON encodes: the slices per thread in
order with their nesting depth, thread and process names, the fwdbwd flow arrows and the
slices they join, the global instant events, and no import warning, exception or console
error. Durations are never compared.

Chromium 156 has no chrome://tracing of its own any more (the page fails with
ERR_FAILED and the viewer code is not in its resources), so the viewer comes from
``torch-tb-profiler`` (``trace_viewer_full.html``) plus the ``webcomponents.js`` 0.7
polyfill from npm. The tests skip, naming what to install, when any part is missing.

Perfetto is not tested: its trace processor is not available offline (the ``perfetto``
PyPI package downloads ``trace_processor`` at run time and Chromium embeds neither the
Perfetto UI nor the trace processor).
"""

from __future__ import annotations

import collections
import gzip
import json
import threading

import pytest
import torch

import opscope
from viewer_driver import (
    TraceViewer, compare_with_trace, expected_from_trace, missing_viewer_parts,
)
from workloads import mlp_step_fn

ODD_NAME = 'say "hi"\\there\nnext\tline \x01 ünï 😀 </script>'
WORKER_RANGE = "worker range"


@pytest.fixture(scope="module")
def viewer():
    missing = missing_viewer_parts()
    if missing:
        pytest.skip("trace viewer not installed: " + "; ".join(missing))
    with TraceViewer() as v:
        yield v


def profile_train_step(range_name=None):
    """Profile two real MLP train steps, each in a range, plus a range on a worker thread."""
    step = mlp_step_fn()
    step()  # warm up outside the profiler

    def worker():
        with opscope.record_function(WORKER_RANGE):
            torch.ones(8).mul(2).sum()

    with opscope.profile(record_shapes=True) as prof:
        for _ in range(2):
            with opscope.record_function(range_name or "train_step"):
                step()
        t = threading.Thread(target=worker)
        t.start()
        t.join()
    return prof


def load_doc(path):
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        return json.load(f)


def x_counts(doc):
    """(pid, tid) -> number of X events, counted straight from the file."""
    return dict(collections.Counter((e["pid"], e["tid"]) for e in doc["traceEvents"]
                                    if e["ph"] == "X"))


@pytest.fixture
def trace(tmp_path, collector_name):
    path = tmp_path / "train.pt.trace.json"
    profile_train_step().export_chrome_trace(str(path))
    return path


def assert_viewer_shows(result, doc):
    problems = compare_with_trace(doc, result)
    assert problems == [], "\n".join(problems)


def trace_thread_names(doc) -> set:
    """The names the trace gives its threads (``thread_name`` metadata events)."""
    return {e["args"]["name"] for e in doc["traceEvents"] if e.get("name") == "thread_name"}


def test_trace_loads_in_catapult_viewer(viewer, trace, collector_name):
    doc = load_doc(trace)
    result = viewer.load(trace)
    assert result.ok, result.problems()

    # one slice per X event, on the thread the event names, and nothing else
    assert result.slice_counts() == x_counts(doc)
    threads = {key: t for key, t in result.threads().items() if isinstance(key[1], int)}
    assert len(threads) == 2  # the main thread and the worker
    worker = [t for t in threads.values() if WORKER_RANGE in t["slices"]]
    assert len(worker) == 1 and worker[0]["slices"][0] == WORKER_RANGE
    # the viewer shows the trace's names: Python's for the main thread (the worker starts and
    # ends inside the window, so it keeps its "thread N (python)" label)
    assert "MainThread" in trace_thread_names(doc)
    assert {t["name"] for t in threads.values()} == trace_thread_names(doc)
    # the timeline view drew a track for each thread, under its name
    assert {t["name"] for t in threads.values()} <= set(result.track_headings)
    cpu = [p for p in result.processes if p["labels"] == ["CPU"]]
    assert len(cpu) == 1 and cpu[0]["name"] == "python"

    # every s/f pair became one arrow from a forward op to its backward op (the Python
    # collector records no forward seq_nr, so it writes no fwdbwd flows at all)
    starts = [e for e in doc["traceEvents"] if e["ph"] == "s"]
    assert len(starts) == len([e for e in doc["traceEvents"] if e["ph"] == "f"])
    assert (len(starts) > 0) == (collector_name == "native")
    assert len(result.flows) == len(starts)
    assert {f["id"] for f in result.flows} == {e["id"] for e in starts}
    for flow in result.flows:
        assert flow["category"] == "fwdbwd"
        assert "Backward" in flow["end"] and "Backward" not in flow["start"], flow

    assert sorted(result.global_instant_events) == [
        "Iteration Start: PyTorch Profiler", "Record Window End"]
    # and everything else: order, nesting depth, names, which slices each flow joins
    assert_viewer_shows(result, doc)


def test_odd_range_name_round_trips_through_the_viewer(viewer, tmp_path, collector_name):
    path = tmp_path / 'odd "name"\n😀.json'
    profile_train_step(ODD_NAME).export_chrome_trace(str(path))
    doc = load_doc(path)
    result = viewer.load(path)
    assert result.ok, result.problems()
    titles = [t for titles in result.slice_titles_by_thread().values() for t in titles]
    assert titles.count(ODD_NAME) == 2
    assert result.slice_counts() == x_counts(doc)
    assert_viewer_shows(result, doc)


def test_gzip_trace_loads(viewer, tmp_path):
    path = tmp_path / "train.pt.trace.json.gz"
    profile_train_step().export_chrome_trace(str(path))
    result = viewer.load(path)
    assert result.ok, result.problems()
    doc = load_doc(path)
    assert result.slice_counts() == x_counts(doc)
    assert_viewer_shows(result, doc)


def test_expectation_on_a_hand_made_trace(viewer, tmp_path):
    """The expectation code itself: on a hand-made trace with known nesting and flows."""
    doc = {"displayTimeUnit": "ms", "traceEvents": [
        {"ph": "M", "name": "thread_name", "pid": 1, "tid": 2, "args": {"name": "main"}},
        {"ph": "X", "name": "outer", "pid": 1, "tid": 2, "ts": 10.0, "dur": 100.0},
        {"ph": "X", "name": "inner", "pid": 1, "tid": 2, "ts": 20.0, "dur": 10.0},
        {"ph": "X", "name": "later", "pid": 1, "tid": 2, "ts": 200.0, "dur": 5.0},
        {"ph": "s", "id": 7, "pid": 1, "tid": 2, "ts": 20.0, "cat": "fwdbwd", "name": "fwdbwd"},
        {"ph": "f", "id": 7, "pid": 1, "tid": 2, "ts": 200.0, "cat": "fwdbwd",
         "name": "fwdbwd", "bp": "e"},
    ]}
    want = expected_from_trace(doc)
    assert want.slices == {(1, 2): [("outer", 0), ("inner", 1), ("later", 0)]}
    assert want.flows == {7: ("inner", "later")}
    path = tmp_path / "hand.json"
    path.write_text(json.dumps(doc))
    assert_viewer_shows(viewer.load(path), doc)


# --------------------------------------------------------------------------- broken traces
# Each breaks a real trace the way an exporter bug could; the viewer must reject it or
# show something other than what the original trace meant, and the check must say so.

def _first(doc, pred):
    return next(e for e in doc["traceEvents"] if pred(e))


def _op(name):
    return lambda e: e["ph"] == "X" and e["name"] == name


def _set(pred, key, value):
    def mutate(doc):
        _first(doc, pred)[key] = value
    return mutate


def _drop(pred):
    def mutate(doc):
        doc["traceEvents"].remove(_first(doc, pred))
    return mutate


def _stretch_first_linear(doc):
    op = _first(doc, _op("aten::linear"))
    op["dur"] = op["dur"] * 1000  # now overlaps the ops after it instead of holding its own


def _pop_phase(doc):
    _first(doc, _op("aten::linear")).pop("ph")


TEXT_BREAKS = {  # on the file's text
    "truncated": (lambda text: text[: len(text) // 2], "import error"),
    "trailing garbage": (lambda text: text + "}", "import error"),
    "NaN timestamp": (lambda text: text.replace('"ts": ', '"ts": NaN, "x": ', 1),
                      "import error"),
    "traceEvents key misspelt": (lambda text: text.replace('"traceEvents"', '"trace_events"'),
                                 "threads: viewer has []"),
}
DOC_BREAKS = {  # on the parsed document, written back as JSON
    "unknown phase": (_set(_op("aten::linear"), "ph", "Q"), "parse_error"),
    "missing phase": (_pop_phase, "parse_error"),
    "op moved to another thread": (_set(_op("aten::linear"), "tid", 999999), "threads:"),
    "misnested op": (_stretch_first_linear, "first difference"),
    "thread_name lost": (_drop(lambda e: e["name"] == "thread_name"), "names it None"),
    "flow end lost": (_drop(lambda e: e["ph"] == "f"), "flows:"),
    "flow end off any slice": (_set(lambda e: e["ph"] == "f", "ts", 1e12),
                               "flow_slice_end_error"),
    "flow start off any slice": (_set(lambda e: e["ph"] == "s", "ts", 0.0),
                                 "flow_slice_start_error"),
    "flow end id changed": (_set(lambda e: e["ph"] == "f", "id", 10**6), "flows:"),
}


@pytest.fixture(scope="module")
def good_trace(tmp_path_factory):
    """A real trace with fwdbwd flows (native collector), written once for the module."""
    mp = pytest.MonkeyPatch()
    mp.setenv("OPSCOPE_COLLECTOR", "native")
    try:
        path = tmp_path_factory.mktemp("viewer") / "good.pt.trace.json"
        profile_train_step().export_chrome_trace(str(path))
    finally:
        mp.undo()
    doc = load_doc(path)
    assert any(e["ph"] == "f" for e in doc["traceEvents"])
    return path


def test_good_trace_passes_before_breaking_it(viewer, good_trace):
    assert_viewer_shows(viewer.load(good_trace), load_doc(good_trace))


@pytest.mark.parametrize("name", sorted(TEXT_BREAKS))
def test_broken_trace_text_is_caught(viewer, good_trace, tmp_path, name):
    breaker, expected_problem = TEXT_BREAKS[name]
    text = good_trace.read_text(encoding="utf-8")
    broken = tmp_path / "broken.json"
    broken.write_text(breaker(text), encoding="utf-8")
    problems = compare_with_trace(load_doc(good_trace), viewer.load(broken))
    assert any(expected_problem in p for p in problems), problems


@pytest.mark.parametrize("name", sorted(DOC_BREAKS))
def test_broken_trace_document_is_caught(viewer, good_trace, tmp_path, name):
    breaker, expected_problem = DOC_BREAKS[name]
    meant = load_doc(good_trace)
    doc = load_doc(good_trace)
    breaker(doc)
    broken = tmp_path / "broken.json"
    broken.write_text(json.dumps(doc), encoding="utf-8")
    problems = compare_with_trace(meant, viewer.load(broken))
    assert any(expected_problem in p for p in problems), problems
