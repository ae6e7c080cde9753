"""The black box's ring: the last recorded windows, within seconds and bytes.

The black box records in short consecutive windows (a quarter of its
``seconds`` or of its ``max_mb`` each, whichever comes first) and keeps
the finished ones here. ``add(raw, now_ns)`` keeps a window and drops what
is past either bound: whole windows that ended more than ``seconds`` ago,
then the oldest windows while the bytes kept, plus the bytes the live
window holds (``live_bytes``), are over ``max_bytes``. A single window
over the bytes bound alone keeps its newest records. ``windows()`` is a
snapshot (a list) that later adds do not change.

Example::

    >>> import numpy as np
    >>> from opscope.model.records import RECORD_DTYPE, RawSession
    >>> def window(start, n):
    ...     recs = np.zeros(n, RECORD_DTYPE)
    ...     recs["start_ns"] = recs["end_ns"] = np.arange(start, start + n)
    ...     return RawSession(recs, [], [], [], start, start + n, 0)
    >>> ring = Ring(seconds=1.0, max_bytes=48 * 150)
    >>> for k in range(4):
    ...     ring.add(window(k * 100, 100), now_ns=k * 100 + 100)
    >>> [len(w.records) for w in ring.windows()]  # 150 records' bytes: one and a half windows
    [50, 100]
    >>> ring.add(window(2 * 10 ** 9, 10), now_ns=2 * 10 ** 9 + 10)  # a second later
    >>> [len(w.records) for w in ring.windows()]
    [10]
"""

from __future__ import annotations

import threading
from collections import deque
from typing import Deque, List, Tuple

import numpy as np

from opscope.model.raw_join import raw_bytes, records_since
from opscope.model.records import RawSession


class Ring:
    """Finished windows, oldest first, within ``seconds`` and ``max_bytes``."""

    def __init__(self, seconds: float, max_bytes: int):
        self.seconds_ns = int(seconds * 1e9)
        self.max_bytes = int(max_bytes)
        self._lock = threading.Lock()
        self._windows: Deque[Tuple[RawSession, int]] = deque()  # (window, its bytes)
        self._bytes = 0
        self.version = 0  # raised at every change: the crash handler is told again

    @property
    def bytes(self) -> int:
        """The bytes the kept windows hold."""
        return self._bytes

    def add(self, raw: RawSession, now_ns: int, live_bytes: int = 0) -> None:
        """Keep ``raw`` (a finished window) and drop what is past the bounds."""
        with self._lock:
            size = raw_bytes(raw)
            self._windows.append((raw, size))
            self._bytes += size
            self.version += 1
            self._trim(now_ns, live_bytes)

    def trim(self, now_ns: int, live_bytes: int = 0) -> None:
        """Drop what is past the bounds now (the live window holding ``live_bytes``)."""
        with self._lock:
            self._trim(now_ns, live_bytes)

    def windows(self) -> List[RawSession]:
        """The kept windows, oldest first."""
        with self._lock:
            return [raw for raw, _ in self._windows]

    def clear(self) -> None:
        with self._lock:
            self._windows.clear()
            self._bytes = 0

    def _trim(self, now_ns: int, live_bytes: int) -> None:
        before = (len(self._windows), self._bytes)
        self._cut(now_ns, live_bytes)
        if (len(self._windows), self._bytes) != before:
            self.version += 1

    def _cut(self, now_ns: int, live_bytes: int) -> None:
        windows = self._windows
        while windows and windows[0][0].stop_ns < now_ns - self.seconds_ns:
            self._bytes -= windows.popleft()[1]
        budget = self.max_bytes - max(0, live_bytes)
        while windows and self._bytes > budget:
            raw, size = windows[0]
            over = self._bytes - budget
            if over >= size or len(raw.records) == 0:
                windows.popleft()
                self._bytes -= size
                continue
            kept = _newest(raw, size - over)
            kept_size = raw_bytes(kept)
            windows[0] = (kept, kept_size)
            self._bytes += kept_size - size
            if kept_size >= size:  # nothing could be cut: drop it whole
                windows.popleft()
                self._bytes -= kept_size


def _newest(raw: RawSession, max_bytes: int) -> RawSession:
    """``raw``'s newest records (by end time) that fit in about ``max_bytes``."""
    per_record = max(1, raw_bytes(raw) // max(1, len(raw.records)))
    keep = max(0, max_bytes // per_record)
    if keep == 0:
        return records_since(raw, np.iinfo(np.int64).max)
    ends = raw.records["end_ns"]
    cut = len(ends) - keep  # the keep-th latest end, found without a sort
    return records_since(raw, int(np.partition(ends, cut)[cut]))
