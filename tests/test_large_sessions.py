"""Long sessions (issue 32): what bounds the memory of stop and the writers changes no output."""

from __future__ import annotations

import glob
import os
import re

import pytest

import opscope
from opscope.analysis.build import build_session
from opscope.export import chrome_trace
from opscope.model.records import RawSession, records_from_rows


def _session(n=40, threads=2):
    """A session of ``n`` nested ops on ``threads`` threads, with sequence numbers."""
    rows = []
    for i in range(n):
        t = i % threads
        start = 1_000 * (i // threads)
        rows.append((start, start + 900, i if i % 3 else -1, 0, t, 0, 0, 0xFFFFFFFF, 0, 0, 0))
        rows.append((start + 100, start + 300, -1, 1, t, 0, 0, 0xFFFFFFFF, 0, 0, 0))
    raw = RawSession(records_from_rows(rows), [], [11, 12][:threads], ["aten::linear", "aten::mm"],
                     0, 1_000 * n, 0)
    return build_session(raw)


def test_chrome_trace_is_the_same_in_any_batches(tmp_path, monkeypatch):
    session = _session()
    whole = tmp_path / "whole.json"
    chrome_trace.write_chrome_trace(session, str(whole))
    monkeypatch.setattr(chrome_trace, "OPS_BATCH", 7)
    batched = tmp_path / "batched.json"
    chrome_trace.write_chrome_trace(session, str(batched))
    text = _normalised(whole)
    assert text.count('"ph": "X"') == 80 + 1
    assert _normalised(batched) == text


def _normalised(path):
    """The file's text without its path and its random trace id."""
    return re.sub(r'"trace_id": "[0-9A-F]*"', "", path.read_text().replace(str(path), "PATH"))


def test_session_keeps_no_raw_records_after_stop():
    # the table holds the records as columns: the 48-byte records are dropped
    with opscope.profile() as prof:
        for _ in range(5):
            opscope.record_function("step").__enter__().__exit__(None, None, None)
    table = prof._session.table
    assert len(table) >= 5 and len(table.raw.records) == 0 and table.raw.stack_ids is None


def test_store_events_are_the_same_in_any_batches(tmp_path, monkeypatch):
    pq = pytest.importorskip("pyarrow.parquet")
    from opscope.store import tables
    from opscope.store.write import StoreWriter

    session = _session()

    def events(store):
        with StoreWriter(str(store)) as writer:
            writer.write_window(session)
        files = sorted(glob.glob(str(store / "**" / "*.parquet"), recursive=True))
        read = [pq.read_table(f) for f in files if "events" in os.path.relpath(f, store)]
        return [r.to_pylist() for r in read], sum(r.num_rows for r in read)

    whole, rows = events(tmp_path / "whole.opscope")
    monkeypatch.setattr(tables, "EVENTS_BATCH", 7)
    batched, _ = events(tmp_path / "batched.opscope")
    assert rows == 80 and batched == whole
