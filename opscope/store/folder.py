"""A store folder on disk: is it a store, its partitions, one partition's files.

Everything that opens a store checks it here first: a symlink, a file, or a
folder without the marker (``opscope-store.json``) is refused with a
:class:`StoreError` naming the path. A folder holding only table folders is a
store that a writer (another rank) is writing now; a writer may open it.

Example::

    >>> import tempfile
    >>> check_store_folder(tempfile.mkdtemp(), create=True) != ""
    True
    >>> check_store_folder("/no/such/store", create=False)
    Traceback (most recent call last):
    ...
    opscope.store.schema.StoreError: store '/no/such/store': no such folder
"""

from __future__ import annotations

import os
import stat
from typing import List, NamedTuple, Optional, Tuple

from opscope.store.schema import (FORMAT, MARKER, MAX_PARTS, READ_VERSIONS, TABLES, VERSION,
                                  StoreError, load_json, part_path, require_pyarrow)

LOCK_PREFIX = ".opscope-write-rank"  # + "<R>.lock": a rank's write lock (write.rank_lock)


def check_store_folder(path: str, *, create: bool) -> str:
    """``path`` as a str after checking it is a store (or, with ``create``, may become one).

    A symlink, a non-folder, or a non-empty folder without the marker is
    refused with a StoreError naming the path.
    """
    path = os.fspath(path)
    if os.path.islink(path):
        raise StoreError(f"store {path!r} is a symlink; expected a folder")
    if not os.path.lexists(path):
        if create:
            return path
        raise StoreError(f"store {path!r}: no such folder")
    if not stat.S_ISDIR(os.lstat(path).st_mode):
        raise StoreError(f"{path!r} is not an opscope store (not a folder)")
    marker = os.path.join(path, MARKER)
    if os.path.lexists(marker):
        read_marker(path)
    elif not create or not _being_written(path):
        raise StoreError(f"{path!r} is not an opscope store (no {MARKER} in it)")
    return path


def _being_written(path: str) -> bool:
    """True for an empty folder, or one holding only table folders and temp files: a
    store another process (a rank) is writing right now, before its marker."""
    for name in os.listdir(path):
        if name.startswith((".marker-", LOCK_PREFIX)) or (
                name in TABLES and not os.path.islink(os.path.join(path, name))):
            continue
        return False
    return True


def read_marker(path: str) -> dict:
    """The store's marker, checked; StoreError naming the store when it is not one."""
    marker = os.path.join(path, MARKER)
    try:
        if not stat.S_ISREG(os.lstat(marker).st_mode):
            raise ValueError("not a regular file")
        with open(marker, encoding="utf-8") as f:
            doc = load_json(f.read(1 << 16))
    except (OSError, ValueError) as exc:
        raise StoreError(f"{path!r} is not an opscope store ({MARKER}: {exc})") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise StoreError(f"{path!r} is not an opscope store ({MARKER} names no {FORMAT!r})")
    if doc.get("version") not in READ_VERSIONS:
        raise StoreError(f"store {path!r} has version {doc.get('version')!r}; this opscope "
                         f"reads versions {READ_VERSIONS[0]} to {VERSION}")
    return doc


# a partition file may declare a row per ROW_BYTES of the trace-size limit
# (OPSCOPE_MAX_TRACE_BYTES, else 4 GiB: 16.7M rows), as a trace of that size would give
ROW_BYTES = 256


