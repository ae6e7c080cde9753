"""Convert saved traces (opscope's or torch.profiler's) into a store, one trace at a time.

``convert(paths, store)`` reads each trace with the streaming reader
(``opscope.load.trace_stream``), builds its session, reduces it to its
``RankFacts`` (``analysis.ranks.facts.rank_facts``: the session is read once),
writes it as one window with ``StoreWriter`` and drops it before the next;
a rank's collectives are written after its last window. So memory holds one
trace's session (plus the small facts of the rank being converted), whatever
the number of ranks.

A trace's rank is ``distributedInfo.rank``, else the ``rank<R>`` of its file
name, else 0. A rank's traces become its windows in time order: the order
comes from a peek at each file's start (its top-level keys and first batch
of events), so nothing is parsed twice in full. ``jobs`` > 1 converts the
ranks in that many processes (this one and ``jobs - 1`` forked workers).

A new store is written in a temp folder beside it and renamed into place
when whole; an existing store gets the new windows after its own; any other
existing path is refused with a ``StoreError`` naming it.

Example::

    >>> import json, os, tempfile
    >>> folder = tempfile.mkdtemp()
    >>> path = os.path.join(folder, "t.rank1.json")
    >>> _ = open(path, "w").write(json.dumps({"traceEvents": [
    ...     {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 2,
    ...      "ts": 1, "dur": 5}]}))
    >>> result = convert([path], os.path.join(folder, "store"))
    >>> result.windows, result.ranks
    (1, [1])
"""

from __future__ import annotations

import os
import shutil
import socket
import stat
import tempfile
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from opscope.load.ranks import RankTraceError, rank_from_name, trace_paths
from opscope.load.trace_events import MAX_EPOCH_NS
from opscope.model.torch_names import CLOCK_OFFSET_KEY, DISTRIBUTED_INFO_KEY
from opscope.store.convert_traces import (ConvertResult, PlannedTrace, convert_files,
                                          convert_in_jobs)
from opscope.store.folder import check_store_folder
from opscope.store.schema import StoreError, require_pyarrow

PEEK_BYTES = 1 << 16  # text parsed per peek batch: a few hundred events, not the trace


class _Peeked(Exception):
    """Stops the peek after the first batch of events."""


def trace_files(paths: Sequence[str]) -> List[str]:
    """The trace files of ``paths`` (files, and folders' ``.json``/``.json.gz`` files).

    >>> trace_files(["/no/such/trace.json"])
    Traceback (most recent call last):
    ...
    opscope.store.schema.StoreError: '/no/such/trace.json': no such file or folder
    """
    out: List[str] = []
    for path in paths:
        try:
            out += trace_paths(os.fspath(path))
        except RankTraceError as exc:
            raise StoreError(str(exc)) from None
    if not out:
        raise StoreError("no traces given")
    return list(dict.fromkeys(out))


def peek(path: str, max_bytes: Optional[int] = None) -> Tuple[Optional[int], float]:
    """(rank from the keys before the events, else the file name; earliest event's time).

    Reads the top-level keys up to ``traceEvents`` and its events up to the first
    small batch (``PEEK_BYTES`` of text) that has a complete event (``ph`` X).
    The time is absolute (Unix ns): an opscope trace's ``ts`` counts from its
    own ``baseTimeNanoseconds`` (plus ``opscopeClockOffsetNs``), so raw ``ts``
    of two files do not compare. A trace that gives its base only after the
    events (torch < 2.5: one base per process) is ordered by ``ts``.
    A file that cannot be peeked gets (name's rank, inf): its load says why.
    """
    from opscope.load.trace_stream import parse_trace

    seen: Dict[str, object] = {}
    starts: List[float] = []

    def first_batch(events, _first) -> None:
        starts.extend(e["ts"] for e in events if type(e) is dict
                      and type(e.get("ts")) in (int, float) and e.get("ph") == "X")
        if starts:
            raise _Peeked

    try:
        parse_trace(path, first_batch, lambda: None, max_bytes, keys=seen,
                    chunk_bytes=PEEK_BYTES)
    except _Peeked:
        pass
    except (ValueError, OSError):
        return rank_from_name(path), float("inf")
    info = seen.get(DISTRIBUTED_INFO_KEY)
    rank = info.get("rank") if isinstance(info, dict) else None
    if not (type(rank) is int and rank >= 0):
        rank = rank_from_name(path)
    if not starts:
        return rank, float("inf")
    return rank, clock_origin_ns(seen) + int(round(min(starts) * 1000))


