"""SQL over a store: ``connect(STORE)`` returns a DuckDB connection with the store's views.

Every table of the format (``opscope.store.schema``) is a view with two more
columns from its partition folders, ``rank`` and ``window`` (``window`` is a
keyword in SQL: write it ``"window"``). Times are aligned Unix ns, durations ns.

- ``events``: one row per event (op, range, ``[memory]`` event) of a window:
  ``event_id`` (row in the window), ``record``, ``name``, ``thread_id`` (OS tid),
  ``thread_index``, ``start_ns``, ``end_ns``, ``dur_ns``, ``self_ns``, ``parent``
  (an ``event_id``, -1 for none), ``depth``, ``seq_nr``, ``fwd_thread_id``,
  ``rf_thread_id``, ``scope`` (1: backward node, 7: user range), ``flags``,
  ``step`` (the N of the ``ProfilerStep#N`` it ran in, -1 none), ``module`` (the
  module range name, null none), ``input_id``, ``stack_id`` (-1 none), ``flops``,
  ``cpu_memory_usage``, ``self_cpu_memory_usage``, ``device_memory_usage``,
  ``self_device_memory_usage`` (null when not recorded).
- ``inputs``: ``input_id``, ``words`` (the raw encoding), ``input_dims``,
  ``input_types``, ``input_strides``, ``concrete_inputs`` (text as torch prints them).
- ``stacks``: ``stack_id``, ``frames`` (list, innermost first).
- ``memory``: ``time_ns``, ``addr``, ``bytes`` (negative: a free),
  ``total_allocated``, ``total_reserved``, ``thread_index``, ``device_type``,
  ``device_index``, ``event_id`` (owner), ``category`` (PARAMETER, ACTIVATION, ...;
  null: unknown).
- ``sessions``: one row per window: ``window_name``, ``source_path``,
  ``process_id``, ``start_ns``, ``stop_ns``, ``epoch_offset_ns``,
  ``clock_offset_ns``, ``collector``, ``trace_name``, ``python_functions``,
  ``options``, ``metadata``, ``extras``, ``rank_facts`` (JSON texts), ``world_size``.
- ``collectives``: one row per collective call: ``window``, ``pg``, ``seq`` (the
  matching key), ``kind``, ``bytes``, ``arrival_ns``, ``end_ns``, ``duration_ns``,
  ``call_site``, ``fr_pg``, ``fr_seq`` (the collective's own group and number, from
  the flight recorder, torch's record_param_comms args, or for a point-to-point op
  its process-group call; null: none), ``pg_desc``,
  ``pg_ranks`` (``"[0, 1]"``), ``in_nelems``, ``out_nelems``, ``dtype`` (``"Float"``).
- ``ops``: ``events`` plus ``input_dims``, ``input_types``, ``input_strides``,
  ``concrete_inputs`` and ``frames``.
- ``collective_ranks``: per matched collective (``pg``, ``seq``) and rank:
  ``kind``, ``window``, ``step`` (the step of ``steps`` its arrival falls in), ``bytes``,
  ``call_site``, ``arrival_ns``,
  ``end_ns``, ``duration_ns``, ``transfer_ns`` (the shortest duration across the
  ranks: the TensorBoard rule), ``wait_ns`` (the rest), ``late_ns`` (arrival after
  the first rank's), ``ranks`` (how many ranks issued it), ``wait_wall_ns`` and
  ``late_wall_ns`` (the part of the wait, or of the lateness, that no collective of the
  rank's step starting earlier covers: their sum is wall time, counting collectives in
  flight at once, as DDP's bucket all-reduces are, once).
- ``steps``: per rank, window and step: ``step``, ``start_ns``, ``end_ns``,
  ``dur_ns``, ``kind``: the ``ProfilerStep#N`` ranges (``kind`` 'profiler_step',
  ``step`` N), else, in a window without them, the optimizer steps ('optimizer_step',
  ``step`` 0, 1, ... in the window: from the previous optimizer step's end, or the
  window's start, to this one's end).

Example (a store with one window)::

    >>> import os, tempfile
    >>> from opscope.analysis.build import build_session
    >>> from opscope.model.records import NO_INPUTS, SCOPE_USER, RawSession, records_from_rows
    >>> from opscope.store.write import StoreWriter
    >>> rows = [(0, 100, -1, 0, 0, 0, 1, NO_INPUTS, SCOPE_USER, 0, 0),
    ...         (10, 60, -1, 1, 0, 0, 1, NO_INPUTS, 0, 0, 0),
    ...         (60, 90, -1, 2, 0, 0, 1, NO_INPUTS, 0, 0, 0)]
    >>> raw = RawSession(records_from_rows(rows), [], [7],
    ...                  ["ProfilerStep#1", "aten::mm", "aten::add"], 0, 100, 0)
    >>> path = os.path.join(tempfile.mkdtemp(), "store")
    >>> with StoreWriter(path) as w:
    ...     w.write_window(build_session(raw))
    0
    >>> con = connect(path)
    >>> con.sql("SELECT name, sum(self_ns) AS self_ns FROM events "
    ...         "GROUP BY name ORDER BY self_ns DESC").fetchall()
    [('aten::mm', 50), ('aten::add', 30), ('ProfilerStep#1', 20)]
    >>> con.sql('SELECT rank, "window", step, dur_ns FROM steps').fetchall()
    [(0, 0, 1, 100)]
    >>> connect(os.path.dirname(path))
    Traceback (most recent call last):
    ...
    opscope.store.schema.StoreError: ... is not an opscope store (no opscope-store.json in it)
"""

