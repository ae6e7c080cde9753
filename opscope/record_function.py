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


class _Recording:
    """The collector of the running profiler, or None. Set only by opscope.profile."""

    __slots__ = ("collector",)

    def __init__(self) -> None:
        self.collector: Any = None


RECORDING = _Recording()


class record_function:
    """A named range in the profile, as ``torch.profiler.record_function``.

    ``args`` is accepted for compatibility (torch attaches it to the range).
    """

    __slots__ = ("name", "args", "_handle", "_collector")

    def __init__(self, name: str, args: Optional[str] = None):
        if not isinstance(name, str):
            raise TypeError(f"record_function: name must be a str, got {type(name).__name__}")
        self.name = name
        self.args = args
        self._handle = None
        self._collector = None

    def __enter__(self) -> "record_function":
        collector = RECORDING.collector
        if collector is not None:
            self._collector = collector
            self._handle = collector.range_push(self.name)
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        if self._handle is not None:
            handle, self._handle = self._handle, None
            self._collector.range_pop(handle)
            self._collector = None
        return False

    def __call__(self, fn):
        """Use as a decorator: each call of ``fn`` is one range (re-entrant)."""
        name, args = self.name, self.args

        @functools.wraps(fn)
        def wrapper(*a, **kw):
            with record_function(name, args):
                return fn(*a, **kw)

        return wrapper
