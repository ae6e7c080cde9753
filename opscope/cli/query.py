"""``opscope query STORE "SQL" [--format table|csv|json]``: SQL over an opscope store.

The store's views (``events``, ``ops``, ``steps``, ``collective_ranks`` ...,
documented in ``opscope.store.connect`` and docs/store.md) are defined in an
in-memory DuckDB connection; the query's rows are printed as an aligned table,
CSV, or JSON (a list of row objects). A missing store, a path that is not a
store, or bad SQL exits with status 2 and one line. The SQL reads only the
store (no other file, no network, no ``SET``); ``--allow-files`` lets it read
and write the files the user can.

Example::

    $ opscope query out/store "SELECT name, sum(self_ns) AS self_ns FROM events
                               GROUP BY name ORDER BY self_ns DESC LIMIT 20"
    $ opscope query out/store "SELECT * FROM steps" --format csv > steps.csv
"""

from __future__ import annotations

import argparse
import sys
from typing import Iterator, List

from opscope.cli.errors import UsageError
from opscope.cli.options import add_memory_limit

SUMMARY = "run SQL over an opscope store (DuckDB) and print a table, CSV or JSON"
DESCRIPTION = """\
Run SQL over the opscope store STORE (written by prof.export_store,
opscope.store_handler or opscope convert) with DuckDB. The views are events,
inputs, stacks, memory, sessions, collectives, ops, steps and collective_ranks;
each has rank and "window" columns (quote "window": it is an SQL keyword).
Times are aligned Unix ns. The SQL sees only the store's files and never the
network; --allow-files lets it read and write the files you can."""
BATCH_ROWS = 10_000


class _SafeOut:
    """stdout, with control characters escaped and unencodable characters replaced."""

    def write(self, text: str) -> None:
        from opscope.cli.terminal import terminal_safe

        safe = terminal_safe(text)
        encoding = getattr(sys.stdout, "encoding", None)
        if encoding:
            safe = safe.encode(encoding, "backslashreplace").decode(encoding)
        sys.stdout.write(safe)


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register the ``query`` verb."""
    from opscope.store.results import FORMATS

    parser = subparsers.add_parser("query", help=SUMMARY, description=DESCRIPTION,
                                   allow_abbrev=False)
    parser.add_argument("store", metavar="STORE", help="an opscope store folder")
    parser.add_argument("sql", metavar="SQL", help="the query (DuckDB's SQL)")
    parser.add_argument("--format", choices=FORMATS, default="table",
                        help="output: an aligned table (default), CSV, or JSON rows")
    add_memory_limit(parser, "DuckDB's memory limit, e.g. 500MB or 2GB (it spills to disk "
                             "beyond it; default: DuckDB's, 80%% of this machine's memory)")
    parser.add_argument("--allow-files", action="store_true",
                        help="let the SQL read and write the files you can (read_csv, "
                             "COPY ... TO, ATTACH); by default it sees only the store")
    parser.set_defaults(handler=main)


def _batches(cursor) -> Iterator[List[tuple]]:
    while True:
        rows = cursor.fetchmany(BATCH_ROWS)
        if not rows:
            return
        yield rows


def main(args: argparse.Namespace) -> int:
    """Connect, run the SQL, print its rows; return 0."""
    from opscope.store import StoreError, connect
    from opscope.store.results import write_result

    try:
        con = connect(args.store, memory_limit=args.memory_limit,
                      allow_files=args.allow_files)
    except StoreError as exc:
        raise UsageError(str(exc)) from None
    duckdb = sys.modules["duckdb"]
    try:
        cursor = con.execute(args.sql)
        if cursor.description is None:
            return 0  # a statement without rows
        columns = [d[0] for d in cursor.description]
        write_result(columns, _batches(cursor), args.format, _SafeOut())
    except duckdb.Error as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise UsageError(f"query failed: {first}") from None
    finally:
        con.close()
    return 0
