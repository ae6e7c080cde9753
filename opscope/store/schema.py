"""The store's format: its tables, their columns, the marker file and the partition paths.

This module is the one source of truth for the format; the writer, the
reader, ``connect`` and every SQL query follow it. A store is a folder::

    STORE/opscope-store.json                          {"format": "opscope-store", "version": 3}
    STORE/<table>/rank=<R>/window=<W>/part-0.parquet  events, inputs, stacks, memory, device,
                                                      sessions
    STORE/collectives/rank=<R>/part-0.parquet         one rank's collectives, all its windows

A partition's rows are those of its files ``part-0.parquet``, ``part-1.parquet``,
... in that order (``MAX_PARTS`` at most). The writer splits a window's events in
two files from ``opscope.store.tables.SPLIT_EVENTS`` events, each Parquet-encoded on
a core of its own; every other partition is one file.

Times are aligned Unix ns: the session clock plus its ``epoch_offset_ns`` plus
the rank's clock offset (``opscopeClockOffsetNs``), so ranks line up.
Columns are ``(name, type)``; types are ``int8``/``int32``/``int64``,
``string``, ``dict`` (a dictionary-encoded string), ``list<int64>`` and
``list<string>``. Nothing here imports pyarrow or duckdb at module level.

Example::

    >>> [name for name, _ in COLUMNS["stacks"]]
    ['stack_id', 'frames']
    >>> part_path("/s", "events", 2, 5)
    '/s/events/rank=2/window=5/part-0.parquet'
    >>> part_path("/s", "collectives", 2)
    '/s/collectives/rank=2/part-0.parquet'
    >>> part_path("/s", "events", 2, 5, part=1)
    '/s/events/rank=2/window=5/part-1.parquet'
    >>> duckdb_type("list<int64>")
    'BIGINT[]'
"""

from __future__ import annotations

import json
import os
from typing import Dict, Optional, Tuple

MARKER = "opscope-store.json"
FORMAT = "opscope-store"
VERSION = 3  # 2: the collectives' facts (pg_desc, pg_ranks, in/out_nelems, dtype);
# 3: a partition may be several part files (a version 2 reader would see only part-0)
READ_VERSIONS = (2, 3)  # the versions this opscope reads (2 is 3 with one file each)
PART_FILE = "part-0.parquet"
MAX_PARTS = 16  # part files a partition may hold; a reader stops at the first one missing
INSTALL_HINT = "pip install 'opscope[store]'"

Columns = Tuple[Tuple[str, str], ...]

_MEMORY_USAGE = ("cpu_memory_usage", "self_cpu_memory_usage", "device_memory_usage",
                 "self_device_memory_usage")

