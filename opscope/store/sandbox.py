"""Keep a store's DuckDB connection inside the store: no other file, no network, no way back.

A store may come from someone else; the SQL run on it is the user's own. By
default a connection reads only the Parquet files its views name (DuckDB's
``allowed_paths``, then ``enable_external_access = false``): ``read_csv`` or
``read_text`` of another file, ``COPY ... TO``, ``ATTACH`` of a database file,
``INSTALL``/``LOAD`` and any URL fail with DuckDB's permission error. With
``allow_files`` the SQL may read and write the files the user can, as DuckDB
itself allows. Either way DuckDB never installs or loads an extension by itself
(``autoinstall_known_extensions``/``autoload_known_extensions`` off: opscope never
reaches the network), and the configuration is locked (``lock_configuration``)
so that the SQL cannot turn any of this back on.

``allowed_paths`` came with DuckDB 1.2; an older DuckDB cannot keep the SQL
inside the store, so the locked-down connection is refused there with a
StoreError saying so (``allow_files`` still works).

A path is never passed to DuckDB as a glob: ``literal_path`` escapes ``*``, ``?``
and ``[`` (a store named ``job*.store`` must not read ``jobA.store``'s files).

Example::

    >>> literal_path("/data/run[1].store/events/part-0.parquet")
    '/data/run[[]1].store/events/part-0.parquet'
    >>> literal_path("/data/job*.store")
    '/data/job[*].store'
"""

from __future__ import annotations

from typing import Dict, Sequence

from opscope.store.schema import StoreError, require_duckdb

GLOB_CHARACTERS = "*?["
# settings given when the connection is made: nothing is installed or loaded by itself
CONNECT_CONFIG: Dict[str, object] = {"autoinstall_known_extensions": False,
                                     "autoload_known_extensions": False}


def literal_path(path: str) -> str:
    """``path`` as a DuckDB glob that matches that one path: each glob character in a
    one-character class."""
    return "".join(f"[{c}]" if c in GLOB_CHARACTERS else c for c in path)


def quote(text: str) -> str:
    """``text`` as an SQL string literal."""
    return "'" + text.replace("'", "''") + "'"


def lock_down(con, files: Sequence[str], store: str, *, allow_files: bool) -> None:
    """Confine ``con`` to ``files`` (unless ``allow_files``), then lock its configuration.

    ``files`` are the real paths of the Parquet files the views read; their globs
    (``literal_path``) are allowed too, as DuckDB checks the pattern it is given.
    """
    duckdb = require_duckdb()
    if not allow_files:
        allowed = sorted(set(files) | {literal_path(f) for f in files})
        try:
            con.execute(f"SET allowed_paths = [{', '.join(quote(p) for p in allowed)}]")
        except duckdb.CatalogException:
            raise StoreError(
                f"store {store!r}: duckdb {duckdb.__version__} cannot keep "
                f"SQL inside the store (no allowed_paths setting; DuckDB 1.2 or newer has "
                f"it): pip install -U 'duckdb>=1.2', or allow files (opscope query "
                f"--allow-files, connect(..., allow_files=True))") from None
        con.execute("SET enable_external_access = false")
    con.execute("SET lock_configuration = true")
