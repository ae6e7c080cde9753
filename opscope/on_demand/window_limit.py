"""How long and how large one on-demand window may grow before it stops early.

A request says how many optimizer steps to record; whoever reached the job's
store could ask for 10**9 of them, and a window that records every option
grows by a gigabyte a minute. So each window also stops, marked partial, at
the first optimizer step after it has recorded for :data:`MAX_WINDOW_S`
seconds or after the process's resident memory grew by
:data:`MAX_WINDOW_BYTES` since the window began (the collector's buffers are
most of that growth; the collector is never asked while it records). The
check runs once per optimizer step while a window records: one clock read,
and a read of ``/proc/self/statm`` at most every :data:`MEMORY_EVERY_S`;
nothing on the op path.

Example::

    >>> limit = WindowLimit()
    >>> limit.exceeded()
    ''
"""

from __future__ import annotations

import os
import time
from typing import Optional

MAX_WINDOW_S = 600.0
MAX_WINDOW_BYTES = 2 << 30  # 2 GiB of resident growth
MEMORY_EVERY_S = 0.5  # resident memory is read at most this often (a read costs ~50 us)
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def resident_bytes() -> Optional[int]:
    """This process's resident memory (Linux ``/proc/self/statm``); None where unknown."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        return None


class WindowLimit:
    """The time and memory one window started with; ``exceeded()`` says when to stop."""

    def __init__(self) -> None:
        self.started = time.monotonic()
        self.resident = resident_bytes()
        self._memory_read = float("-inf")

    def exceeded(self) -> str:
        """Why the window must stop now ('' while it may go on)."""
        now_s = time.monotonic()
        elapsed = now_s - self.started
        if elapsed >= MAX_WINDOW_S:
            return (f"stopped early at its time limit: it recorded for {elapsed:.0f} s "
                    f"(at most {MAX_WINDOW_S:g} s)")
        if self.resident is None or now_s - self._memory_read < MEMORY_EVERY_S:
            return ""
        self._memory_read = now_s
        now = resident_bytes()
        if now is not None and now - self.resident >= MAX_WINDOW_BYTES:
            return (f"stopped early at its byte limit: the process grew by "
                    f"{(now - self.resident) >> 20} MiB while recording (at most "
                    f"{MAX_WINDOW_BYTES >> 20} MiB)")
        return ""