def clock_origin_ns(keys: Dict[str, object]) -> int:
    """The Unix ns at a trace's ``ts`` 0: ``baseTimeNanoseconds`` plus ``opscopeClockOffsetNs``.

    >>> clock_origin_ns({"baseTimeNanoseconds": 10 ** 18, "opscopeClockOffsetNs": -5})
    999999999999999995
    >>> clock_origin_ns({"baseTimeNanoseconds": "1"})
    0
    """
    base, offset = keys.get("baseTimeNanoseconds"), keys.get(CLOCK_OFFSET_KEY)
    return ((base if type(base) is int and 0 <= base <= MAX_EPOCH_NS else 0)
            + (offset if type(offset) is int and abs(offset) <= MAX_EPOCH_NS else 0))


def plan(paths: List[str], max_bytes: Optional[int] = None) -> List[PlannedTrace]:
    """The files in conversion order: by rank (0 when none is known), then start."""
    out = []
    for path in paths:
        rank, start = peek(path, max_bytes)
        out.append(PlannedTrace(0 if rank is None else rank, start, path))
    return sorted(out)


def _temp_prefix(store: str) -> str:
    """``.<name>.convert-``: the start of a new store's temp folder's name, beside it."""
    return "." + os.path.basename(os.path.abspath(store)) + ".convert-"


def _host() -> str:
    return "".join(c for c in socket.gethostname() if c.isalnum() or c == ".") or "host"


def remove_stale_temps(store: str) -> List[str]:
    """Remove the temp folders that killed converts of ``store`` left beside it; their paths.

    Only folders named as :func:`_destination` names them
    (``.<name>.convert-<host>-<pid>-<random>``), made on this host by a process that
    is gone, owned by this user and not symlinks, are removed.
    """
    parent = os.path.dirname(os.path.abspath(store))
    prefix = _temp_prefix(store)
    try:
        names = [n for n in os.listdir(parent) if n.startswith(prefix)]
    except OSError:
        return []
    removed = []
    for name in names:
        parts = name[len(prefix):].rsplit("-", 2)  # host, pid, mkdtemp's random part
        path = os.path.join(parent, name)
        if len(parts) != 3 or parts[0] != _host() or not parts[1].isdigit() \
                or _alive(int(parts[1])):
            continue
        try:
            info = os.lstat(path)
        except OSError:
            continue
        if stat.S_ISDIR(info.st_mode) and info.st_uid == os.getuid():
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (OSError, OverflowError):  # another user's process, a bad number: leave it
        return True
    return True


def _destination(store: str) -> Tuple[str, bool]:
    """(folder to write in, whether it is a temp folder to rename onto ``store``)."""
    store = os.fspath(store)
    remove_stale_temps(store)
    if os.path.lexists(store):
        check_store_folder(store, create=False)  # refuses anything but a store
        return store, False
    parent = os.path.dirname(os.path.abspath(store)) or "."
    if not os.path.isdir(parent):
        raise StoreError(f"store {store!r}: its folder {parent!r} does not exist")
    tmp = tempfile.mkdtemp(prefix=f"{_temp_prefix(store)}{_host()}-{os.getpid()}-", dir=parent)
    return tmp, True


def convert(paths: Sequence[str], store: str, *, jobs: int = 1,
            max_bytes: Optional[int] = None, python_functions: Optional[str] = None,
            done: Optional[Callable[[str], None]] = None) -> ConvertResult:
    """Convert the traces of ``paths`` (files or folders) into the store ``store``.

    Raises ``StoreError`` for a destination that is not a store or missing
    inputs, ``opscope.load.TraceLoadError`` naming a trace that cannot be
    read; a new store is then not created.
    """
    from opscope.store.write import StoreWriter

    require_pyarrow()
    files = plan(trace_files(paths), max_bytes)
    folder, is_temp = _destination(store)
    try:
        if jobs > 1 and len({f.rank for f in files}) > 1:
            result = convert_in_jobs(folder, files, jobs, max_bytes, python_functions, done)
        else:
            result = convert_files(folder, files, max_bytes=max_bytes,
                                   python_functions=python_functions, done=done)
        StoreWriter(folder).close()  # the marker, last
        if is_temp:
            if os.path.lexists(store):
                raise StoreError(f"store {store!r} appeared while converting; refusing to "
                                 f"replace it")
            os.rename(folder, store)
    except BaseException:
        if is_temp:
            shutil.rmtree(folder, ignore_errors=True)
        raise
    result.store = os.fspath(store)
    result.ranks = sorted(set(result.ranks))
    return result
