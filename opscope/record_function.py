"""User ranges: ``with opscope.record_function("name"):`` or as a decorator.

While no opscope profiler records, entering and leaving costs one attribute
check. While one records, the range is a real ``at::RecordFunction`` user
scope (native collector), so every observer sees it.

Example::

    >>> with record_function("data_loading"):
    ...     pass
    >>> @record_function("train_step")
    ... def train_step():
    ...     return 1
    >>> train_step()
    1
"""

from __future__ import annotations

import functools
from typing import Any, Optional


# The collector of the running opscope profiler, or None. Only opscope.profile
# sets it (through set_recording_collector); a module global is the cheapest
# thing to test on the idle path.
_collector: Any = None


def set_recording_collector(collector: Any) -> None:
    """Wire ``record_function`` to a collector (None: back to a no-op)."""
    global _collector
    _collector = collector


def recording_collector() -> Any:
    """The collector ``record_function`` currently records into, or None."""
    return _collector


class record_function:
    """A named range in the profile, as ``torch.profiler.record_function``.

    ``args`` is accepted for compatibility (torch attaches it to the range).
    """

    __slots__ = ("name", "args", "_handle")

    def __init__(self, name: str, args: Optional[str] = None):
        self.name = name
        self.args = args
        self._handle = None  # (collector, range handle) while open
        if type(name) is not str and not isinstance(name, str):
            raise TypeError(f"record_function: name must be a str, got {type(name).__name__}")

    def __enter__(self) -> "record_function":
        if _collector is not None:
            self._handle = (_collector, _collector.range_push(self.name))
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        if self._handle is not None:
            collector, handle = self._handle
            self._handle = None
            collector.range_pop(handle)
        return False

    def __call__(self, fn):
        """Use as a decorator: each call of ``fn`` is one range (re-entrant)."""
        name, args = self.name, self.args

        @functools.wraps(fn)
        def wrapper(*a, **kw):
            with record_function(name, args):
                return fn(*a, **kw)

        return wrapper
