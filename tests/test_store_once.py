"""``prof.export_store(dir)`` after ``store_handler(dir)`` stores the window once (issue 27, 25)."""

from __future__ import annotations

import pytest
import torch

import opscope

pytest.importorskip("pyarrow")
pytest.importorskip("duckdb")


def test_export_store_after_store_handler_adds_no_second_window(tmp_path):
    from opscope.store.connect import connect

    store = str(tmp_path / "s")
    with opscope.profile(schedule=opscope.schedule(wait=0, warmup=1, active=1, repeat=2),
                         on_trace_ready=opscope.store_handler(store)) as prof:
        for _ in range(4):
            torch.ones(4) + 1
            prof.step()
    assert prof.export_store(store) == 1  # the last window, already there
    con = connect(store)
    assert con.execute('SELECT count(*) FROM sessions').fetchall() == [(2,)]
    with opscope.profile() as other:
        torch.ones(4) * 2
    assert other.export_store(store) == 2  # a new window is still added
