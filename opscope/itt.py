"""``opscope.itt``: Intel ITT-style ranges and marks, recorded into the opscope trace.

The functions have ``torch.profiler.itt``'s names. While an opscope profiler
records, a range becomes a user annotation (as ``record_function``), and a
mark an instant event on its thread in the Chrome trace. When torch's ITT
binding is available (``torch._C._itt.is_available()``, Intel VTune), every
call is forwarded to it too. With neither, they cost a few attribute checks.

Ranges nest per thread. ``range_push`` returns the zero-based depth of the
range it started, ``range_pop`` the depth of the range it ended (``-1`` when
no range was open on this thread).

Example::

    >>> import opscope
    >>> from opscope import itt
    >>> with opscope.profile() as prof:
    ...     itt.range_push("load")
    ...     itt.mark("batch ready")
    ...     itt.range_pop()
    0
    0
    >>> [row.key for row in prof.key_averages()]
    ['load']
    >>> [name for _, _, name in prof.session.marks]
    ['batch ready']
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Any, Iterator, List, Optional, Tuple

from opscope.arguments import recorded_name
from opscope.record_function import recording_collector

# (collector, collector-clock ns, OS thread id, message) per mark while recording
_marks: List[Tuple[Any, int, int, str]] = []
_local = threading.local()


def _torch_itt() -> Optional[Any]:
    """torch.profiler.itt when torch's ITT binding works here, else None."""
    try:
        import torch

        if torch._C._itt.is_available():
            from torch.profiler import itt as torch_itt

            return torch_itt
    except Exception:  # noqa: BLE001  (no ITT binding in this torch build)
        pass
    return None


_forward = _torch_itt()


def is_available() -> bool:
    """True when calls are also forwarded to Intel ITT (torch's ITT binding).

    Ranges and marks go into a running opscope profile either way.

    >>> isinstance(is_available(), bool)
    True
    """
    return _forward is not None


def _check_message(function: str, msg: Any) -> str:
    """``msg`` as recorded: a str without lone surrogate, a NUL escaped as ``\\x00``.

    torch's ITT accepts a NUL; the ITT binding gets ``msg`` itself.
    """
    return recorded_name(f"opscope.itt.{function}", "msg", msg)


def _open_ranges() -> list:
    stack = getattr(_local, "stack", None)
    if stack is None:
        stack = _local.stack = []
    return stack


def range_push(msg: str) -> int:
    """Open a nested range named ``msg`` on this thread; returns its zero-based depth.

    >>> range_push("outer"), range_push("inner"), range_pop(), range_pop()
    (0, 1, 1, 0)
    """
    recorded = _check_message("range_push", msg)
    stack = _open_ranges()
    collector = recording_collector()
    # the collector is kept with the handle: the range closes where it was opened
    stack.append((collector, collector.range_push(recorded)) if collector is not None
                 else None)
    if _forward is not None:
        _forward.range_push(msg)
    return len(stack) - 1


def range_pop() -> int:
    """Close the innermost range of this thread; returns its depth, or -1 if none was open.

    >>> range_pop()
    -1
    """
    stack = _open_ranges()
    if not stack:
        return -1
    entry = stack.pop()
    if entry is not None:
        collector, handle = entry
        collector.range_pop(handle)
    if _forward is not None:
        _forward.range_pop()
    return len(stack)


def mark(msg: str) -> None:
    """Record an instant event named ``msg`` on this thread.

    >>> mark("checkpoint saved")   # nothing is recording: a no-op
    """
    recorded = _check_message("mark", msg)
    collector = recording_collector()
    if collector is not None:
        _marks.append((collector, collector.now_ns(), threading.get_native_id(), recorded))
    if _forward is not None:
        _forward.mark(msg)


@contextmanager
def range(msg: str, *args: Any, **kwargs: Any) -> Iterator[None]:  # noqa: A001  (torch's name)
    """A range for a ``with`` block; ``msg.format(*args, **kwargs)`` names it.

    >>> with range("epoch {}", 3):
    ...     pass
    >>> with range("epoch {}", 3.5j):
    ...     pass
    """
    _check_message("range", msg)
    range_push(msg.format(*args, **kwargs) if args or kwargs else msg)
    try:
        yield
    finally:
        range_pop()


def take_marks(collector: Any, start_ns: int, stop_ns: int) -> List[Tuple[int, int, str]]:
    """Remove and return ``collector``'s marks as (ns, OS thread id, message), time order.

    The profiler calls this when it stops; marks outside ``[start_ns,
    stop_ns]`` or of another collector are dropped (left from a recording
    that was aborted).
    """
    taken = _marks[:]
    del _marks[:len(taken)]
    mine = [(ns, tid, msg) for owner, ns, tid, msg in taken
            if owner is collector and start_ns <= ns <= stop_ns]
    mine.sort(key=lambda m: m[0])
    return mine
