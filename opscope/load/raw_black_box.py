"""A black box's crash dump (``*.blackbox.fatal.<unix_ms>.raw``) read as a RawSession.

At a crash the native observer writes the ring raw (``collect/native/observer/fatal.h``,
``fatal_handler``): a header (``OPSBBRAW``, version 1, the signal, the
Unix-minus-monotonic offset and the crash time), the name table, then
each window (its start, stop, OS thread ids and 48-byte records), the live
one last, its open records with end 0. ``read_raw_black_box`` checks every
length against the file before it reads (a truncated or forged file is a
``TraceLoadError`` naming it), ends the open records at the crash, and
joins the windows; the trace's metadata says ``fatal`` and the signal.

Example::

    >>> import os, tempfile
    >>> path = os.path.join(tempfile.mkdtemp(), "t.raw")
    >>> _ = open(path, "wb").write(_HEADER.pack(MAGIC, VERSION, 11, 0, 0))  # no window
    >>> raw = read_raw_black_box(path)
    >>> is_raw_black_box(path), len(raw.records), raw.metadata["opscopeBlackBox"][:39]
    (True, 0, '{"reason": "fatal", "signal": "SIGSEGV"')
"""

from __future__ import annotations

import json
import os
import signal
import stat
import struct
from typing import List, Optional

import numpy as np

from opscope.load.trace_file import TraceLoadError, _open_regular, _too_large
from opscope.load.trace_size import default_max_bytes
from opscope.model.raw_join import join_raw
from opscope.model.records import FLAG_UNFINISHED, RECORD_DTYPE, RawSession

MAGIC = b"OPSBBRAW"
VERSION = 1
_HEADER = struct.Struct("<8sIIqq")
_SECTION = struct.Struct("<IIQ")
_WINDOW = struct.Struct("<qqII")
NAMES, WINDOW = 1, 2


def is_raw_black_box(path: str) -> bool:
    """True when the file at ``path`` is a regular file that starts as a black box crash
    dump (a FIFO, device or socket is not opened for reading: it could block)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return False
    try:
        return stat.S_ISREG(os.fstat(fd).st_mode) and os.read(fd, len(MAGIC)) == MAGIC
    except OSError:
        return False
    finally:
        os.close(fd)


def read_raw_black_box(path: str, max_bytes: Optional[int] = None) -> RawSession:
    """The crash dump at ``path`` as one RawSession (see the module docstring)."""
    limit = default_max_bytes() if max_bytes is None else max_bytes
    f, size = _open_regular(path)  # a FIFO, device or socket is refused
    with f:
        if size > limit:
            raise _too_large(path, f"its size, {size} bytes,", limit)
        data = f.read(limit + 1)
    if len(data) > limit:
        raise _too_large(path, "it grew while read and", limit)
    if len(data) < _HEADER.size:
        raise TraceLoadError(path, "a black box crash dump cut short in its header")
    magic, version, number, epoch_offset, stop_ns = _HEADER.unpack_from(data)
    if magic != MAGIC or version != VERSION:
        raise TraceLoadError(path, f"not a black box crash dump of version {VERSION}")
    names: List[str] = []
    windows: List[RawSession] = []
    at = _HEADER.size
    while at < len(data):
        if at + _SECTION.size > len(data):
            raise TraceLoadError(path, f"a section cut short at byte {at}")
        kind, _, length = _SECTION.unpack_from(data, at)
        at += _SECTION.size
        if length > len(data) - at:
            raise TraceLoadError(path, f"a section of {length} bytes at byte {at} runs past "
                                       f"the end of the file")
        body = data[at:at + length]
        at += length
        if kind == NAMES:
            names = [n.decode("utf-8", "replace") for n in body.split(b"\0")[:-1]]
        elif kind == WINDOW:
            windows.append(_window(path, body, epoch_offset))
    for raw in windows:
        raw.names = names
        bad = (raw.records["name_id"] < 0) | (raw.records["name_id"] >= len(names))
        bad |= (raw.records["thread_index"] < 0)
        bad |= raw.records["thread_index"] >= max(1, len(raw.thread_ids))
        if bad.any():
            raise TraceLoadError(path, "a record names a thread or name the dump lacks")
    joined = join_raw(windows) if windows else RawSession.empty()
    joined.records = _ended(joined.records, stop_ns)
    joined.metadata = dict(joined.metadata, opscopeBlackBox=json.dumps(
        {"reason": "fatal", "signal": _signal_name(number), "crash_unix_ns": stop_ns
         + epoch_offset}))
    joined.source_path = path
    joined.options = {}
    return joined


def _window(path: str, body: bytes, epoch_offset: int) -> RawSession:
    if len(body) < _WINDOW.size:
        raise TraceLoadError(path, "a window cut short in its header")
    start_ns, stop_ns, n_threads, _ = _WINDOW.unpack_from(body)
    at = _WINDOW.size + 8 * n_threads
    if at > len(body) or (len(body) - at) % RECORD_DTYPE.itemsize:
        raise TraceLoadError(path, "a window whose records do not fill it")
    tids = np.frombuffer(body, np.int64, n_threads, _WINDOW.size).tolist()
    records = np.frombuffer(body, RECORD_DTYPE, offset=at).copy()
    return RawSession(records, [np.zeros(0, np.int64)] * n_threads, tids, [], start_ns,
                      stop_ns, epoch_offset)


def _ended(records: np.ndarray, stop_ns: int) -> np.ndarray:
    """Records still open at the crash end there, flagged unfinished."""
    open_ = records["end_ns"] == 0
    if open_.any():
        records = records.copy()
        records["end_ns"][open_] = np.maximum(records["start_ns"][open_], stop_ns)
        records["flags"][open_] |= FLAG_UNFINISHED
    return records


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return str(number)
