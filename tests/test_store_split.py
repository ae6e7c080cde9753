"""A window's events in two files (store/part_write.py): read, queried and checked as one.

From ``tables.SPLIT_EVENTS`` events a window's events are ``part-0.parquet`` and
``part-1.parquet``, encoded at the same time. Here the bound is lowered so that a real
training step's window splits; the store must then read back, and answer SQL, exactly as
the same window in one file, and a part replaced, missing, linked or left over from an
older write must be refused or removed as a one-file partition is.
"""

from __future__ import annotations

import os
import shutil
import sys

import pytest

pq = pytest.importorskip("pyarrow.parquet")
pytest.importorskip("duckdb")

from opscope.store import StoreError, connect, load_store_session, read_window  # noqa: E402
from opscope.store import tables as store_tables  # noqa: E402
from test_store import read_back, tables, train  # noqa: E402


@pytest.fixture(scope="module")
def prof():
    return train(record_shapes=True, with_stack=True, with_modules=True, profile_memory=True)


def _events_files(store, table: str = "events") -> list:
    folder = store / table / "rank=0" / "window=0"
    return sorted(p.name for p in folder.iterdir())


@pytest.fixture(scope="module")
def stores(prof, tmp_path_factory):
    """(one file, two files): the same window written without and with the split."""
    root = tmp_path_factory.mktemp("split")
    prof.export_store(str(root / "one"))
    patch = pytest.MonkeyPatch()
    patch.setattr(store_tables, "EVENTS_BATCH", 16)
    patch.setattr(store_tables, "SPLIT_EVENTS", 40)
    try:
        prof.export_store(str(root / "two"))
    finally:
        patch.undo()
    return root / "one", root / "two"


def test_a_window_from_split_events_is_two_files_cut_between_batches(stores, prof):
    one, two = stores
    assert _events_files(one) == ["part-0.parquet"]
    assert _events_files(two) == ["part-0.parquet", "part-1.parquet"]
    folder = two / "events" / "rank=0" / "window=0"
    first, second = (pq.read_table(folder / name) for name in _events_files(two))
    events = len(prof._session.table)
    assert events > 40
    assert first.num_rows % 16 == 0 and 0 < first.num_rows < events
    assert first.num_rows + second.num_rows == events
    assert second.column("event_id").to_pylist()[0] == first.num_rows


def test_split_events_read_back_as_one_file(stores, prof):
    one, two = stores
    assert tables(read_back(prof, two)) == tables(prof) == tables(read_back(prof, one))
    a, b = read_window(one), read_window(two)
    assert (a.records == b.records).all() and a.names == b.names


def test_the_allocator_records_split_too_and_read_back_the_same(stores, prof, tmp_path):
    """The memory table's columns are made on a thread while the events are written."""
    one, two = stores
    assert _events_files(two, "memory") == ["part-0.parquet", "part-1.parquet"]
    a, b = read_window(one), read_window(two)
    assert len(a.memory) > 40 and a.memory.tobytes() == b.memory.tobytes()
    for name, store in (("one", one), ("two", two)):
        read_back(prof, store).export_memory_timeline(str(tmp_path / f"{name}.raw.json"))
    assert (tmp_path / "one.raw.json").read_bytes() == (tmp_path / "two.raw.json").read_bytes()


def test_split_events_answer_sql_as_one_file(stores):
    query = ("SELECT event_id, name, start_ns, parent, step, module, stack_id, input_id "
             "FROM events ORDER BY event_id")
    results = []
    for store in stores:
        with connect(store) as con:
            results.append(con.execute(query).fetchall())
            results.append(con.execute("SELECT * FROM ops ORDER BY event_id").fetchall())
    assert results[0] == results[2] and results[1] == results[3] and results[0]


def _copy(stores, tmp_path):
    store = tmp_path / "store"
    shutil.copytree(stores[1], store, symlinks=True)
    return store, store / "events" / "rank=0" / "window=0"


def _refused(store, match: str) -> None:
    with pytest.raises(StoreError, match=match):
        read_window(store)
    with pytest.raises(StoreError, match=match):
        connect(store).close()


def test_a_missing_second_part_is_refused(stores, tmp_path):
    store, folder = _copy(stores, tmp_path)
    os.unlink(folder / "part-1.parquet")
    _refused(store, "declares .* rows; the window's sessions row records")


def test_a_second_part_from_another_window_is_refused(stores, tmp_path):
    store, folder = _copy(stores, tmp_path)
    first = pq.read_table(folder / "part-0.parquet")
    pq.write_table(first, folder / "part-1.parquet")  # the rows of the first part again
    _refused(store, "events file .*window=0/'")


def test_a_linked_second_part_is_not_followed(stores, tmp_path):
    store, folder = _copy(stores, tmp_path)
    os.replace(folder / "part-1.parquet", tmp_path / "elsewhere.parquet")
    os.symlink(tmp_path / "elsewhere.parquet", folder / "part-1.parquet")
    _refused(store, "part-1.parquet' is a symlink")


def test_the_parts_together_stay_within_a_windows_rows(stores, tmp_path, monkeypatch):
    store, folder = _copy(stores, tmp_path)
    rows = [pq.read_metadata(folder / n).num_rows for n in ("part-0.parquet", "part-1.parquet")]
    for module in ("opscope.store.folder", "opscope.store.connect"):
        monkeypatch.setattr(sys.modules[module], "max_part_rows", lambda: max(rows))
    _refused(store, f"declares {sum(rows):,} rows, more than the {max(rows):,}")


def test_a_window_written_again_in_one_file_leaves_no_second_part(stores, prof, tmp_path):
    store, folder = _copy(stores, tmp_path)
    from opscope.store.write import StoreWriter

    with StoreWriter(store) as writer:
        writer.write_window(prof._session, window=0)
    assert _events_files(store) == ["part-0.parquet"]
    assert tables(read_back(prof, store)) == tables(prof)

    def names(table):
        return [table.symbols.names[i] for i in table.name_id.tolist()]

    assert names(load_store_session(store).table) == names(prof._session.table)


def test_version_2_stores_still_read_and_a_newer_version_is_refused(stores, tmp_path):
    """A version 2 store (every partition one file) reads as before; version 3 is what an
    older opscope, which would see only part-0, refuses with one line."""
    import json

    from opscope.store.schema import MARKER

    store = tmp_path / "old"
    shutil.copytree(stores[0], store)
    marker = store / MARKER
    assert json.loads(marker.read_text())["version"] == 3
    marker.write_text('{"format": "opscope-store", "version": 2}')
    assert len(read_window(store).records) == len(read_window(stores[0]).records)
    marker.write_text('{"format": "opscope-store", "version": 4}')
    with pytest.raises(StoreError, match="has version 4; this opscope reads versions 2 to 3"):
        read_window(store)
