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

from opscope.arguments import check_callable, recorded_name


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


def _recorded_text(argument: str, value: Any) -> str:
    """``value`` as it is recorded (``arguments.recorded_name``: a NUL kept, escaped)."""
    return recorded_name("record_function", argument, value)


def _checked_name(argument: str, value: Any) -> str:
    """``value`` as recorded (see ``_recorded_text``).

    The common case (plain ASCII, no NUL) costs two str methods, so the
    idle path stays cheap; anything else takes the full check.
    """
    if type(value) is str and value.isascii() and "\x00" not in value:
        return value
    return _recorded_text(argument, value)


class record_function:
    """A named range in the profile, as ``torch.profiler.record_function``.

    ``name`` (and ``args``, kept for compatibility: torch attaches it to the
    range) must be a str without lone surrogate, checked at the call whether
    or not a profiler records. A NUL is accepted, as torch accepts it; where
    torch cuts the name there, opscope records it whole with the NUL written
    as ``\\x00``.

    >>> record_function("a\\x00b").name == "a\\x00b"
    True
    >>> record_function("\\ud800")
    Traceback (most recent call last):
    ...
    ValueError: record_function: name must be valid Unicode text (it has a lone surrogate), got '\\ud800'
    """

    __slots__ = ("name", "args", "_recorded", "_handle")

    def __init__(self, name: str, args: Optional[str] = None):
        # Inline, one str method for the common case: a printable str has no NUL and no
        # lone surrogate; anything else (tabs, controls, a wrong type) takes the full check.
        if type(name) is not str or not name.isprintable():
            self._recorded = _recorded_text("name", name)
        else:
            self._recorded = name
        self.name = name
        self.args = None if args is None else _checked_name("args", args)
        self._handle = None  # (collector, range handle) while open

    def __enter__(self) -> "record_function":
        if _collector is not None:
            self._handle = (_collector, _collector.range_push(self._recorded))
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        if self._handle is not None:
            collector, handle = self._handle
            self._handle = None
            collector.range_pop(handle)
        return False

    def __call__(self, fn):
        """Use as a decorator: each call of ``fn`` is one range (re-entrant)."""
        check_callable("record_function", "the decorated object", fn, optional=False)
        name, args = self.name, self.args

        @functools.wraps(fn)
        def wrapper(*a, **kw):
            with record_function(name, args):
                return fn(*a, **kw)

        return wrapper
