"""Python threads keep their names in the trace (``MainThread``, ``loader``), not only ids."""

from __future__ import annotations

import json
import threading

import pytest
import torch

import opscope
from opscope.analysis.build import load_session


@pytest.mark.parametrize("collector", ["native", "python"])
def test_trace_names_python_threads(tmp_path, monkeypatch, collector):
    monkeypatch.setenv("OPSCOPE_COLLECTOR", collector)
    go, done = threading.Event(), threading.Event()

    def worker():
        go.wait(30)
        torch.ones(3) + 1
        done.set()

    thread = threading.Thread(target=worker, name="loader")
    thread.start()  # alive for the whole window
    with opscope.profile() as prof:
        torch.ones(3) * 2
        go.set()
        done.wait(30)
    thread.join(30)
    path = tmp_path / "t.json"
    prof.export_chrome_trace(str(path))
    events = json.loads(path.read_text())["traceEvents"]
    names = {e["tid"]: e["args"]["name"] for e in events if e.get("name") == "thread_name"}
    assert names[threading.get_native_id()] == "MainThread"
    if collector == "native":  # the Python collector's dispatch mode sees one thread only
        assert names[thread.native_id] == "loader"
    assert load_session(str(path)).thread_names == names  # and back


def test_a_thread_python_does_not_know_keeps_the_id_label(tmp_path):
    """Threads torch starts in C++ (autograd's, gloo's) have no Python name: "thread N (python)"."""
    from opscope.analysis.build import build_session
    from opscope.export.chrome_trace import write_chrome_trace
    from opscope.model.records import RawSession, records_from_rows

    row = (10, 20, -1, 0, 0, 0, 1, 0xFFFFFFFF, 0, 0, 0)
    raw = RawSession(records_from_rows([row, row[:4] + (1,) + row[5:]]), [], [111, 222],
                     ["aten::add"], 0, 30, 0, thread_names={111: "MainThread"})
    path = write_chrome_trace(build_session(raw), str(tmp_path / "t.json"))
    events = json.loads(open(path).read())["traceEvents"]
    names = {e["tid"]: e["args"]["name"] for e in events if e.get("name") == "thread_name"}
    assert names == {111: "MainThread", 222: "thread 222 (python)"}


def test_report_timeline_lanes_carry_the_thread_name():
    from opscope.report.timeline import timeline_lanes

    with opscope.profile() as prof:
        torch.ones(3) + 1
    lanes = timeline_lanes(prof.session)["lanes"]
    main = [lane for lane in lanes if lane["tid"] == threading.get_native_id()]
    assert main and main[0]["thread"] == "MainThread"
