"""The store's format: its tables, their columns, the marker file and the partition paths.

This module is the one source of truth for the format; the writer, the
reader, ``connect`` and every SQL query follow it. A store is a folder::

    STORE/opscope-store.json                          {"format": "opscope-store", "version": 1}
    STORE/<table>/rank=<R>/window=<W>/part-0.parquet  events, inputs, stacks, memory, sessions
    STORE/collectives/rank=<R>/part-0.parquet         one rank's collectives, all its windows

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
    >>> duckdb_type("list<int64>")
    'BIGINT[]'
"""

from __future__ import annotations

import os
from typing import Dict, Optional, Tuple

MARKER = "opscope-store.json"
FORMAT = "opscope-store"
VERSION = 1
PART_FILE = "part-0.parquet"
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
    ) + tuple((name, "int64") for name in _MEMORY_USAGE),
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
        ("fr_seq", "int64"),
    ),
}
TABLES = tuple(COLUMNS)
WINDOW_TABLES = ("events", "inputs", "stacks", "memory", "sessions")
RANK_TABLES = ("collectives",)
# the columns a view adds from the partition folders
PARTITION_COLUMNS = (("rank", "int32"), ("window", "int32"))

_DUCKDB_TYPES = {"int8": "TINYINT", "int32": "INTEGER", "int64": "BIGINT", "string": "VARCHAR",
                 "dict": "VARCHAR", "list<int64>": "BIGINT[]", "list<string>": "VARCHAR[]"}


class StoreError(ValueError):
    """A path that is not a store, a store that cannot be read or written, or missing deps."""


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


def table_dir(store: str, table: str) -> str:
    return os.path.join(store, table)


def partition_dir(store: str, table: str, rank: int, window: Optional[int] = None) -> str:
    """``STORE/<table>/rank=<R>[/window=<W>]``."""
    path = os.path.join(store, table, f"rank={int(rank)}")
    return path if window is None else os.path.join(path, f"window={int(window)}")


def part_path(store: str, table: str, rank: int, window: Optional[int] = None) -> str:
    """The Parquet file of one partition."""
    return os.path.join(partition_dir(store, table, rank, window), PART_FILE)
