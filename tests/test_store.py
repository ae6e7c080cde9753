"""opscope stores: the writer, the exact round trip, export_store, store_handler, refusals.

A real session (forward, backward and optimizer steps of a small model) written to a store
and read back must give ``key_averages().table()`` character for character (also grouped by
input shape and by stack) and the same Chrome trace, for a covering set of the option
combinations (every pair of options both ways, all on, all off), under each collector, and
for saved torch.profiler traces. Durations are never asserted.
"""

from __future__ import annotations

import builtins
import copy
import gzip
import itertools
import json
import os
import warnings
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import torch

import opscope
from opscope.analysis.build import load_session
from opscope.analysis.collectives import CollectiveCall
from opscope.analysis.ranks.facts import RankFacts
from opscope.model.session import OPTION_NAMES
from opscope.store import StoreError, connect, load_store_session, read_window, windows
from opscope.store.schema import COLUMNS, MARKER
from opscope.store.write import StoreWriter

TORCH_TRACES = sorted((Path(__file__).parent / "torch_traces").glob("torch-*.trace.json.gz"))

# Every pair of the five options takes all four value pairs in these rows (checked below).
PAIRWISE = ["00000", "11001", "10101", "10010", "01111", "01110"]
COMBOS = ["11111"] + PAIRWISE


def options_of(bits: str) -> dict:
    return {name: bit == "1" for name, bit in zip(OPTION_NAMES, bits)}


def test_the_combinations_cover_every_pair_of_options():
    for i, j in itertools.combinations(range(len(OPTION_NAMES)), 2):
        assert {row[i] + row[j] for row in PAIRWISE} == {"00", "01", "10", "11"}


