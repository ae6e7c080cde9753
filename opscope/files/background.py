"""Hand work to a thread of its own: ``Background(consume)``, fed by ``put``, ended by ``finish``.

Output files are made in two stages, one after the other per chunk: Python
makes a chunk (rendered trace lines, a batch of store columns), then C code
that releases the GIL consumes it (ISA-L compresses it, Parquet encodes it).
On a thread of its own the second stage overlaps the making of the next chunk,
so a large output is written in about two thirds of the time on two cores.

``put(item)`` waits while ``queued`` items are already waiting (memory stays a
few chunks). The first error ``consume`` raises stops the consuming and is
raised by the next ``put`` or by ``finish``, in the caller's thread.
``finish()`` waits until every item put is consumed; it is safe to call twice.
In a forked child (the thread is the parent's), ``put`` consumes in line.

Example::

    >>> got = []
    >>> work = Background(got.append)
    >>> for k in range(3):
    ...     work.put(k)
    >>> work.finish()
    >>> got
    [0, 1, 2]
"""

from __future__ import annotations

import os
import queue
import threading
from typing import Any, Callable, List, Optional

_DONE = object()  # what ends the thread


class Background:
    """``consume(item)`` of every item ``put``, in order, on a thread of its own."""

    def __init__(self, consume: Callable[[Any], Any], name: str = "opscope-writer",
                 queued: int = 1):
        self._consume = consume
        self._owner = os.getpid()
        self._queue: "queue.Queue[Any]" = queue.Queue(queued)
        self._failed: List[BaseException] = []
        self._thread: Optional[threading.Thread] = threading.Thread(
            target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is _DONE:
                return
            if not self._failed:
                try:
                    self._consume(item)
                except BaseException as exc:  # raised by put or finish, in the caller
                    self._failed.append(exc)

    def put(self, item: Any) -> None:
        """Queue ``item`` (wait while the queue is full); raise the consumer's error."""
        if self._failed:
            raise self._failed[0]
        if self._thread is None or os.getpid() != self._owner:
            self._consume(item)
        else:
            self._queue.put(item)

    def finish(self) -> None:
        """Wait until every item is consumed and the thread has ended; raise its error."""
        if self._thread is not None and os.getpid() == self._owner:
            self._queue.put(_DONE)
            self._thread.join()
        self._thread = None
        if self._failed:
            raise self._failed[0]
