"""Write one partition's Parquet files, each atomically, several at once.

``parquet_part`` gives a ``ParquetWriter`` onto a temp file in the partition's
folder, renamed onto its place when the block ends without error.
``write_files`` writes a partition as one or more files (``part-0.parquet``,
``part-1.parquet``, ...): the tables of each are made in turn, one for each
file, and each file is Parquet-encoded on a thread of its own (the encoding
releases the GIL), so that a window's events are encoded on two cores. Files
of a partition written before with more parts than now are removed.

Example::

    >>> import os, tempfile
    >>> from opscope.store.tables import arrow_table
    >>> store = tempfile.mkdtemp()
    >>> stacks = [arrow_table("stacks", {"stack_id": [k], "frames": [["f"]]})
    ...           for k in range(3)]
    >>> written = []
    >>> write_files(store, "stacks", 0, 1, [stacks[:2], stacks[2:]], written)
    >>> sorted(os.listdir(os.path.join(store, "stacks", "rank=0", "window=1")))
    ['part-0.parquet', 'part-1.parquet']
    >>> [footer.rows for footer in written]
    [2, 1]
    >>> write_files(store, "stacks", 0, 1, [stacks], [])
    >>> sorted(os.listdir(os.path.join(store, "stacks", "rank=0", "window=1")))
    ['part-0.parquet']
"""

from __future__ import annotations

import os
import tempfile
from contextlib import ExitStack, contextmanager
from typing import Any, Iterator, List, Optional

from opscope.files.background import Background
from opscope.store.folder import Footer, footer_of
from opscope.store.schema import (MAX_PARTS, StoreError, arrow_schema, parquet_options,
                                  part_path, require_pyarrow)


def _make_dirs(store: str, folder: str) -> None:
    """Create ``folder`` under ``store``, refusing any symlink on the way."""
    rel = os.path.relpath(folder, store)
    current = store
    for part in rel.split(os.sep):
        current = os.path.join(current, part)
        if os.path.islink(current):
            raise StoreError(f"store {store!r}: {current!r} is a symlink; refusing to write")
        if not os.path.isdir(current):
            try:
                os.mkdir(current)
            except FileExistsError:  # another rank made it first
                if os.path.islink(current) or not os.path.isdir(current):
                    raise StoreError(f"store {store!r}: {current!r} is not a folder") from None


@contextmanager
def parquet_part(store: str, table: str, path: str,
                 written: Optional[List[Footer]] = None) -> Iterator[Any]:
    """A ``pyarrow.parquet.ParquetWriter`` (``table``'s schema and encodings:
    ``schema.parquet_options``) onto ``path`` inside
    ``store``: written under a temp name in the same folder and renamed onto ``path`` when
    the block ends without error (removed when it raises). Write it batch by batch
    (``write_table``/``write_batch``) to keep memory flat. ``written`` gets the file's
    footer (rows and uncompressed bytes) appended, from the writer's own metadata."""
    _, pq = require_pyarrow()
    collected: List[Any] = []
    folder = os.path.dirname(path)
    _make_dirs(store, folder)
    if os.path.islink(path):
        raise StoreError(f"store {store!r}: {path!r} is a symlink; refusing to replace it")
    fd, tmp = tempfile.mkstemp(prefix=".part-", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "wb") as f:
            writer = pq.ParquetWriter(f, arrow_schema(table), metadata_collector=collected,
                                      **parquet_options(table))
            try:
                yield writer
                writer.close()  # the footer: the disk may fill here too
            except BaseException:
                _abandon(writer)
                raise
        os.replace(tmp, path)
        if written is not None:
            written += [footer_of(meta) for meta in collected]
    except BaseException:
        if os.path.lexists(tmp):
            os.unlink(tmp)
        raise


def _abandon(writer: Any) -> None:
    """Close a ParquetWriter whose file is being removed (its error, a full disk, is the
    one already raised), and mark it closed: else its ``__del__`` closes it again and
    prints a traceback ("file metadata is only available after writer close")."""
    try:
        writer.close()
    except Exception:  # the write failed already; that error is the one raised
        pass
    writer.is_open = False


def write_files(store: str, table: str, rank: int, window: Optional[int], files: List[Any],
                written: List[Footer]) -> None:
    """Write the partition (``rank``, ``window``) of ``table`` as ``len(files)`` files
    (``MAX_PARTS`` at most), each from a pyarrow table or an iterable of them; ``written``
    gets each file's footer, in file order. Files of the partition past these are removed
    once these are in place."""
    if not 1 <= len(files) <= MAX_PARTS:
        raise ValueError(f"write_files: expected 1 to {MAX_PARTS} files, got {len(files)}")
    footers: List[List[Footer]] = [[] for _ in files]
    with ExitStack() as stack:
        writers = [stack.enter_context(parquet_part(
            store, table, part_path(store, table, rank, window, k), footers[k]))
            for k in range(len(files))]
        if len(files) == 1 and hasattr(files[0], "schema"):
            writers[0].write_table(files[0])  # one table: nothing to overlap
        else:
            _encode_at_once(writers, files)
    written += [footer for got in footers for footer in got]
    for k in range(len(files), MAX_PARTS):  # a partition written before with more files
        stale = part_path(store, table, rank, window, k)
        if not os.path.lexists(stale):
            break
        if os.path.islink(stale) or not os.path.isfile(stale):
            raise StoreError(f"store {store!r}: {stale!r} is not a regular file; "
                             f"refusing to remove it")
        os.unlink(stale)


def _encode_at_once(writers: List[Any], files: List[Any]) -> None:
    """Make each file's tables in turn, one for each file, and hand each to its file's
    writer on a thread of its own; every thread is finished, and its first error raised."""
    works = [Background(writer.write_table, name="opscope-parquet") for writer in writers]
    failed: Optional[BaseException] = None
    try:
        feeds = [(work, iter([tables] if hasattr(tables, "schema") else tables))
                 for work, tables in zip(works, files)]
        while feeds:
            for fed in list(feeds):
                work, tables = fed
                part = next(tables, None)
                if part is None:
                    feeds.remove(fed)
                else:
                    work.put(part)
    finally:
        for work in works:
            try:
                work.finish()
            except BaseException as exc:  # raised once every thread has ended
                failed = failed or exc
    if failed is not None:
        raise failed
