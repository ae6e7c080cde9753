"""Write an opscope store: one window of one rank at a time, each file atomically.

``StoreWriter(path)`` creates the store folder or opens an existing store (a
symlink, a file, or a non-empty folder that is not a store is refused with a
:class:`StoreError` naming it). ``write_window(session, ...)`` writes the five
per-window tables of one session; ``write_collectives(rank, facts)`` the
rank's collectives, keyed as ``opscope.analysis.ranks.collective_keys`` keys them;
``close()`` writes the collectives still pending and then the marker file,
last. A writer that streams a big window writes each table itself, batch by
batch, with ``part_writer(table, rank, window)``. Every Parquet file is written under a temp name in its own folder and
renamed onto its place, so a reader never sees half a file and a window
written again replaces the old one. Writers of one rank take turns
(:func:`rank_lock`), so two processes appending to one store lose no window.

Example::

    >>> import os, tempfile
    >>> from opscope.analysis.build import build_session
    >>> from opscope.model.records import RawSession
    >>> path = os.path.join(tempfile.mkdtemp(), "store")
    >>> with StoreWriter(path) as writer:
    ...     writer.write_window(build_session(RawSession.empty()))
    0
    >>> sorted(os.listdir(path))[:3]
    ['collectives', 'device', 'events']
    >>> StoreWriter(path).next_window(0)
    1
"""

from __future__ import annotations

import json
import os
import stat
import tempfile
from contextlib import contextmanager
from typing import Any, Dict, Iterator, List, Optional, Tuple

from opscope.analysis.ranks.collective_keys import collective_sequences
from opscope.analysis.collectives import CollectiveCall
from opscope.analysis.ranks.facts import RankFacts, rank_facts, session_rank
from opscope.analysis.ranks.facts import clock_offset_ns as session_clock_offset
from opscope.analysis.facts import step_ranges
from opscope.model.session import ProfileSession
from opscope.model.torch_names import PROFILER_STEP_PREFIX
from opscope.store.folder import (LOCK_PREFIX, Footer, check_store_folder, footer_sum,
                                  partition_values)
from opscope.store.part_write import parquet_part, write_files
from opscope.store.read import sessions_of_rank, stored_calls
from opscope.model.collective_facts import ranks_text
from opscope.store.schema import (COLUMNS, FORMAT, MARKER, TABLES, VERSION, StoreError,
                                  load_json, part_path, require_pyarrow)
from opscope.store.tables import arrow_table, sessions_table, window_parts


@contextmanager
def rank_lock(store: str, rank: int) -> Iterator[None]:
    """Hold the write lock of ``rank``'s partitions of ``store`` (``fcntl.flock`` on
    ``STORE/.opscope-write-rank<R>.lock``), waiting for another writer to finish.

    The lock file is ours: created mode 600, never through a symlink; one that is not a
    regular file of this user is refused (StoreError). It is removed when released (a
    writer that waited on a removed one takes the lock again on the new file), so no
    file is left behind. Without fcntl (not POSIX), no lock.
    """
    try:
        import fcntl
    except ImportError:
        yield
        return
    path = os.path.join(store, f"{LOCK_PREFIX}{int(rank)}.lock")
    while True:
        fd = _open_lock(store, path)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            if _same_file(fd, path):
                break
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)  # released and removed while we waited: lock the new one
    try:
        yield
    finally:
        try:
            os.unlink(path)
        except OSError:
            pass
        os.close(fd)  # releases the lock


def _open_lock(store: str, path: str) -> int:
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        raise StoreError(f"store {store!r}: cannot open its lock {path!r} "
                         f"({exc.strerror or exc})") from None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode) or info.st_uid != os.getuid():
        os.close(fd)
        raise StoreError(f"store {store!r}: its lock {path!r} is not a file of this user; "
                         f"refusing to write")
    return fd


def _same_file(fd: int, path: str) -> bool:
    """Whether ``path`` still names the file open as ``fd``."""
    try:
        now, mine = os.lstat(path), os.fstat(fd)
    except OSError:
        return False
    return (now.st_dev, now.st_ino) == (mine.st_dev, mine.st_ino)


def window_numbers(store: str, rank: int) -> List[int]:
    """The windows of ``rank`` that have a sessions partition, sorted."""
    return partition_values(os.path.join(store, "sessions", f"rank={int(rank)}"), "window")


