"""opscope stores: a profile as a folder of Parquet files, queried with DuckDB.

``StoreWriter`` writes one (``prof.export_store``, ``opscope.store_handler``
and ``opscope convert`` use it); ``connect(store)`` returns a DuckDB
connection with the store's views; ``load_store_session`` reads one window
back as a session. The format is in ``opscope.store.schema``. pyarrow and
duckdb are imported only when a store is used (``pip install 'opscope[store]'``).

Example::

    >>> from opscope.store import StoreError
    >>> issubclass(StoreError, ValueError)
    True
"""

from __future__ import annotations

from opscope.store.connect import connect  # the function (duckdb is imported when called)
from opscope.store.schema import StoreError


def __getattr__(name):
    lazy = {"StoreWriter": "opscope.store.write", "read_window": "opscope.store.read",
            "load_store_session": "opscope.store.read", "windows": "opscope.store.read"}
    if name in lazy:
        import importlib

        return getattr(importlib.import_module(lazy[name]), name)
    raise AttributeError(f"module 'opscope.store' has no attribute {name!r}")


__all__ = ["StoreError", "StoreWriter", "connect", "read_window", "load_store_session",
           "windows"]