from __future__ import annotations

import os
import sys
from typing import Dict, List, Optional, Set, Tuple, Union

from opscope.store.folder import (Footer, check_rows, check_store_folder, max_part_rows,
                                  partition_files, partition_of, partition_values,
                                  regular_file_inside)
from opscope.store.parts import check_recorded, recorded_parts
from opscope.store.sandbox import CONNECT_CONFIG, literal_path, lock_down, quote
from opscope.store.schema import (COLUMNS, PART_FILE, RANK_TABLES, WINDOW_TABLES, StoreError,
                                  duckdb_type, load_json, part_path, partition_dir,
                                  require_duckdb)

DERIVED_VIEWS = {
    "ops": """
        SELECT e.*, i.input_dims, i.input_types, i.input_strides, i.concrete_inputs, s.frames
        FROM events e
        LEFT JOIN inputs i ON i.rank = e.rank AND i."window" = e."window"
                          AND i.input_id = e.input_id
        LEFT JOIN stacks s ON s.rank = e.rank AND s."window" = e."window"
                          AND s.stack_id = e.stack_id""",
    "steps": """
        WITH profiler_steps AS (
            SELECT rank, "window", step, min(start_ns) AS start_ns, max(end_ns) AS end_ns,
                   'profiler_step' AS kind
            FROM events WHERE step >= 0 AND name LIKE 'ProfilerStep#%'
            GROUP BY rank, "window", step),
        optimizer_steps AS (
            SELECT o.rank, o."window",
                   CAST(row_number() OVER w - 1 AS INTEGER) AS step,
                   coalesce(lag(o.end_ns) OVER w, s.start_ns) AS start_ns, o.end_ns,
                   'optimizer_step' AS kind
            FROM events o JOIN sessions s ON s.rank = o.rank AND s."window" = o."window"
            WHERE o.name LIKE 'Optimizer.step#%'
            WINDOW w AS (PARTITION BY o.rank, o."window" ORDER BY o.end_ns))
        SELECT rank, "window", step, start_ns, end_ns, end_ns - start_ns AS dur_ns, kind
        FROM profiler_steps
        UNION ALL
        SELECT rank, "window", step, start_ns, end_ns, end_ns - start_ns AS dur_ns, kind
        FROM optimizer_steps o WHERE NOT EXISTS (
            SELECT 1 FROM profiler_steps p WHERE p.rank = o.rank AND p."window" = o."window")""",
    "collective_ranks": """
        WITH matched AS (
            SELECT c.pg, c.seq, c.kind, c.rank, c."window", st.step, c.bytes, c.call_site,
                   c.arrival_ns, c.end_ns, c.duration_ns,
                   min(c.duration_ns) OVER k AS transfer_ns,
                   c.duration_ns - min(c.duration_ns) OVER k AS wait_ns,
                   c.arrival_ns - min(c.arrival_ns) OVER k AS late_ns,
                   count(*) OVER k AS ranks,
                   c.end_ns - c.duration_ns AS wait_from  -- the wait opens the range
            FROM collectives c
            LEFT JOIN steps st ON st.rank = c.rank AND st."window" = c."window"
                              AND c.arrival_ns >= st.start_ns AND c.arrival_ns < st.end_ns
            WHERE c.seq IS NOT NULL
            WINDOW k AS (PARTITION BY c.pg, c.seq))
        -- the *_wall_ns columns: the part of a span no earlier-starting span of the rank's
        -- step covers, so that their sum counts collectives in flight at once once
        SELECT pg, seq, kind, rank, "window", step, bytes, call_site, arrival_ns, end_ns,
               duration_ns, transfer_ns, wait_ns, late_ns, ranks,
               greatest(0, wait_from + wait_ns - greatest(wait_from, coalesce(
                   max(wait_from + wait_ns) OVER (w ORDER BY wait_from, wait_ns
                       ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), wait_from)))
                   AS wait_wall_ns,
               greatest(0, arrival_ns - greatest(arrival_ns - late_ns, coalesce(
                   max(arrival_ns) OVER (w ORDER BY arrival_ns - late_ns, arrival_ns
                       ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), arrival_ns - late_ns)))
                   AS late_wall_ns
        FROM matched
        WINDOW w AS (PARTITION BY rank, "window", step)""",
}
VIEWS = tuple(COLUMNS) + tuple(DERIVED_VIEWS)