COLUMNS: Dict[str, Columns] = {
    # one row per event of the built session, in table order
    "events": (
        ("event_id", "int64"), ("record", "int64"), ("name", "dict"), ("thread_id", "int64"),
        ("thread_index", "int32"), ("start_ns", "int64"), ("end_ns", "int64"),
        ("dur_ns", "int64"), ("self_ns", "int64"), ("parent", "int64"), ("depth", "int32"),
        ("seq_nr", "int64"), ("fwd_thread_id", "int64"), ("rf_thread_id", "int64"),
        ("scope", "int8"), ("flags", "int8"), ("step", "int32"), ("module", "dict"),
        ("input_id", "int32"), ("stack_id", "int32"), ("flops", "int64"),
    ) + tuple((name, "int64") for name in _MEMORY_USAGE) + (
        # a CUDA runtime or driver call's correlation id (null: not one), as torch's args
        ("correlation", "int64"),),
    # one row per distinct recorded input signature of the window
    "inputs": (
        ("input_id", "int32"), ("words", "list<int64>"), ("input_dims", "string"),
        ("input_types", "string"), ("input_strides", "string"), ("concrete_inputs", "string"),
    ),
    # one row per distinct Python stack of the window
    "stacks": (("stack_id", "int32"), ("frames", "list<string>")),
    # one row per allocator record (records.MEMORY_DTYPE), in time order
    "memory": (
        ("time_ns", "int64"), ("addr", "int64"), ("bytes", "int64"), ("total_allocated", "int64"),
        ("total_reserved", "int64"), ("thread_index", "int32"), ("device_type", "int8"),
        ("device_index", "int8"), ("event_id", "int64"), ("category", "dict"),
    ),
    # one row per kernel, copy and memset of a device collector (model.device), in
    # start order: its launching call's and its op's event_id (-1: none)
    "device": (
        ("device_event_id", "int64"), ("category", "dict"), ("name", "dict"),
        ("device", "int32"), ("stream", "int64"), ("start_ns", "int64"), ("end_ns", "int64"),
        ("dur_ns", "int64"), ("correlation", "int64"), ("bytes", "int64"),
        ("launch_event", "int64"), ("op_event", "int64"), ("registers", "int32"),
        ("shared_memory", "int64"), ("context", "int64"), ("grid", "list<int64>"),
        ("block", "list<int64>"),
    ),
    # one row per (rank, window)
    "sessions": (
        ("window_name", "string"), ("source_path", "string"), ("process_id", "int64"),
        ("start_ns", "int64"), ("stop_ns", "int64"), ("epoch_offset_ns", "int64"),
        ("clock_offset_ns", "int64"), ("collector", "string"), ("trace_name", "string"),
        ("python_functions", "string"), ("options", "string"), ("metadata", "string"),
        ("extras", "string"), ("world_size", "int32"), ("rank_facts", "string"),
    ),
    # one row per collective call of a rank (partitioned by rank only)
    "collectives": (
        ("window", "int32"), ("pg", "string"), ("seq", "int64"), ("kind", "dict"),
        ("bytes", "int64"), ("arrival_ns", "int64"), ("end_ns", "int64"),
        ("duration_ns", "int64"), ("call_site", "string"), ("fr_pg", "string"),
        ("fr_seq", "int64"), ("pg_desc", "dict"), ("pg_ranks", "dict"),
        ("in_nelems", "int64"), ("out_nelems", "int64"), ("dtype", "dict"),
    ),
}
# Columns that grow with the row (ids, times in order) are written DELTA_BINARY_PACKED:
# the differences take a few bits where a dictionary took ~2 bytes a row and zstd could
# not shrink it. The rest are dictionary-encoded; every file is zstd at ZSTD_LEVEL (1:
# level 3 wrote 2M events' table in 0.78 s of CPU against 0.54 s, to 0.2% fewer bytes,
# and a 150k-event CNN trace's store is 1/31 of its JSON at either; level 6 or more
# saves under 2% more for twice the CPU). That store was 1/16.7 before the encodings.
DELTA_COLUMNS: Dict[str, Tuple[str, ...]] = {
    "events": ("event_id", "record", "start_ns", "end_ns", "parent"),
    "inputs": ("input_id",),
    "stacks": ("stack_id",),
    "memory": ("time_ns", "event_id"),
    "device": ("device_event_id", "start_ns", "end_ns"),
    "collectives": ("seq", "arrival_ns", "end_ns"),
}
ZSTD_LEVEL = 1
# Columns whose min/max go into the footers (DuckDB skips row groups by them): those a
# query filters or sorts on. Statistics of every column were a third of the events
# table's write time. A table not listed keeps them on every column.
STATS_COLUMNS: Dict[str, Tuple[str, ...]] = {
    "events": ("event_id", "name", "thread_id", "start_ns", "end_ns", "dur_ns", "step",
               "module"),
}
TABLES = tuple(COLUMNS)
WINDOW_TABLES = ("events", "inputs", "stacks", "memory", "device", "sessions")
RANK_TABLES = ("collectives",)
# the columns a view adds from the partition folders
PARTITION_COLUMNS = (("rank", "int32"), ("window", "int32"))

