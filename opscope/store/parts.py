"""A window's partition files as its ``sessions`` row records them, and their footers checked.

When a window is written, its ``sessions`` row records in ``extras.parts`` the rows
and the uncompressed bytes (Parquet's, as the file's footer declares them) of each
of its partition files: ``{"events": [ROWS, BYTES], "inputs": ...}``. Before a
reader reads a file's rows, it compares the file's footer with that record
(:func:`check_recorded`): the rows must be the recorded ones, and the bytes at most
``SIZE_SLACK`` times the recorded ones plus ``SIZE_SLACK_BYTES`` (the same rows
written again in other row groups encode in a few more bytes). A file replaced by
another one, or a window half rewritten, is then refused with a StoreError naming
the file and both figures. A window written before opscope recorded them has no
``parts``: its files are checked against the bounds only (``folder.check_rows``).

Example::

    >>> parts = recorded_parts({"events": [3, 120], "later_table": [1, 2]}, "w")
    >>> parts
    {'events': Footer(rows=3, bytes=120)}
    >>> check_recorded("store 's', rank 0, window 0", "events", "e.parquet",
    ...                Footer(3, 140), parts["events"])
    >>> check_recorded("store 's', rank 0, window 0", "events", "e.parquet",
    ...                Footer(100_000, 140), parts["events"])
    Traceback (most recent call last):
    ...
    opscope.store.schema.StoreError: store 's', rank 0, window 0: malformed events file 'e.parquet': its footer declares 100,000 rows; the window's sessions row records 3
"""

from __future__ import annotations

from typing import Any, Dict, Optional

from opscope.store.folder import Footer
from opscope.store.schema import WINDOW_TABLES, StoreError

# the tables whose files a sessions row records: every per-window table but itself
RECORDED_TABLES = tuple(t for t in WINDOW_TABLES if t != "sessions")
SIZE_SLACK = 2
SIZE_SLACK_BYTES = 1 << 20


def parts_doc(parts: Dict[str, Footer]) -> Dict[str, list]:
    """``extras.parts`` of a window whose files were written with these footers."""
    return {table: [int(f.rows), int(f.bytes)] for table, f in parts.items()}


def recorded_parts(value: Any, where: str) -> Dict[str, Footer]:
    """The footers ``extras.parts`` records (``{}`` when it records none: an older store);
    StoreError naming ``where`` when malformed. Tables this opscope does not know are left
    out (a newer writer may record more)."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise StoreError(f"{where}: malformed sessions.extras.parts (not an object)")
    out = {}
    for table, figures in value.items():
        if table not in RECORDED_TABLES:
            continue
        if not (isinstance(figures, list) and len(figures) == 2
                and all(type(v) is int and v >= 0 for v in figures)):
            raise StoreError(f"{where}: malformed sessions.extras.parts.{table} (expected "
                             f"[rows, bytes])")
        out[table] = Footer(*figures)
    return out


def check_recorded(where: str, table: str, path: str, footer: Optional[Footer],
                   recorded: Footer) -> None:
    """StoreError naming ``path`` unless its ``footer`` (None: the file is missing) agrees
    with what the window's sessions row ``recorded``."""
    if footer is None:
        if recorded.rows:
            raise StoreError(f"{where}: its {table} file {path!r} is missing; the window's "
                             f"sessions row records {recorded.rows:,} rows")
        return
    if footer.rows != recorded.rows:
        raise StoreError(f"{where}: malformed {table} file {path!r}: its footer declares "
                         f"{footer.rows:,} rows; the window's sessions row records "
                         f"{recorded.rows:,}")
    if footer.bytes > SIZE_SLACK * recorded.bytes + SIZE_SLACK_BYTES:
        raise StoreError(f"{where}: malformed {table} file {path!r}: its footer declares "
                         f"{footer.bytes:,} bytes of rows; the window's sessions row records "
                         f"{recorded.bytes:,} (at most {SIZE_SLACK}x that + 1 MiB is read)")