def part_files(store: str, table: str) -> List[str]:
    """The Parquet files of ``table``, in rank and window order; a symlink on the way
    raises StoreError (see ``opscope.store.folder.regular_file_inside``).

    A window's files are listed only when its ``sessions`` file, written last, is
    there: the rows of a window still being written (or whose writer was killed) are
    not seen.
    """
    root = os.path.join(store, table)
    if os.path.islink(root):
        raise StoreError(f"store {store!r}: {root!r} is a symlink; not following it")
    files = []
    for rank in partition_values(root, "rank"):
        if table in RANK_TABLES:
            files += partition_files(store, table, rank)
            continue
        folder = os.path.join(root, f"rank={rank}")
        for w in partition_values(folder, "window"):
            if table == "sessions" or regular_file_inside(
                    store, part_path(store, "sessions", rank, w)):
                files += partition_files(store, table, rank, w)
    return files


def table_sql(store: str, table: str, files: Optional[List[str]] = None) -> str:
    """The SELECT of one table's view: its columns, then rank (and window) from the folders.

    ``files``: the table's files (default: ``part_files``), each passed as the glob
    that matches only itself (``sandbox.literal_path``).
    """
    columns = list(COLUMNS[table])
    extra = [("rank", "int32")] + ([("window", "int32")] if table in WINDOW_TABLES else [])
    files = part_files(store, table) if files is None else files
    if not files:
        typed = [f'CAST(NULL AS {duckdb_type(kind)}) AS "{name}"' for name, kind in
                 columns + extra]
        return f"SELECT {', '.join(typed)} WHERE false"
    hive_types = ", ".join(f"'{name}': 'INTEGER'" for name, _ in extra)
    select = [f'CAST("{name}" AS {duckdb_type(kind)}) AS "{name}"' for name, kind in columns]
    select += [f'"{name}"' for name, _ in extra]
    listed = ", ".join(quote(literal_path(f)) for f in files)
    return (f"SELECT {', '.join(select)} FROM read_parquet([{listed}], "
            f"hive_partitioning = true, hive_types = {{{hive_types}}}, union_by_name = true)")


