"""The black box that runs in this process, and what a profile or a fork does with it.

``claim(box)`` makes ``box`` the running black box (RuntimeError while another
runs, unless that one ``yields``: ``opscope run --black-box``'s and
``OPSCOPE_BLACKBOX``'s stand down for the script's own); ``release(box)``
undoes it. An ``opscope.profile`` window borrows the collector
(``lend_to_profile``) and hands its records back at its stop
(``shared_with_black_box``). In a forked child the parent's black box is
dropped (its threads stayed in the parent); one made with ``follow_fork``
starts again in the child, with the same settings and an empty ring.

Example::

    >>> active() is None
    True
"""

from __future__ import annotations

import os
import threading
from typing import Any, Optional

_lock = threading.Lock()
_active: Optional[Any] = None


def active() -> Optional[Any]:
    """The black box running in this process, or None."""
    box = _active
    return box if box is not None and box.running and box.owner == os.getpid() else None


def claim(box: Any) -> None:
    """Make ``box`` the running black box (see the module docstring)."""
    global _active
    with _lock:
        running = _active if _active is not None and _active.running else None
    if running is not None and running is not box:
        if not running.yields:
            raise RuntimeError("opscope.blackbox: another black box runs in this process")
        running.stop()  # opscope run's or OPSCOPE_BLACKBOX's: the script's own wins
    with _lock:
        _active = box


def release(box: Any) -> None:
    global _active
    with _lock:
        if _active is box:
            _active = None


def lend_to_profile() -> None:
    """An ``opscope.profile`` window starts: the running black box (if any) closes its
    window and records nothing until the profile's window stops (or is dropped)."""
    box = active()
    if box is not None:
        box.pause()


def shared_with_black_box(raw):
    """A profile's window stopped: the paused black box keeps its records and records
    again. Returns ``raw``, unchanged."""
    box = active()
    if box is not None:
        box.resume(raw)
    return raw


def _after_fork_in_child() -> None:
    """In a forked child: the parent's black box is dropped; ``follow_fork`` starts anew."""
    global _active, _lock
    _lock = threading.Lock()
    box, _active = _active, None
    if box is not None:
        box.drop_after_fork()
        if box.follow_fork:
            # not here: a lock torch or the allocator held at the fork may never be free
            # in the child; a thread that waits on it harms nothing
            threading.Thread(target=box.again_in_child, name="opscope-blackbox-start",
                             daemon=True).start()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