class StoreWriter:
    """Writes windows and collectives into the store at ``path`` (see the module doc)."""

    def __init__(self, path: "str | os.PathLike[str]"):
        require_pyarrow()
        self.path = check_store_folder(os.fspath(path), create=True)
        if not os.path.isdir(self.path):
            try:
                os.makedirs(self.path, exist_ok=True)
            except OSError as exc:
                raise StoreError(f"cannot create store {self.path!r}: "
                                 f"{exc.strerror or exc}") from None
        # rank -> [(window, calls of that window)] not yet in its collectives file
        self._pending: Dict[int, List[Tuple[int, List[CollectiveCall]]]] = {}
        self._written: Dict[int, set] = {}  # rank -> the windows this writer wrote
        # (table, rank, window) -> the footer of the file write_part wrote there last
        self._footers: Dict[Tuple[str, int, Optional[int]], Footer] = {}

    def __enter__(self) -> "StoreWriter":
        return self

    def __exit__(self, kind, value, tb) -> None:
        if kind is None:
            self.close()

    def next_window(self, rank: int) -> int:
        """The window number after the last one ``rank`` has (0 for a new rank)."""
        done = window_numbers(self.path, rank) + [w for w, _ in self._pending.get(rank, [])]
        return max(done) + 1 if done else 0

    def part_writer(self, table: str, rank: int, window: Optional[int] = None,
                    written: Optional[List[Footer]] = None):
        """A context manager giving a ParquetWriter for one partition of ``table``, to write
        a big window batch by batch (see :func:`parquet_part`); ``window`` is None for a
        per-rank table (collectives). The file appears, whole, when the block ends."""
        return parquet_part(self.path, table, part_path(self.path, table, rank, window),
                            written)

    def write_part(self, table: str, data, rank: int, window: Optional[int] = None) -> None:
        """Write the pyarrow table ``data`` as one partition of ``table`` (its schema:
        ``opscope.store.schema.arrow_schema(table)``; build it with
        ``opscope.store.tables.arrow_table``), or a list or iterator of such tables one
        after the other (memory stays that of one)."""
        self.write_files(table, [data], rank, window)

    def write_files(self, table: str, files: List[Any], rank: int,
                    window: Optional[int] = None) -> None:
        """Write one partition of ``table`` as the files ``files`` (each as ``write_part``'s
        ``data``), all at once (``part_write.write_files``). Their footers' sum is kept
        for the window's sessions row (``_footers``)."""
        written: List[Footer] = []
        write_files(self.path, table, rank, window, files, written)
        self._footers[(table, rank, window)] = footer_sum(written)

    def write_window(self, session: ProfileSession, *, rank: Optional[int] = None,
                     window: Optional[int] = None, window_name: Optional[str] = None,
                     facts: Optional[RankFacts] = None,
                     clock_offset_ns: Optional[int] = None, once: bool = False) -> int:
        """Write one session as window ``window`` of ``rank``; returns the window number.

        ``once``: a session ``rank`` already holds (the same process, start and stop:
        ``prof.export_store`` after ``store_handler`` wrote it) is not written again;
        its window number is returned.

        ``rank`` defaults to ``distributedInfo.rank`` of the metadata, else 0;
        ``window`` to the next free one; ``window_name`` to the source file's
        name, else ``window<W>``; ``clock_offset_ns`` to the session's
        ``opscopeClockOffsetNs``; ``facts`` (this window's RankFacts) to the
        ones ``ranks.facts.rank_facts`` computes.
        """
        if rank is None:
            rank = session_rank(session, "")
            rank = 0 if rank is None else rank
        if clock_offset_ns is None:
            clock_offset_ns = session_clock_offset(session)
        with rank_lock(self.path, rank):  # another process may append to this rank too
            if once and window is None:
                held = self.window_holding(session, rank, clock_offset_ns)
                if held is not None:
                    return held
            window = self.next_window(rank) if window is None else int(window)
            return self._write_window(session, rank, window, window_name, facts,
                                      clock_offset_ns)

    def _write_window(self, session: ProfileSession, rank: int, window: int,
                      window_name: Optional[str], facts: Optional[RankFacts],
                      clock_offset_ns: int) -> int:
        if facts is None:
            facts = rank_facts(session, session.source_path, rank)
        if window_name is None:
            window_name = default_window_name(session, window)
        shift = session.epoch_offset_ns + clock_offset_ns
        parts = {}
        for name, files in window_parts(session, shift).items():
            self.write_files(name, files, rank, window)  # the events a batch at a time
            parts[name] = self._footers.pop((name, rank, window))
        # sessions last, recording the others' footers: a window is listed once it is whole
        self.write_part("sessions", sessions_table(
            session, shift, window_name=window_name, clock_offset_ns=clock_offset_ns,
            rank_facts=facts, parts=parts), rank, window)
        self._footers.clear()
        pending = [(w, c) for w, c in self._pending.get(rank, []) if w != window]
        self._pending[rank] = pending + [(window, list(facts.calls))]
        self._written.setdefault(rank, set()).add(window)
        return window

    def window_holding(self, session: ProfileSession, rank: int,
                       clock_offset_ns: int = 0) -> Optional[int]:
        """The window of ``rank`` that holds ``session`` (same process, start, stop), or None."""
        shift = session.epoch_offset_ns + clock_offset_ns
        key = (session.process_id, session.start_ns + shift, session.stop_ns + shift)
        for row in sessions_of_rank(self.path, rank):
            if (row.get("process_id"), row.get("start_ns"), row.get("stop_ns")) == key:
                return int(row["window"])
        return None

    def write_collectives(self, rank: int, facts: RankFacts) -> None:
        """Write ``rank``'s collectives (``facts.calls``, all its windows) now; the calls
        the store holds for the rank's other windows (an append) are kept.

        A call's window is the window written with it (``write_window``'s
        ``facts``), else the last window starting at or before its arrival.
        """
        pending = self._pending.pop(rank, [])
        windows = {id(c): w for w, calls in pending for c in calls}
        mine = {w for w, _ in pending} | self._written.get(rank, set())
        with rank_lock(self.path, rank):
            starts = self._window_starts(rank)
            # the calls of the windows the store held before this writer (an append) stay
            rows = [(w, c) for w, c in stored_calls(self.path, rank) if w not in mine]
            for call in facts.calls:
                w = windows.get(id(call))
                if w is None:
                    w = max((win for start, win in starts if start <= call.arrival_ns),
                            default=starts[0][1] if starts else -1)
                rows.append((w, call))
            self._write_calls(rank, facts, rows)

    def _window_starts(self, rank: int) -> List[Tuple[int, int]]:
        """(aligned start ns, window) of each window of ``rank`` in the store, by start."""
        return sorted((int(row["start_ns"]), int(row["window"]))
                      for row in sessions_of_rank(self.path, rank))

    def _write_calls(self, rank: int, facts: RankFacts,
                     rows: List[Tuple[int, CollectiveCall]]) -> None:
        rows = sorted(rows, key=lambda r: r[1].arrival_ns)
        keyed = RankFacts(rank, group=facts.group, group_ranks=dict(facts.group_ranks),
                          calls=[c for _, c in rows])
        key: Dict[int, Tuple[str, int]] = {}
        for pg, (seqs, per_rank) in collective_sequences([keyed]).items():
            for seq, call in zip(seqs, per_rank.get(rank, [])):
                if call is not None:
                    key[id(call)] = (pg, seq)
        cols: Dict[str, list] = {name: [] for name, _ in COLUMNS["collectives"]}
        for window, c in rows:
            pg, seq = key.get(id(c), (c.pg if c.pg is not None else facts.group, None))
            ranks = facts.group_ranks.get(c.pg) if c.pg is not None else None
            for name, value in zip(cols, (
                    window, pg, seq, c.kind, c.nbytes, c.arrival_ns, c.end_ns, c.duration_ns,
                    c.call_site, c.pg, c.seq, c.pg_desc,
                    ranks_text(ranks),
                    c.in_nelems, c.out_nelems, c.dtype)):
                cols[name].append(value)
        self.write_part("collectives", arrow_table("collectives", cols), rank)

    def _flush_pending(self, rank: int) -> None:
        """Merge the pending windows' calls with the rank's stored ones and rewrite them."""
        pending = self._pending.pop(rank, [])
        fresh = {w for w, _ in pending}
        with rank_lock(self.path, rank):  # read, merge and write as one
            rows = [(w, c) for w, c in stored_calls(self.path, rank) if w not in fresh]
            rows += [(w, c) for w, calls in pending for c in calls]
            facts = RankFacts(rank)
            group_of = _group_of_rank(self.path, rank)
            if group_of is not None:
                facts.group, facts.group_ranks = group_of
            self._write_calls(rank, facts, rows)

    def close(self) -> None:
        """Write the pending collectives, then the marker (last)."""
        for rank in sorted(self._pending):
            self._flush_pending(rank)
        for table in TABLES:
            os.makedirs(os.path.join(self.path, table), exist_ok=True)
        text = json.dumps({"format": FORMAT, "version": VERSION}) + "\n"
        marker = os.path.join(self.path, MARKER)
        if os.path.islink(marker):
            raise StoreError(f"store {self.path!r}: {marker!r} is a symlink; refusing it")
        fd, tmp = tempfile.mkstemp(prefix=".marker-", suffix=".tmp", dir=self.path)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, marker)


def default_window_name(session: ProfileSession, window: int) -> str:
    """The source file's name, else ``step<N>`` of its first ``ProfilerStep#N``, else
    ``window<W>``."""
    if session.source_path:
        return os.path.basename(session.source_path)
    steps = step_ranges(session)
    if len(steps):
        tail = session.table.name(int(steps[0]))[len(PROFILER_STEP_PREFIX):]
        if tail.isdigit():
            return f"step{tail}"
    return f"window{window}"


def _group_of_rank(store: str, rank: int) -> Optional[Tuple[str, Dict[str, List[int]]]]:
    """(group, group_ranks) from the rank's latest window's rank_facts, if any."""
    rows = sorted(sessions_of_rank(store, rank), key=lambda r: int(r["window"]))
    for row in reversed(rows):
        try:
            facts = load_json(row.get("rank_facts") or "null")
        except ValueError:
            continue
        if isinstance(facts, dict) and isinstance(facts.get("group"), str):
            ranks = facts.get("group_ranks")
            return facts["group"], ranks if isinstance(ranks, dict) else {}
    return None


__all__ = ["StoreWriter", "StoreError"]