def connect(store: Union[str, "os.PathLike[str]"], *,
            memory_limit: Union[str, int, None] = None, allow_files: bool = False):
    """A DuckDB connection (in memory) with the views of ``store`` (see the module doc).

    ``memory_limit`` (DuckDB's setting, e.g. ``"1GB"``, or bytes) bounds the memory
    the queries take; DuckDB spills to disk beyond it. Each file's footer is checked
    before a row is read: its rows within the bounds, and as the window's sessions
    row records them (``opscope.store.parts``). The SQL reads only the
    store's files: no other file, no network, and no setting can be changed
    (``opscope.store.sandbox``); ``allow_files=True`` lets it read and write the
    files the user can (``read_csv``, ``COPY ... TO``, ``ATTACH``). Raises
    StoreError naming the path when it is not a store, and StoreError saying
    ``pip install 'opscope[store]'`` when duckdb is missing.
    """
    duckdb = require_duckdb()
    path = os.path.abspath(check_store_folder(os.fspath(store), create=False))
    if not os.access(path, os.R_OK | os.X_OK):
        raise StoreError(f"store {os.fspath(store)!r}: permission denied")
    con = duckdb.connect(":memory:", config=dict(CONNECT_CONFIG))
    try:
        _set_memory_limit(con, memory_limit)
        files = {t: part_files(path, t) for t in COLUMNS}
        _check_store_footers(con, path, files, os.fspath(store))
        views = [(t, table_sql(path, t, files[t])) for t in COLUMNS]
        for name, sql in views + list(DERIVED_VIEWS.items()):
            _create_view(con, name, sql, store)
        lock_down(con, [f for t in COLUMNS for f in files[t]], os.fspath(store),
                  allow_files=allow_files)
    except BaseException:
        con.close()
        raise
    return con


def _check_store_footers(con, path: str, files: Dict[str, List[str]], store: str) -> None:
    """Before DuckDB reads a row: every file's footer within the bounds (``_check_footers``),
    and each window's files as its sessions row records them (``opscope.store.parts``)."""
    limit = max_part_rows()
    _check_footers(con, files["sessions"], limit, "sessions", store)
    recorded = _recorded(con, path, files["sessions"], store)
    present = set()
    for table in COLUMNS:
        if table != "sessions":
            present |= _check_footers(con, files[table], limit, table, store, recorded)
    for folder, (where, table, figures) in recorded.items():  # a recorded file not there
        if folder not in present:
            check_recorded(where, table, os.path.join(folder, PART_FILE), None, figures)


def _check_footers(con, files: List[str], limit: int, table: str, store: str,
                   recorded: Optional[Dict[str, tuple]] = None) -> Set[str]:
    """The rows each file's footer declares (DuckDB's ``parquet_file_metadata``) must be
    its row groups' sum and at most ``limit`` (``folder.read_footer`` says the same for
    pyarrow), and each partition's files together agree with ``recorded`` (folder ->
    (where, table, Footer)); StoreError naming the file. Returns the partitions' folders."""
    partitions: Dict[str, list] = {}
    for name, groups, footer in file_footers(con, files, store, table):
        check_rows(store, name, footer.rows, groups, limit)
        partitions.setdefault(os.path.dirname(name), []).append((name, footer))
    for folder, found in partitions.items():
        part = partition_of(store, sorted(found, key=lambda f: _part_number(f[0])), limit)
        if recorded and folder in recorded:
            where, _, figures = recorded[folder]
            check_recorded(where, table, part.name, part.footer, figures)
    return set(partitions)


def _part_number(path: str) -> int:
    """K of a ``part-K.parquet`` file."""
    return int(os.path.basename(path)[len("part-"):-len(".parquet")])


