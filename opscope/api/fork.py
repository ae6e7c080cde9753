"""One running ``opscope.profile`` per process, and what a forked child does with it.

``claim(prof)`` marks ``prof`` as the running profiler (RuntimeError if
another one runs), ``release(prof)`` unmarks it. After ``os.fork()`` the
child stops recording into its copy of the parent's profiler and frees it,
so it may start a profiler of its own.

Example::

    >>> class P:
    ...     pass
    >>> p = P()
    >>> claim(p); active_profiler() is p
    True
    >>> release(p); active_profiler() is None
    True
"""

from __future__ import annotations

import os
import threading
import warnings
from typing import Any, Optional

from opscope.collect.profiler_flag import TORCH_FLAG
from opscope.record_function import set_recording_collector

_active_lock = threading.Lock()
_active: Optional[Any] = None


def active_profiler() -> Optional[Any]:
    """The profiler that runs in this process, or None."""
    return _active


def claim(prof: Any) -> None:
    """Mark ``prof`` as this process's running profiler; RuntimeError if another runs.

    A running profiler that yields (``opscope run``'s, around a script that
    starts its own ``opscope.profile``) stands down instead: its recording is
    dropped, and ``prof`` runs as the script wrote it.
    """
    global _active
    with _active_lock:
        running = _active
        if running is not None and running is not prof and not _yields(running):
            raise RuntimeError(
                "opscope.profile is not reentrant: another profiler is already running "
                "in this process; stop it before starting a new one")
        _active = prof
    if running is not None and running is not prof:
        running._stand_down()


def _yields(prof: Any) -> bool:
    return getattr(prof, "_yield_note", None) is not None


def release(prof: Any) -> None:
    """``prof`` no longer runs (nothing happens if it was not the running one)."""
    global _active
    with _active_lock:
        if _active is prof:
            _active = None


def forget_parent_profiler() -> None:
    """In a forked child: stop recording into the parent's copy and free it.

    Runs right after ``os.fork()`` (and multiprocessing's fork start method),
    when the child has a single thread. A lock another parent thread held at
    the fork stays locked forever in the child, so the lock is replaced, not
    taken. The child can then start a profiler of its own.
    """
    global _active, _active_lock
    _active_lock = threading.Lock()
    prof, _active = _active, None
    set_recording_collector(None)
    TORCH_FLAG.lower_flag()  # the child records nothing of the parent's
    if prof is not None:
        try:
            prof._detach_after_fork()
        except Exception as e:  # never break the child over a recording it does not own
            warnings.warn(f"opscope: could not drop the parent's recording after fork: {e}",
                          RuntimeWarning)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=forget_parent_profiler)