def max_part_rows() -> int:
    """The most rows a partition file may declare (``OPSCOPE_MAX_TRACE_BYTES // ROW_BYTES``)."""
    from opscope.load.trace_size import default_max_bytes

    try:
        return max(1, default_max_bytes() // ROW_BYTES)
    except ValueError as exc:  # a bad OPSCOPE_MAX_TRACE_BYTES
        raise StoreError(str(exc)) from None


class Footer(NamedTuple):
    """What a Parquet file's footer declares: its rows, and their uncompressed bytes (the
    row groups' ``total_byte_size``: encoded, before compression)."""

    rows: int
    bytes: int


def footer_sum(footers) -> Footer:
    """The Footer of several files together: their rows and their bytes summed.

    >>> footer_sum([Footer(3, 100), Footer(2, 50)])
    Footer(rows=5, bytes=150)
    """
    footers = list(footers)
    return Footer(sum(f.rows for f in footers), sum(f.bytes for f in footers))


def footer_of(meta) -> Footer:
    """The Footer of a pyarrow ``FileMetaData``: its rows and its row groups' bytes."""
    groups = [meta.row_group(i) for i in range(meta.num_row_groups)]
    return Footer(meta.num_rows, sum(max(0, g.total_byte_size) for g in groups))


def read_footer(store: str, path: str, max_rows: Optional[int] = None) -> Footer:
    """The rows and bytes ``path``'s Parquet footer declares, checked before anything is
    read: its count must be its row groups' sum and at most ``max_rows`` (default:
    ``max_part_rows()``); else StoreError naming the file (a "row bomb": a few MB that
    declare tens of millions of rows)."""
    _, pq = require_pyarrow()
    try:
        meta = pq.read_metadata(path)
        groups = sum(meta.row_group(i).num_rows for i in range(meta.num_row_groups))
        footer = footer_of(meta)
    except Exception as exc:  # pyarrow raises ArrowInvalid, OSError, ...
        raise StoreError(f"store {store!r}: cannot read {path!r} ({exc})") from None
    check_rows(store, path, footer.rows, groups,
               max_part_rows() if max_rows is None else max_rows)
    return footer


def check_rows(store: str, path: str, declared: int, groups: int, limit: int) -> None:
    """StoreError naming ``path`` unless the rows its footer declares are its row groups'
    sum (``groups``) and at most ``limit``."""
    if declared < 0 or declared != groups:
        raise StoreError(f"store {store!r}: {path!r} declares {declared:,} rows but its row "
                         f"groups hold {groups:,}")
    if declared > limit:
        raise StoreError(f"store {store!r}: {path!r} declares {declared:,} rows, more than "
                         f"the {limit:,} a window may hold (raise OPSCOPE_MAX_TRACE_BYTES to "
                         f"read it)")


def read_part(store: str, table: str, rank: int, window: Optional[int] = None):
    """The pyarrow table of one partition (its files' rows, in order), or None when it has
    no file.

    A symlink or non-regular file there is refused (StoreError naming it), and so is
    a file whose footer declares too many rows (``read_footer``).
    """
    found = part_footer(store, table, rank, window)
    return None if found is None else read_files(store, found.files)


class Partition(NamedTuple):
    """One partition's files (``part-0.parquet``, ...) and their footers' sum; ``name``
    names it in messages: its one file, else its folder."""

    name: str
    footer: Footer
    files: List[str]


def partition_files(store: str, table: str, rank: int, window: Optional[int] = None
                    ) -> List[str]:
    """The files of one partition, in row order: ``part-0.parquet``, ``part-1.parquet``,
    ... up to the first one missing (``MAX_PARTS`` at most); a symlink or non-regular
    file there is refused (StoreError naming it)."""
    out = []
    for part in range(MAX_PARTS):
        path = part_path(store, table, rank, window, part)
        if not regular_file_inside(store, path):
            break
        out.append(path)
    return out


def partition_of(store: str, found: List[Tuple[str, Footer]], limit: int) -> Partition:
    """The Partition of files ``found`` ((path, footer) each, in order): together they
    may hold at most ``limit`` rows, as one file may (StoreError naming the folder)."""
    footer = footer_sum(f for _, f in found)
    files = [path for path, _ in found]
    name = files[0] if len(files) == 1 else os.path.dirname(files[0]) + os.sep
    if len(files) > 1:
        check_rows(store, name, footer.rows, footer.rows, limit)
    return Partition(name, footer, files)


def part_footer(store: str, table: str, rank: int, window: Optional[int] = None
                ) -> Optional[Partition]:
    """The Partition of one partition, each file's footer checked, or None when it has no
    file; a symlink or non-regular file there is refused (StoreError naming it)."""
    limit = max_part_rows()
    files = partition_files(store, table, rank, window)
    if not files:
        return None
    return partition_of(store, [(path, read_footer(store, path, limit)) for path in files],
                        limit)


def read_files(store: str, paths: List[str]):
    """The pyarrow table of the Parquet files ``paths`` (footers checked already), their
    rows one file after the other."""
    tables = [read_rows(store, path) for path in paths]
    if len(tables) == 1:
        return tables[0]
    pa, _ = require_pyarrow()
    return pa.concat_tables(tables)


def read_rows(store: str, path: str):
    """The pyarrow table of the Parquet file ``path`` (its footer checked already). One
    file, read as one: ``pq.read_table`` would import pyarrow's dataset layer and pandas
    (about a second of CPU) to read it."""
    _, pq = require_pyarrow()
    try:
        with pq.ParquetFile(path) as part:
            return part.read()
    except Exception as exc:  # pyarrow raises ArrowInvalid, OSError, ...
        raise StoreError(f"store {store!r}: cannot read {path!r} ({exc})") from None


def regular_file_inside(store: str, path: str) -> bool:
    """True when ``path`` (under ``store``) is a regular file reached without a symlink;
    False when it does not exist. A symlink or a non-regular file on the way raises
    StoreError naming it: a store may be someone else's, and its links are not followed."""
    current = store
    for part in os.path.relpath(path, store).split(os.sep):
        current = os.path.join(current, part)
        try:
            mode = os.lstat(current).st_mode
        except FileNotFoundError:
            return False
        if stat.S_ISLNK(mode):
            raise StoreError(f"store {store!r}: {current!r} is a symlink; not following it")
    if not stat.S_ISREG(mode):
        raise StoreError(f"store {store!r}: {path!r} is not a regular file")
    return True


def partition_values(folder: str, key: str) -> List[int]:
    """The numbers N of the ``key=N`` sub-folders of ``folder`` (not symlinks), sorted."""
    if not os.path.isdir(folder) or os.path.islink(folder):
        return []
    out = []
    for name in os.listdir(folder):
        k, _, value = name.partition("=")
        if k == key and value.lstrip("-").isdigit() and value == str(int(value)) \
                and not os.path.islink(os.path.join(folder, name)):
            out.append(int(value))
    return sorted(out)
