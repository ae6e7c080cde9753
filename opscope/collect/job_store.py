"""The job's own c10d store, as opscope's background threads use it.

opscope's multi-rank features (clock offsets, whole-job on-demand requests)
talk through the store of the job's default process group: no port, no
transport of opscope's own, and it works across hosts because the job's
ranks already reach it. :func:`open_job_store` gives a :class:`JobStore` only
while ``torch.distributed`` is initialised with more than one rank; else None.

Every key is under ``opscope/``. opscope uses only calls that answer at
once: ``set``, ``add``, ``compare_set``, ``delete_key``, ``check``, and ``get`` of
a key ``check`` found. Where the Store has ``clone()`` (torch 2.8 and later)
each JobStore is a clone with its own connection and a short timeout, so an
opscope thread never holds the job's client lock; on older torch it shares
the job's client, where those calls hold its lock only briefly. Threads that
use a JobStore are daemons (:func:`start_daemon`) and stop at exit
(:func:`stopping`); none survives a fork.

Example::

    >>> open_job_store() is None   # no process group in this process
    True
    >>> key("clock", "pong", 3)
    'opscope/clock/pong/3'
"""

from __future__ import annotations

import atexit
import datetime
import os
import sys
import threading
import warnings
from typing import Any, Callable, List, Optional, Tuple

KEY_PREFIX = "opscope"
STORE_TIMEOUT_S = 5.0  # a clone's timeout: a call on a store that stopped answering
EXIT_WAIT_S = STORE_TIMEOUT_S + 1.0  # the most exit waits for a thread inside a store call
_shutdown = threading.Event()
_threads: List[threading.Thread] = []
_warned = set()


def key(*parts: Any) -> str:
    """The store key of ``parts``, under opscope's prefix."""
    return "/".join([KEY_PREFIX, *(str(p) for p in parts)])


def warn_once(message: str) -> None:
    """One warning line per distinct message in this process."""
    if message not in _warned:
        _warned.add(message)
        warnings.warn(f"opscope: {message}", RuntimeWarning, stacklevel=3)


def job_ranks() -> Optional[Tuple[int, int]]:
    """``(rank, world_size)`` of the default process group; None when there is none.

    It never imports torch.distributed: a program that did not import it has
    no process group.

    >>> job_ranks() is None
    True
    """
    dist = sys.modules.get("torch.distributed")
    try:
        if dist is None or not dist.is_available() or not dist.is_initialized():
            return None
        return int(dist.get_rank()), int(dist.get_world_size())
    except Exception:  # noqa: BLE001  (torn down meanwhile: no job to talk to)
        return None


def _default_store() -> Any:
    """The default process group's store, by the names torch 2.4 to 2.15 give it."""
    from torch.distributed import distributed_c10d as c10d

    getter = getattr(c10d, "_get_default_store", None)
    if getter is not None:
        return getter()
    by_group = getattr(c10d, "_get_process_group_store", None)
    if by_group is not None:
        return by_group(c10d._get_default_group())
    raise AttributeError("this torch.distributed has no _get_default_store")


class JobStore:
    """opscope's view of the job's store: keys under ``opscope/``, calls that answer at once.

    Values are text. ``get`` answers None for a key not set yet, without
    waiting for it.
    """

    def __init__(self, store: Any, rank: int, world_size: int, cloned: bool):
        self._store = store
        self.rank = rank
        self.world_size = world_size
        self.cloned = cloned

    def set(self, name: str, value: str) -> None:
        """Set ``name`` (a :func:`key`) to ``value``."""
        self._store.set(name, value)

    def has(self, name: str) -> bool:
        """True when ``name`` is set."""
        return bool(self._store.check([name]))

    def get(self, name: str) -> Optional[str]:
        """The value of ``name``, or None while it is not set (never waits for it)."""
        if not self._store.check([name]):
            return None
        return bytes(self._store.get(name)).decode("utf-8", "replace")

    def add(self, name: str, amount: int) -> int:
        """Add ``amount`` to the counter ``name``; its new value (``amount`` 0 reads it)."""
        return int(self._store.add(name, int(amount)))

    def compare_set(self, name: str, expected: str, desired: str) -> str:
        """Set ``name`` to ``desired`` if it holds ``expected`` ('' : unset); the value after."""
        return bytes(self._store.compare_set(name, expected, desired)).decode("utf-8", "replace")

    def delete(self, name: str) -> None:
        """Remove ``name``; a store that cannot delete keeps it."""
        try:
            self._store.delete_key(name)
        except Exception:  # noqa: BLE001  (a few stale keys harm nothing)
            pass


def open_job_store(timeout_s: float = STORE_TIMEOUT_S) -> Optional[JobStore]:
    """A JobStore for the calling thread, or None when there is no multi-rank job.

    None also where this torch gives no access to the default store (one
    warning line). Call it from the thread that will use the store: each
    call makes its own clone where the Store can be cloned.
    """
    ranks = job_ranks()
    if ranks is None or ranks[1] <= 1:
        return None
    try:
        store = _default_store()
    except Exception as exc:  # noqa: BLE001
        warn_once(f"cannot reach the job's c10d store ({exc}); clock offsets and "
                  f"whole-job on-demand requests are off")
        return None
    cloned = False
    if hasattr(store, "clone"):
        try:
            store = store.clone()
            store.set_timeout(datetime.timedelta(seconds=timeout_s))
            cloned = True
        except Exception:  # noqa: BLE001  (a store type without clone: share the job's)
            store = _default_store()
    return JobStore(store, ranks[0], ranks[1], cloned)


def stopping() -> bool:
    """True once the interpreter is exiting: background loops end."""
    return _shutdown.is_set()


def start_daemon(target: Callable[[], None], name: str) -> threading.Thread:
    """Start ``target`` on a daemon thread (it never keeps the process alive).

    ``target`` must end soon after :func:`stopping` turns True: at exit the
    thread is waited for (at most :data:`EXIT_WAIT_S`), because a thread
    still inside a store call when the interpreter finalises aborts the
    process.
    """
    thread = threading.Thread(target=target, name=name, daemon=True)
    _threads[:] = [t for t in _threads if t.is_alive()] + [thread]
    thread.start()
    return thread


def _reset_in_child() -> None:
    """After fork: the parent's threads are not in the child; its own start afresh."""
    global _shutdown
    _shutdown = threading.Event()
    _threads.clear()


def _at_exit() -> None:
    """Stop every opscope store thread and wait for it to leave its store call."""
    import time

    _shutdown.set()
    deadline = time.monotonic() + EXIT_WAIT_S
    for thread in list(_threads):
        if thread is not threading.current_thread():
            thread.join(max(0.0, deadline - time.monotonic()))


atexit.register(_at_exit)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_in_child)
