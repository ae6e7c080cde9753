"""What every collector offers: the ``Collector`` protocol.

``opscope.collect.native.collector.NativeCollector`` (the C++ observer) and
``opscope.collect.python.collector.PythonCollector`` (the fallback) both
follow it; the profiler and the recording only call what is listed here.

Example::

    >>> from opscope.collect.python.collector import PythonCollector
    >>> isinstance(PythonCollector(), Collector)
    True
    >>> isinstance(object(), Collector)
    False
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from opscope.model.records import RawSession


@runtime_checkable
class Collector(Protocol):
    """A source of records: started and stopped once per recording window.

    ``name`` is ``"native"`` or ``"python"``; ``now_ns()`` is its clock
    (CLOCK_MONOTONIC ns, the clock of the records); ``range_push(name)``
    opens a user range and returns the handle ``range_pop`` closes;
    ``forget_after_fork()`` drops, in a forked child, what the parent's
    recording left behind without recording anything.
    """

    name: str

    def start(self, *, record_shapes: bool = False, profile_memory: bool = False,
              with_stack: bool = False) -> None:
        """Begin recording."""

    def stop(self) -> RawSession:
        """End recording and hand over everything recorded since ``start``."""

    def is_recording(self) -> bool:
        """True between ``start`` and ``stop``."""

    def now_ns(self) -> int:
        """The collector's clock, in ns."""

    def range_push(self, name: str) -> Any:
        """Open a user range named ``name``; returns its handle."""

    def range_pop(self, handle: Any) -> None:
        """Close the range ``handle`` opened."""

    def forget_after_fork(self) -> None:
        """In a forked child: drop the parent's recording state, record nothing."""
