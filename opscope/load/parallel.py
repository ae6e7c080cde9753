"""Read many traces on every core: ``map_in_processes(fn, items, jobs)``, results in order.

A job's rank traces are independent, so ``opscope ranks`` and ``opscope merge``
read them side by side: ``jobs`` forked processes (forking shares the imported
modules, so each adds about one trace's memory, not an interpreter's) each
call ``fn`` on an item and send the result back; the caller gets the
results in the items' order, as ``map`` would give them. At most ``2 x jobs``
items are in flight, so memory holds a few results, never all of them. An
exception in a worker is raised in the caller, the first in order, with its
type and message; a worker that dies (killed, out of memory) raises
``WorkerDied``, a ValueError naming ``--jobs 1``, never a wait without end.
Either way the workers are gone before the error leaves. ``jobs`` 1, one
item, or a platform without ``fork`` runs ``fn`` here, in this process.

Example::

    >>> list(map_in_processes(abs, [-3, 1, -2], jobs=2))
    [3, 1, 2]
    >>> default_jobs() >= 1
    True
"""

from __future__ import annotations

import multiprocessing
import os
import pickle
from collections import deque
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from itertools import islice
from typing import Callable, Iterator, Sequence, TypeVar

T = TypeVar("T")
R = TypeVar("R")

MAX_DEFAULT_JOBS = 8  # past this, the disk rather than the cores bounds reading


class WorkerDied(ValueError):
    """A reading process ended without an answer (killed, or out of memory)."""


def default_jobs() -> int:
    """The cores this process may run on (at most ``MAX_DEFAULT_JOBS``)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        cores = os.cpu_count() or 1
    return max(1, min(cores, MAX_DEFAULT_JOBS))


def map_in_processes(fn: Callable[[T], R], items: Sequence[T], jobs: int) -> Iterator[R]:
    """``fn`` of each item, in order, computed in ``jobs`` forked processes (see above)."""
    if jobs <= 1 or len(items) <= 1 or "fork" not in multiprocessing.get_all_start_methods():
        yield from map(fn, items)
        return
    rest = iter(items)
    pool = ProcessPoolExecutor(min(jobs, len(items)), multiprocessing.get_context("fork"))
    try:
        pending = deque(pool.submit(_call, fn, item) for item in islice(rest, 2 * jobs))
        while pending:
            try:
                failed, result = pending.popleft().result()
            except BrokenProcessPool:
                raise WorkerDied("a process reading in parallel died (killed, or out of "
                                 "memory); --jobs 1 reads in this process") from None
            if failed:
                raise result
            pending.extend(pool.submit(_call, fn, item) for item in islice(rest, 1))
            yield result
    finally:  # an error, or a caller that stopped early: no work left behind
        pool.shutdown(wait=True, cancel_futures=True)


def _call(fn: Callable[[T], R], item: T):
    """In a worker: ``(False, fn(item))``, or ``(True, the exception)``. An exception
    that would not survive pickling (the pool would break on it) comes back as one of its base class with the same message.

    >>> _call(abs, -1)
    (False, 1)
    >>> class Odd(ValueError):
    ...     def __init__(self, a, b):
    ...         super().__init__(f"{a}/{b}")
    >>> _call(lambda _: (_ for _ in ()).throw(Odd(1, 2)), None)
    (True, ValueError('1/2'))
    """
    try:
        return False, fn(item)
    except Exception as error:  # noqa: BLE001 - handed to the caller, raised there
        try:
            pickle.loads(pickle.dumps(error))
            return True, error
        except Exception:  # noqa: BLE001 - the error's own class cannot cross
            base = next(k for k in type(error).__mro__[1:]
                        if k.__module__ == "builtins" and issubclass(k, Exception))
            return True, base(str(error))