def train(**options):
    """Profile 3 steps (1 warmup, 2 active) of a small model: forward, backward, SGD step."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with opscope.profile(schedule=opscope.schedule(wait=0, warmup=1, active=2, repeat=1),
                         **options) as prof:
        for _ in range(3):
            model(torch.randn(5, 8)).sum().backward()
            optimizer.step()
            optimizer.zero_grad()
            opscope.itt.mark("step done")
            prof.step()
    return prof


def tables(prof) -> list:
    return [prof.key_averages(**kw).table(sort_by="self_cpu_time_total", row_limit=-1)
            for kw in ({}, {"group_by_input_shape": True}, {"group_by_stack_n": 5})]


def chrome_trace(prof, path: Path) -> dict:
    prof.export_chrome_trace(str(path))
    doc = json.loads(path.read_text())
    return {k: v for k, v in doc.items() if k not in ("trace_id", "traceName")}


def read_back(prof, store: Path, **where):
    """A copy of ``prof`` whose session is the one read back from ``store``."""
    back = copy.copy(prof)
    back._session = load_store_session(store, **where)
    back._events = None
    return back


def assert_round_trip(prof, tmp_path: Path):
    store = tmp_path / "store"
    assert prof.export_store(str(store)) == 0
    back = read_back(prof, store)
    assert tables(back) == tables(prof)
    assert chrome_trace(back, tmp_path / "b.json") == chrome_trace(prof, tmp_path / "a.json")
    if prof.profile_memory:  # the categories come from the memory records and sightings
        for p, name in ((prof, "a"), (back, "b")):
            p.export_memory_timeline(str(tmp_path / f"{name}.raw.json.gz"))
        assert (gzip.decompress((tmp_path / "a.raw.json.gz").read_bytes())
                == gzip.decompress((tmp_path / "b.raw.json.gz").read_bytes()))
    return store


@pytest.mark.parametrize("bits", COMBOS)
def test_round_trip_gives_the_same_tables_and_trace(bits, tmp_path, native_only):
    prof = train(**options_of(bits))
    store = assert_round_trip(prof, tmp_path)
    events = pq.read_table(store / "events" / "rank=0" / "window=0" / "part-0.parquet")
    assert events.num_rows == len(prof.session.table)
    assert set(events.column("step").to_pylist()) >= {1, 2}  # ProfilerStep#1 and #2


def test_round_trip_under_each_collector(collector_name, tmp_path):
    options = options_of("11111")
    if collector_name == "python":
        options["profile_memory"] = False  # the native collector's alone
    assert_round_trip(train(**options), tmp_path)


@pytest.mark.parametrize("trace", TORCH_TRACES, ids=lambda p: p.name.split(".trace")[0])
def test_saved_torch_traces_round_trip(trace, tmp_path):
    session = load_session(trace)
    with StoreWriter(tmp_path / "store") as writer:
        writer.write_window(session)
    prof = opscope.profile(record_shapes=True, with_stack=True)
    prof._session, prof._events = session, None
    back = read_back(prof, tmp_path / "store")
    assert tables(back) == tables(prof)
    assert chrome_trace(back, tmp_path / "b.json") == chrome_trace(prof, tmp_path / "a.json")
    assert back.session.python_functions == session.python_functions


def test_columns_hold_the_derived_facts(tmp_path, native_only):
    prof = train(record_shapes=True, with_modules=True, profile_memory=True, with_stack=True)
    prof.export_store(str(tmp_path / "store"))
    con = connect(tmp_path / "store")
    steps = con.sql("SELECT step FROM events WHERE name LIKE 'ProfilerStep#%' ORDER BY 1")
    assert steps.fetchall() == [(1,), (2,)]
    assert con.sql("SELECT count(*) FROM events WHERE module = '0 (Linear)'").fetchall()[0][0] > 2
    # a child's depth is its parent's plus one
    bad = con.sql("SELECT count(*) FROM events c JOIN events p ON c.parent = p.event_id "
                  "WHERE c.depth <> p.depth + 1").fetchall()
    assert bad == [(0,)]
    mm = con.sql("SELECT input_dims, input_types FROM ops WHERE name = 'aten::addmm' "
                 "LIMIT 1").fetchall()
    assert mm == [("[[16], [5, 8], [8, 16], [], []]", "['float', 'float', 'float', 'Scalar', "
                   "'Scalar']")]
    categories = {c for (c,) in con.sql("SELECT DISTINCT category FROM memory").fetchall()}
    assert {"PARAMETER", "GRADIENT"} & categories or {"ACTIVATION"} & categories
    frames = con.sql("SELECT frames FROM ops WHERE name = 'aten::addmm' LIMIT 1").fetchall()
    assert any("test_store.py" in f for f in frames[0][0])


def test_files_are_partitioned_dictionary_encoded_and_compressed(tmp_path, native_only):
    prof = train(record_shapes=True)
    prof.export_store(str(tmp_path / "s"))
    assert json.loads((tmp_path / "s" / MARKER).read_text()) == {"format": "opscope-store",
                                                                 "version": 3}
    for table in COLUMNS:
        sub = "rank=0" if table == "collectives" else "rank=0/window=0"
        path = tmp_path / "s" / table / sub / "part-0.parquet"
        meta = pq.ParquetFile(path)
        assert [f.name for f in meta.schema_arrow] == [name for name, _ in COLUMNS[table]]
        if meta.metadata.num_rows:
            assert meta.metadata.row_group(0).column(0).compression == "ZSTD"
    names = pq.read_table(tmp_path / "s/events/rank=0/window=0/part-0.parquet").schema
    assert str(names.field("name").type).startswith("dictionary")
    leftovers = [p for p in (tmp_path / "s").rglob("*") if p.name.startswith(".")]
    assert leftovers == []


@pytest.mark.filterwarnings("ignore:Profiler won't be using warmup")
def test_export_store_appends_and_store_handler_numbers_windows(tmp_path, native_only):
    store = tmp_path / "store"
    model = torch.nn.Linear(4, 2)
    with opscope.profile(schedule=opscope.schedule(wait=0, warmup=0, active=1, repeat=3),
                         on_trace_ready=opscope.store_handler(str(store))) as prof:
        for _ in range(3):
            model(torch.ones(2, 4)).sum().backward()
            prof.step()
    assert windows(store) == [(0, 0), (0, 1), (0, 2)]
    assert prof.export_store(str(store)) == 2  # the handler stored the last window already
    names = connect(store).sql('SELECT window_name FROM sessions ORDER BY "window"').fetchall()
    assert names == [("step0",), ("step1",), ("step2",)]


def test_a_rank_from_the_metadata_and_a_window_written_again(tmp_path, native_only):
    with opscope.profile() as prof:
        torch.ones(3).add(1)
        prof.add_metadata_json("distributedInfo", '{"rank": 3, "world_size": 4}')
    with StoreWriter(tmp_path / "s") as writer:
        assert writer.write_window(prof.session) == 0
        assert writer.write_window(prof.session, window=0, window_name="again") == 0
    assert windows(tmp_path / "s") == [(3, 0)]
    row = connect(tmp_path / "s").sql("SELECT window_name, world_size, rank FROM sessions")
    assert row.fetchall() == [("again", 4, 3)]


def test_collectives_are_keyed_and_collective_ranks_has_wait_and_transfer(tmp_path):
    a = RankFacts(0, calls=[CollectiveCall("allreduce", 64, 100, 300, 200),
                            CollectiveCall("broadcast", 8, 400, 410, 10)])
    b = RankFacts(1, calls=[CollectiveCall("allreduce", 64, 250, 300, 50),
                            CollectiveCall("broadcast", 8, 405, 410, 5)])
    with StoreWriter(tmp_path / "s") as writer:
        for facts in (a, b):
            writer.write_collectives(facts.rank, facts)
    rows = connect(tmp_path / "s").sql(
        "SELECT pg, seq, kind, rank, transfer_ns, wait_ns, late_ns, ranks FROM collective_ranks "
        "ORDER BY seq, rank").fetchall()
    assert rows == [("0", 0, "allreduce", 0, 50, 150, 0, 2), ("0", 0, "allreduce", 1, 50, 0, 150, 2),
                    ("0", 1, "broadcast", 0, 5, 5, 0, 2), ("0", 1, "broadcast", 1, 5, 0, 5, 2)]


def test_paths_that_are_not_stores_are_refused(tmp_path):
    (tmp_path / "trace.json").write_text("{}")
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("mine")
    (tmp_path / "real").mkdir()
    os.symlink(tmp_path / "real", tmp_path / "link")
    bad_marker = tmp_path / "bad"
    bad_marker.mkdir()
    (bad_marker / MARKER).write_text('{"format": "opscope-store", "version": 99}')
    for path, words in [("trace.json", "not a folder"), ("other", "no opscope-store.json"),
                        ("link", "symlink"), ("bad", "version 99"), ("none", "no such folder")]:
        with pytest.raises(StoreError, match=words) as info:
            connect(tmp_path / path)
        assert str(tmp_path / path) in str(info.value)
    for path in ("trace.json", "other", "link"):
        with pytest.raises(StoreError):
            StoreWriter(tmp_path / path)
    with pytest.raises(StoreError, match="symlink"):
        opscope.store_handler(str(tmp_path / "link"))


def test_a_symlinked_partition_is_not_followed(tmp_path, native_only):
    prof = train()
    prof.export_store(str(tmp_path / "s"))
    target = tmp_path / "s" / "events" / "rank=0" / "window=0" / "part-0.parquet"
    target.rename(tmp_path / "elsewhere.parquet")  # a good file, reached only by the link
    os.symlink(tmp_path / "elsewhere.parquet", target)
    for read in (read_window, connect):
        with pytest.raises(StoreError, match="symlink") as info:
            read(tmp_path / "s")
        assert str(target) in str(info.value)
    with pytest.raises(StoreError, match="symlink"):
        StoreWriter(tmp_path / "s").write_window(prof.session, window=0)
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "s" / "memory" / "rank=0").rename(tmp_path / "moved")
    os.symlink(tmp_path / "elsewhere", tmp_path / "s" / "memory" / "rank=0")
    with pytest.raises(StoreError, match="symlink"):
        train().export_store(str(tmp_path / "s"))  # a new window: prof's is stored already
    assert list((tmp_path / "elsewhere").iterdir()) == []


def test_without_pyarrow_or_duckdb_one_clear_line(tmp_path, monkeypatch, native_only):
    prof = train()
    prof.export_store(str(tmp_path / "s"))
    real_import = builtins.__import__

    def no_store_deps(name, *args, **kwargs):
        if name.split(".")[0] in ("pyarrow", "duckdb"):
            raise ImportError(f"No module named {name!r}")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_store_deps)
    for call in (lambda: prof.export_store(str(tmp_path / "t")),
                 lambda: connect(tmp_path / "s"),
                 lambda: opscope.store_handler(str(tmp_path / "u"))):
        with pytest.raises(StoreError, match=r"pip install 'opscope\[store\]'"):
            call()


def test_a_failing_store_handler_warns_once_and_the_job_goes_on(tmp_path, monkeypatch,
                                                                native_only):
    def refuse(self, session, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(StoreWriter, "write_window", refuse)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with opscope.profile(schedule=opscope.schedule(wait=0, warmup=0, active=1, repeat=2),
                             on_trace_ready=opscope.store_handler(str(tmp_path / "s"))) as prof:
            for _ in range(2):
                torch.ones(3).add(1)
                prof.step()
    mine = [str(w.message) for w in caught if "store_handler" in str(w.message)]
    assert len(mine) == 1 and all("No space left" in m and "\n" not in m for m in mine)
    assert len(prof.session.table) > 0


def test_a_malformed_store_gives_one_store_error(tmp_path, native_only):
    import pyarrow as pa

    prof = train()
    prof.export_store(str(tmp_path / "s"))
    events = tmp_path / "s" / "events" / "rank=0" / "window=0" / "part-0.parquet"
    good = events.read_bytes()
    pq.write_table(pa.table({"name": [1, 2]}), events)  # the wrong columns
    with pytest.raises(StoreError, match="window 0: malformed"):
        load_store_session(tmp_path / "s")
    events.write_bytes(b"PAR1 not really")
    with pytest.raises(StoreError, match="cannot read"):
        load_store_session(tmp_path / "s")
    events.write_bytes(good)
    sessions = tmp_path / "s" / "sessions" / "rank=0" / "window=0" / "part-0.parquet"
    table = pq.read_table(sessions)
    table = table.set_column(table.schema.get_field_index("extras"), "extras",
                             pa.array(['{"modules": [{"bad": 1}]}']))
    pq.write_table(table, sessions)
    with pytest.raises(StoreError, match="extras"):
        read_window(tmp_path / "s")


def test_a_partition_written_batch_by_batch_reads_the_same(tmp_path, native_only):
    prof = train(record_shapes=True, with_stack=True)
    prof.export_store(str(tmp_path / "s"))
    path = tmp_path / "s" / "events" / "rank=0" / "window=0" / "part-0.parquet"
    events = pq.read_table(path)
    half = events.num_rows // 2
    writer = StoreWriter(tmp_path / "s")
    with pytest.raises(RuntimeError):
        with writer.part_writer("events", 0, 0) as part:
            part.write_table(events.slice(0, half))
            raise RuntimeError("the source failed half way")
    assert pq.read_table(path).equals(events)  # the old file stays, no temp file is left
    with writer.part_writer("events", 0, 0) as part:
        for batch in (events.slice(0, half), events.slice(half)):
            part.write_table(batch)
    assert pq.ParquetFile(path).metadata.num_row_groups == 2
    assert tables(read_back(prof, tmp_path / "s")) == tables(prof)
    assert [p.name for p in path.parent.iterdir()] == ["part-0.parquet"]
