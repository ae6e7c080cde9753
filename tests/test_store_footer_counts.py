"""A window's files are read only as its sessions row records them, within --memory-limit
(issue 28, finding 11).

The writer records, in each window's ``sessions.extras.parts``, the rows and uncompressed
bytes of the window's files; every reader (``read_window``, ``connect`` and the verbs
``query``, ``table``, ``report``, ``ranks``) compares each file's footer with that record
before reading its rows. A store written before has no record and reads as before.
``--memory-limit`` refuses, before a row is read, windows whose rows need more memory
than it, as their footers declare them.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

pytest.importorskip("pyarrow")
pytest.importorskip("duckdb")

import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402

from opscope.store import StoreError, connect, load_store_session, read_window  # noqa: E402
from opscope.store.parts import RECORDED_TABLES  # noqa: E402

from test_store_trust import run_verb, tiny_store  # noqa: E402

BIG_EVENTS = 150_000
LIMIT = "20MB"  # DuckDB itself runs in it; the big window's rows need more


def part(store, table: str, window: int, rank: int = 0) -> str:
    return os.path.join(store, table, f"rank={rank}", f"window={window}", "part-0.parquet")


def verbs(store, tmp_path, *extra):
    return [["query", store, "SELECT count(*) FROM events", *extra], ["table", store, *extra],
            ["report", store, "-o", tmp_path / "r.html", *extra], ["ranks", store, *extra]]


def extras_of(store, window: int) -> dict:
    return json.loads(pq.read_table(part(store, "sessions", window)).column("extras")[0]
                      .as_py())


def test_the_writer_records_each_files_rows_and_bytes(tmp_path):
    store = tiny_store(tmp_path / "store")
    for window in (0, 1):
        parts = extras_of(store, window)["parts"]
        assert sorted(parts) == sorted(RECORDED_TABLES)
        for table in RECORDED_TABLES:
            meta = pq.read_metadata(part(store, table, window))
            size = sum(meta.row_group(i).total_byte_size for i in range(meta.num_row_groups))
            assert parts[table] == [meta.num_rows, size], table
        assert parts["events"][0] == 3


def replace_events(store, window: int, events) -> str:
    path = part(store, "events", window)
    pq.write_table(events, path)
    return path


def test_a_file_replaced_by_one_of_another_row_count_is_refused(tmp_path, capsys):
    store = tiny_store(tmp_path / "store")
    events = pq.read_table(part(store, "events", 1))
    path = replace_events(store, 1, events.slice(0, 2))  # a valid file: 2 rows, not 3
    words = f"{path!r}: its footer declares 2 rows; the window's sessions row records 3"
    for verb in verbs(store, tmp_path):
        status, _, err = run_verb(capsys, *verb)
        assert status == 2 and err.count("\n") == 1, (verb[0], err)
        assert "rank 0, window 1: malformed events file" in err and words in err, err
    for read in (lambda: connect(store), lambda: read_window(store, 0, 1),
                 lambda: load_store_session(store, 0, 1)):
        with pytest.raises(StoreError, match="sessions row records 3"):
            read()
    assert read_window(store, 0, 0).names  # the other window still reads


def test_a_file_of_the_same_rows_but_far_more_bytes_is_refused(tmp_path, capsys):
    store = tiny_store(tmp_path / "store")
    events = pq.read_table(part(store, "events", 1))
    names = pa.array([c * 1_000_000 for c in "abc"]).dictionary_encode()
    path = replace_events(store, 1, events.set_column(
        events.schema.get_field_index("name"), events.schema.field("name"), names))
    for verb in verbs(store, tmp_path):
        status, _, err = run_verb(capsys, *verb)
        assert status == 2 and err.count("\n") == 1, (verb[0], err)
        assert f"{path!r}: its footer declares 3," in err and "bytes of rows" in err, err
    with pytest.raises(StoreError, match="bytes of rows"):
        read_window(store, 0, 1)


def test_a_recorded_file_that_is_missing_is_refused(tmp_path, capsys):
    store = tiny_store(tmp_path / "store")
    path = part(store, "events", 1)
    os.unlink(path)
    for verb in verbs(store, tmp_path):
        status, _, err = run_verb(capsys, *verb)
        assert status == 2 and err.count("\n") == 1, (verb[0], err)
        assert f"events file {path!r} is missing" in err and "records 3 rows" in err, err


def forget_parts(store, windows=(0, 1)) -> None:
    """Make ``store`` one written before the counts were recorded: no ``extras.parts``."""
    for window in windows:
        path = part(store, "sessions", window)
        table = pq.read_table(path)
        extras = json.loads(table.column("extras")[0].as_py())
        del extras["parts"]
        i = table.schema.get_field_index("extras")
        pq.write_table(table.set_column(i, table.schema.field(i), pa.array([json.dumps(extras)])),
                       path)


def test_a_store_written_before_the_counts_reads_as_before(tmp_path, capsys):
    store = tiny_store(tmp_path / "store")
    forget_parts(store)
    for verb in verbs(store, tmp_path):
        status, _, err = run_verb(capsys, *verb)
        assert status == 0, (verb[0], err)
    assert read_window(store, 0, 1).names == ["ProfilerStep#1", "aten::mm", "aten::add"]
    events = pq.read_table(part(store, "events", 1))
    replace_events(store, 1, events.slice(0, 2))  # nothing to compare it with: the bounds only
    status, out, _ = run_verb(capsys, "query", store, "SELECT count(*) AS n FROM events")
    assert status == 0 and out.split()[-1] == "5"
    assert len(read_window(store, 0, 1).records) == 2


def big_session(events: int):
    """A session of ``events`` flat ops on one thread, in one ProfilerStep, with a 6 MB
    metadata text (its sessions row is big too)."""
    from opscope.analysis.build import build_session
    from opscope.model.records import NO_INPUTS, RECORD_DTYPE, SCOPE_USER, RawSession

    records = np.zeros(events + 1, RECORD_DTYPE)
    records["start_ns"][1:] = np.arange(events) * 10 + 1
    records["end_ns"][1:] = records["start_ns"][1:] + 5
    records["end_ns"][0] = events * 10 + 10
    records["name_id"][1:] = 1 + np.arange(events) % 2
    records["input_offset"] = NO_INPUTS
    records["scope"][0] = SCOPE_USER
    raw = RawSession(records, [], [7], ["ProfilerStep#9", "aten::mm", "aten::add"], 0,
                     events * 10 + 20, 10 ** 6, metadata={"note": "x" * 6_000_000})
    return build_session(raw)


@pytest.fixture(scope="module")
def big_and_small(tmp_path_factory):
    """A store of rank 0: window 0 small (3 events), window 1 big (BIG_EVENTS events, the
    newest: the verbs' default)."""
    from opscope.store.write import StoreWriter

    store = tiny_store(tmp_path_factory.mktemp("big") / "store")
    with StoreWriter(store) as writer:
        writer.write_window(big_session(BIG_EVENTS), window=1)
    return store


def test_memory_limit_refuses_a_big_window_and_lets_a_small_one_through(big_and_small,
                                                                        tmp_path, capsys):
    store = big_and_small
    for verb in verbs(store, tmp_path, "--memory-limit", LIMIT)[1:]:
        status, _, err = run_verb(capsys, *verb)
        assert status == 2 and err.count("\n") == 1, (verb[0], err)
        assert f"store {store!r}" in err and "more than the limit of 20.0 MB" in err, err
        assert ("rank 0, window 1" in err) != (verb[0] == "ranks"), err
        needs = err.split("needs about ")[1].split(" of memory")[0]
        assert needs.endswith(" MB") and float(needs[:-3]) > 20, err
    with pytest.raises(StoreError, match="window 1: reading it needs about"):
        load_store_session(store, 0, 1, memory_limit=20_000_000)
    small = tiny_store(tmp_path / "small")  # window 0 is small, and so are small's ranks
    for verb in [["table", store, "--window", "0"], ["report", store, "--window", "0", "-o",
                                                     tmp_path / "r.html"], ["ranks", small]]:
        status, _, err = run_verb(capsys, *verb, "--memory-limit", LIMIT)
        assert status == 0, (verb[0], err)
    status, _, err = run_verb(capsys, "table", store, "--memory-limit", "1GB")
    assert status == 0, err


@pytest.mark.parametrize("value", ["lots", "2", "0MB", "1PB"])
def test_a_bad_memory_limit_is_one_line(value, tmp_path, capsys):
    store = tiny_store(tmp_path / "store")
    for verb in ("query", "table", "report", "ranks"):
        status, _, err = run_verb(capsys, verb, store, *(["SELECT 1"] if verb == "query"
                                                         else []), "--memory-limit", value)
        assert status == 2 and err.count("\n") == 1 and "--memory-limit" in err, (verb, err)
