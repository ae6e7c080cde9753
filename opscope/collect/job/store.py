"""The job's own c10d store, as opscope's background threads use it.

opscope's multi-rank features (clock offsets, whole-job on-demand requests)
talk through the store of the job's default process group: no port, no
transport of opscope's own, and it works across hosts because the job's
ranks already reach it. :func:`open_job_store` gives a :class:`JobStore` only
while ``torch.distributed`` is initialised with more than one rank; else None.

Every key is under ``opscope/``. opscope uses only calls that answer at
once: ``set``, ``compare_set``, ``delete_key``, ``check``, and ``get`` of a key
``check`` found. Anyone who reaches the store may have written any key, so
counters are read with ``get`` and parsed strictly (:func:`parse_count`), and
raised with ``compare_set`` (:meth:`JobStore.increment`): never with ``add``,
for the store drops a connection that adds to a value that is not a number. Where the Store has ``clone()`` (torch 2.8 and later)
each JobStore is a clone with its own connection and a short timeout, so an
opscope thread never holds the job's client lock; on older torch it shares
the job's client, where those calls hold its lock only briefly. Threads that
use a JobStore start with :func:`start_thread` and stop at exit
(:func:`stopping`); none survives a fork.

Example::

    >>> open_job_store() is None   # no process group in this process
    True
    >>> key("clock", "pong", 3)
    'opscope/clock/pong/3'
    >>> parse_count("42"), parse_count("4 2"), parse_count("9" * 40)
    (42, None, None)
"""

from __future__ import annotations

import atexit
import datetime
import os
import re
import sys
import threading
import warnings
from typing import Any, Callable, List, Optional, Tuple

KEY_PREFIX = "opscope"
STORE_TIMEOUT_S = 5.0  # a clone's timeout: a call on a store that stopped answering
EXIT_WAIT_S = STORE_TIMEOUT_S + 1.0  # the most exit waits for a thread inside a store call
_shutdown = threading.Event()  # set: every opscope store thread ends
_main_finished = threading.Event()  # set when the main thread has finished (threading's hook)
_hooked = False
_threads: List[threading.Thread] = []
_warned = set()
MAX_COUNT_DIGITS = 18  # a counter's value: decimal digits, below 10**18
INCREMENT_TRIES = 16  # compare_set attempts while other ranks raise the same counter
_UNSET = "-"  # what count() asks compare_set to expect: never a count
_COUNT = re.compile(r"[0-9]{1,%d}" % MAX_COUNT_DIGITS)


def key(*parts: Any) -> str:
    """The store key of ``parts``, under opscope's prefix."""
    return "/".join([KEY_PREFIX, *(str(p) for p in parts)])


def warn_once(message: str) -> None:
    """One warning line per distinct message in this process."""
    if message not in _warned:
        _warned.add(message)
        warnings.warn(f"opscope: {message}", RuntimeWarning, stacklevel=3)


def parse_count(text: Optional[str]) -> Optional[int]:
    """A counter's value: 0 for an unset key, None for anything but 1 to 18 decimal digits."""
    if text is None:
        return 0
    return int(text) if _COUNT.fullmatch(text) else None


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

    def count(self, name: str) -> Optional[int]:
        """The counter ``name``: 0 while unset, None when it holds anything but a count.

        One round trip, not two (``check``, ``get``): a ``compare_set`` whose expected
        value is no count answers the value, or that expected value for an unset key.
        """
        text = bytes(self._store.compare_set(name, _UNSET, _UNSET)).decode("utf-8", "replace")
        return parse_count(None if text == _UNSET else text)

    def increment(self, name: str) -> int:
        """Raise the counter ``name`` by one; its new value.

        A value that is not a count (someone else's junk) is replaced, and the
        count starts again from 1: readers take a counter that went back as a
        restart. Raises RuntimeError when other writers keep changing it.
        """
        for _ in range(INCREMENT_TRIES):
            text = self.get(name)
            current = parse_count(text)
            if current is None or current + 1 >= 10 ** MAX_COUNT_DIGITS:
                self.set(name, "0")
                continue
            desired = str(current + 1)
            if self.compare_set(name, "" if text is None else text, desired) == desired:
                return current + 1
        raise RuntimeError(f"the counter {name} kept changing under {INCREMENT_TRIES} tries")

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
    """True once the program is ending: background loops end.

    That is once the main thread has finished and no thread of the program's
    own is left running (see :func:`start_thread`), or at the latest at exit.
    """
    if _shutdown.is_set():
        return True
    if _main_finished.is_set() and not _program_threads_alive():
        _shutdown.set()
        return True
    return False


def _program_threads_alive() -> bool:
    """True while a non-daemon thread other than main and opscope's own still runs."""
    main = threading.main_thread()
    return any(t.is_alive() and not t.daemon and t is not main and t not in _threads
               for t in threading.enumerate())


def _store_calls_are_bounded() -> bool:
    """True where this torch's Store can be cloned: every opscope store call has a timeout."""
    torch = sys.modules.get("torch")
    c10d = getattr(getattr(torch, "_C", None), "_distributed_c10d", None)
    return hasattr(getattr(c10d, "Store", None), "clone")


def start_thread(target: Callable[[], None], name: str) -> threading.Thread:
    """Start ``target`` on a background thread that exit stops and waits for.

    ``target`` must end soon after :func:`stopping` turns True. A thread
    still inside a store call when the interpreter finalises aborts the
    process ("terminate called without an active exception": Python ends
    such a thread by unwinding through torch's C++ frames). So where store
    calls are bounded (a clone's timeout) and Python can stop opscope's
    threads before it waits for the program's (``threading._register_atexit``),
    the thread is not a daemon: the interpreter waits for it to leave its
    store call, at most :data:`STORE_TIMEOUT_S`, and only then finalises.
    Elsewhere it is a daemon that exit waits for at most :data:`EXIT_WAIT_S`.
    """
    joined_at_exit = _hook_registered() and _store_calls_are_bounded()
    thread = threading.Thread(target=target, name=name, daemon=not joined_at_exit)
    _threads[:] = [t for t in _threads if t.is_alive()] + [thread]
    thread.start()
    return thread


def _hook_registered() -> bool:
    """Register :func:`_main_thread_finished` with threading's exit hooks, once; success."""
    global _hooked
    if not _hooked:
        register = getattr(threading, "_register_atexit", None)
        try:
            if register is not None:
                register(_main_thread_finished)
                _hooked = True
        except RuntimeError:  # already shutting down
            pass
    return _hooked


def _main_thread_finished() -> None:
    """The main thread is done; the interpreter is about to wait for non-daemon threads."""
    _main_finished.set()


def _reset_in_child() -> None:
    """After fork: the parent's threads are not in the child; its own start afresh."""
    global _shutdown, _main_finished
    _shutdown = threading.Event()
    _main_finished = threading.Event()
    _threads.clear()


def _at_exit() -> None:
    """Stop every opscope store thread still running and wait for it to leave its store call."""
    import time

    _shutdown.set()
    deadline = time.monotonic() + EXIT_WAIT_S
    for thread in list(_threads):
        if thread is not threading.current_thread():
            thread.join(max(0.0, deadline - time.monotonic()))
        if thread.is_alive():
            warn_once(f"thread {thread.name} was still in a call to the job's store at exit")


atexit.register(_at_exit)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_in_child)