def file_footers(con, files: List[str], store: str, table: str
                 ) -> List[Tuple[str, int, Footer]]:
    """(path, rows of its row groups, Footer) of each of ``files`` (``table``'s), from
    DuckDB's ``parquet_metadata``: no row is read."""
    if not files:
        return []
    listed = ", ".join(quote(literal_path(f)) for f in files)
    rows = _fetch(con, store, table,
                  f"SELECT f.file_name, f.num_rows, coalesce(g.n, 0), coalesce(g.b, 0) FROM "
                  f"parquet_file_metadata([{listed}]) f LEFT JOIN (SELECT file_name, sum(n) AS "
                  f"n, sum(b) AS b FROM (SELECT file_name, row_group_id, any_value("
                  f"row_group_num_rows) AS n, greatest(0, any_value(row_group_bytes)) AS b FROM "
                  f"parquet_metadata([{listed}]) GROUP BY ALL) GROUP BY ALL) g USING (file_name)")
    return [(name, int(groups), Footer(int(declared), int(nbytes)))
            for name, declared, groups, nbytes in rows]


def _recorded(con, path: str, sessions: List[str], store: str) -> Dict[str, tuple]:
    """Path -> (where, table, Footer) of each file that a window's sessions row records
    (``extras.parts``); an ``extras`` that is not JSON records nothing here."""
    if not sessions:
        return {}
    parts = ("CASE WHEN json_valid(extras) THEN CAST(json_extract(extras, '$.parts') "
             "AS VARCHAR) END")
    rows = _fetch(con, store, "sessions", f"SELECT rank, \"window\", {parts} FROM "
                                          f"({table_sql(path, 'sessions', sessions)})")
    out = {}
    for rank, window, text in rows:
        where = f"store {store!r}, rank {rank}, window {window}"
        try:
            doc = load_json(text) if text else None
        except ValueError:
            doc = None
        for table, figures in recorded_parts(doc, where).items():
            out[partition_dir(path, table, rank, window)] = (where, table, figures)
    return out


def _fetch(con, store: str, table: str, sql: str) -> list:
    """The rows of ``sql``, which reads ``table``'s files; StoreError when DuckDB cannot."""
    try:
        return con.execute(sql).fetchall()
    except sys.modules["duckdb"].Error as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise StoreError(f"store {store!r}: cannot read its {table!r} table ({first})") \
            from None


def _set_memory_limit(con, memory_limit: Union[str, int, None]) -> None:
    if memory_limit is None:
        return
    text = f"{memory_limit}B" if isinstance(memory_limit, int) else str(memory_limit)
    try:
        con.execute(f"SET memory_limit = {quote(text)}")
    except sys.modules["duckdb"].Error:
        raise StoreError(f"memory_limit {memory_limit!r} is not a size DuckDB takes "
                         f"(e.g. '1GB', '500MB')") from None


def _create_view(con, name: str, sql: str, store) -> None:
    try:
        con.execute(f'CREATE VIEW "{name}" AS {sql}')
    except sys.modules["duckdb"].Error as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise StoreError(f"store {os.fspath(store)!r}: cannot read its {name!r} "
                         f"table ({first})") from None


def _views_doc() -> str:
    """The module doc's part on the views, and the example queries, for ``connect``'s doc."""
    from opscope.store.examples import EXAMPLE_QUERIES

    doc = __doc__ or ""
    views = doc[doc.find("Every table"):doc.find("Example (a store")].rstrip()
    examples = "\n\n".join(f"{name.capitalize()}::\n\n" + "\n".join(
        "    " + line for line in sql.splitlines()) for name, sql in EXAMPLE_QUERIES.items())
    return f"\n    The views\n    ---------\n\n{_indent(views)}\n\n    Examples\n    " \
           f"--------\n\n{_indent(examples)}\n"


def _indent(text: str) -> str:
    return "\n".join(("    " + line).rstrip() for line in text.splitlines())


connect.__doc__ = (connect.__doc__ or "") + _views_doc()
