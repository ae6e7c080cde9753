"""Timeline lanes say a thread's id once (issue 27, item 22).

torch's traces (and ours, for a thread Python never named) label a thread
``thread <tid> (python)``; the lane showed ``thread 15107 (python) (thread 15107)``.
"""

from __future__ import annotations

import json

from opscope.analysis.build import load_session
from opscope.report.timeline import timeline_lanes


def test_a_generic_thread_label_is_not_a_name(tmp_path):
    events = [{"ph": "M", "name": "thread_name", "pid": 1, "tid": 5,
               "args": {"name": "thread 5 (python)"}},
              {"ph": "M", "name": "thread_name", "pid": 1, "tid": 6, "args": {"name": "loader"}},
              {"ph": "X", "cat": "cpu_op", "name": "aten::add", "pid": 1, "tid": 5, "ts": 0,
               "dur": 5, "args": {}},
              {"ph": "X", "cat": "cpu_op", "name": "aten::mul", "pid": 1, "tid": 6, "ts": 1,
               "dur": 5, "args": {}}]
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"traceEvents": events}))
    lanes = timeline_lanes(load_session(path))["lanes"]
    assert {lane["tid"]: lane["thread"] for lane in lanes} == {5: "", 6: "loader"}
