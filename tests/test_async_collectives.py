"""A collective's backend range is async, in the live table and in a loaded trace alike
(issue 27, item 16).

c10d's Work marks its ``gloo:all_reduce`` range async (another thread may end it), so
torch's table gives it no CPU total %. A trace does not say so; the loader marks those
ranges async itself, so that ``opscope table TRACE`` prints what the live table printed.
One in-process gloo group of one rank records a real all_reduce.
"""

from __future__ import annotations

import json

import pytest

from opscope.analysis.build import load_session
from opscope.cli.table import session_table

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")


def gloo_row(table: str) -> list:
    (line,) = [ln for ln in table.splitlines() if ln.strip().startswith("gloo:all_reduce")]
    return line.split()


@pytest.fixture()
def one_rank_group():
    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("no gloo")
    dist.init_process_group("gloo", rank=0, world_size=1, store=dist.HashStore())
    try:
        yield
    finally:
        dist.destroy_process_group()


def test_live_and_loaded_tables_agree_on_an_async_collective(one_rank_group, tmp_path):
    import opscope

    x = torch.ones(1024)
    with opscope.profile() as prof:
        for _ in range(3):
            dist.all_reduce(x)
            torch.mm(torch.ones(32, 32), torch.ones(32, 32))
    live = gloo_row(prof.key_averages().table(row_limit=-1))
    path = tmp_path / "t.pt.trace.json"
    prof.export_chrome_trace(str(path))
    loaded = gloo_row(session_table(load_session(path), row_limit=-1))
    assert live[3] == loaded[3] == "0"  # CPU total %: torch's async rule
    assert live[-1] == loaded[-1] == "3"


def test_a_torch_trace_marks_collective_ranges_async(tmp_path):
    events = [{"ph": "X", "cat": "cpu_op", "name": "c10d::allreduce_", "pid": 1, "tid": 1,
               "ts": 0, "dur": 5, "args": {}},
              {"ph": "X", "cat": "user_annotation", "name": "gloo:all_reduce", "pid": 1,
               "tid": 2, "ts": 1, "dur": 50, "args": {}},
              {"ph": "X", "cat": "user_annotation", "name": "my_range", "pid": 1,
               "tid": 1, "ts": 10, "dur": 20, "args": {}}]
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"traceEvents": events}))
    session = load_session(path)
    asyncs = {session.table.name(i): bool(a) for i, a in enumerate(session.table.is_async)}
    assert asyncs == {"c10d::allreduce_": False, "gloo:all_reduce": True, "my_range": False}
    assert gloo_row(session_table(session))[3] == "0"