_DUCKDB_TYPES = {"int8": "TINYINT", "int32": "INTEGER", "int64": "BIGINT", "string": "VARCHAR",
                 "dict": "VARCHAR", "list<int64>": "BIGINT[]", "list<string>": "VARCHAR[]"}


class StoreError(ValueError):
    """A path that is not a store, a store that cannot be read or written, or missing deps."""


def load_json(text: str):
    """``json.loads(text)``, with a document nested too deeply for Python's parser raising
    ValueError as any other malformed text does (a store's JSON fields are not trusted).

    >>> load_json('{"a": [1]}')
    {'a': [1]}
    >>> load_json("[" * 100_000 + "]" * 100_000)
    Traceback (most recent call last):
    ...
    ValueError: JSON nested too deeply
    """
    try:
        return json.loads(text)
    except RecursionError:
        raise ValueError("JSON nested too deeply") from None


def duckdb_type(kind: str) -> str:
    """The DuckDB type of a column type of ``COLUMNS``."""
    return _DUCKDB_TYPES[kind]


def require_pyarrow():
    """``(pyarrow, pyarrow.parquet)``; StoreError with the install line when missing."""
    try:
        import pyarrow
        import pyarrow.parquet
    except ImportError as exc:
        raise StoreError(f"opscope stores need pyarrow ({exc}); {INSTALL_HINT}") from None
    return pyarrow, pyarrow.parquet


def require_duckdb():
    """The ``duckdb`` module; StoreError with the install line when missing."""
    try:
        import duckdb
    except ImportError as exc:
        raise StoreError(f"opscope stores need duckdb ({exc}); {INSTALL_HINT}") from None
    return duckdb


def arrow_schema(table: str):
    """The pyarrow schema of ``table`` (a name of ``COLUMNS``).

    >>> arrow_schema("stacks").field("frames").type
    ListType(list<item: string>)
    """
    pa, _ = require_pyarrow()
    types = {"int8": pa.int8(), "int32": pa.int32(), "int64": pa.int64(),
             "string": pa.string(), "dict": pa.dictionary(pa.int32(), pa.string()),
             "list<int64>": pa.list_(pa.int64()), "list<string>": pa.list_(pa.string())}
    return pa.schema([(name, types[kind]) for name, kind in COLUMNS[table]])


def parquet_options(table: str) -> Dict[str, object]:
    """``pyarrow.parquet.ParquetWriter`` keywords for ``table``: zstd, delta and dictionary
    encodings by column (``DELTA_COLUMNS``), statistics where queries use them
    (``STATS_COLUMNS``).

    >>> parquet_options("stacks")["column_encoding"]
    {'stack_id': 'DELTA_BINARY_PACKED'}
    """
    delta = DELTA_COLUMNS.get(table, ())
    return {"compression": "zstd", "compression_level": ZSTD_LEVEL,
            "use_dictionary": [name for name, _ in COLUMNS[table] if name not in delta],
            "column_encoding": {name: "DELTA_BINARY_PACKED" for name in delta},
            "write_statistics": list(STATS_COLUMNS.get(table, (n for n, _ in COLUMNS[table])))}


def table_dir(store: str, table: str) -> str:
    return os.path.join(store, table)


def partition_dir(store: str, table: str, rank: int, window: Optional[int] = None) -> str:
    """``STORE/<table>/rank=<R>[/window=<W>]``."""
    path = os.path.join(store, table, f"rank={int(rank)}")
    return path if window is None else os.path.join(path, f"window={int(window)}")


def part_path(store: str, table: str, rank: int, window: Optional[int] = None,
              part: int = 0) -> str:
    """The Parquet file number ``part`` of one partition (its first by default)."""
    return os.path.join(partition_dir(store, table, rank, window), f"part-{int(part)}.parquet")
