"""Checks for the arguments of public entry points: fail at the call, naming the argument.

Every public function checks what it is given before it touches any state, so
a wrong value gives a ``TypeError`` or ``ValueError`` that names the function,
the argument and what was expected, and nothing already recorded is lost.

Example::

    >>> check_int("table", "row_limit", 5, minimum=-1)
    5
    >>> check_int("table", "row_limit", "5", minimum=-1)
    Traceback (most recent call last):
    ...
    TypeError: table: row_limit must be an int, got str '5'
    >>> check_name("record_function", "name", "a\\x00b")
    Traceback (most recent call last):
    ...
    ValueError: record_function: name must not contain a NUL character, got 'a\\x00b'
"""

from __future__ import annotations

import numbers
import os
from typing import Any, Iterable, Optional, Tuple, Type, Union


def _shown(value: Any) -> str:
    """A short description of ``value`` for an error message: its type and repr."""
    text = repr(value)
    if len(text) > 60:
        text = text[:57] + "..."
    return f"{type(value).__name__} {text}"


def check_type(where: str, name: str, value: Any,
               types: Union[Type, Tuple[Type, ...]], expected: str) -> Any:
    """``value`` when it is an instance of ``types``; else TypeError naming ``name``.

    >>> check_type("profile", "schedule", 3, (list,), "a list")
    Traceback (most recent call last):
    ...
    TypeError: profile: schedule must be a list, got int 3
    """
    if not isinstance(value, types):
        raise TypeError(f"{where}: {name} must be {expected}, got {_shown(value)}")
    return value


def check_bool(where: str, name: str, value: Any) -> bool:
    """``value`` as a bool; accepts bool and the ints 0 and 1 (numpy bools too).

    >>> check_bool("profile", "record_shapes", 1)
    True
    >>> check_bool("profile", "record_shapes", "yes")
    Traceback (most recent call last):
    ...
    TypeError: profile: record_shapes must be a bool, got str 'yes'
    """
    if isinstance(value, bool) or (isinstance(value, numbers.Integral) and value in (0, 1)):
        return bool(value)
    if type(value).__name__ == "bool_":  # numpy.bool_ is not an Integral
        return bool(value)
    raise TypeError(f"{where}: {name} must be a bool, got {_shown(value)}")


def check_int(where: str, name: str, value: Any, minimum: Optional[int] = None,
              maximum: Optional[int] = None) -> int:
    """``value`` as an int within [minimum, maximum]; bools are refused.

    >>> check_int("schedule", "wait", -1, minimum=0)
    Traceback (most recent call last):
    ...
    ValueError: schedule: wait must be >= 0, got -1
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{where}: {name} must be an int, got {_shown(value)}")
    value = int(value)
    if minimum is not None and value < minimum:
        raise ValueError(f"{where}: {name} must be >= {minimum}, got {value}")
    if maximum is not None and value > maximum:
        raise ValueError(f"{where}: {name} must be <= {maximum}, got {value}")
    return value


def check_positive(where: str, name: str, value: Any) -> float:
    """``value`` as a float when it is a finite number above 0; else ValueError naming it.

    >>> check_positive("blackbox", "seconds", 0)
    Traceback (most recent call last):
    ...
    ValueError: blackbox: seconds must be a positive number, got 0
    """
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
            0 < value < float("inf")):
        raise ValueError(f"{where}: {name} must be a positive number, got {value!r}")
    return float(value)


def check_choice(where: str, name: str, value: Any, choices: Iterable[Any]) -> Any:
    """``value`` when it is one of ``choices``; else ValueError listing them.

    >>> check_choice("table", "time_unit", "h", (None, "s", "ms", "us"))
    Traceback (most recent call last):
    ...
    ValueError: table: time_unit must be one of None, 's', 'ms', 'us'; got 'h'
    """
    options = tuple(choices)
    try:
        found = value in options
    except TypeError:  # an unhashable or incomparable value is not a choice
        found = False
    if not found:
        listed = ", ".join(repr(c) for c in options)
        raise ValueError(f"{where}: {name} must be one of {listed}; got {value!r}")
    return value


def check_callable(where: str, name: str, value: Any, optional: bool = True) -> Any:
    """``value`` when it is callable (or None when ``optional``).

    >>> check_callable("profile", "on_trace_ready", "trace.json")
    Traceback (most recent call last):
    ...
    TypeError: profile: on_trace_ready must be callable, got str 'trace.json'
    """
    if value is None and optional:
        return None
    if not callable(value):
        raise TypeError(f"{where}: {name} must be callable, got {_shown(value)}")
    return value


def check_name(where: str, name: str, value: Any) -> str:
    """A str that can be recorded and written exactly: no NUL, no lone surrogate.

    C++ strings end at NUL, and UTF-8 cannot encode a lone surrogate, so such
    a name could not round-trip through the collector or the trace file.

    >>> check_name("record_function", "name", "step")
    'step'
    >>> check_name("record_function", "name", "\\ud800")
    Traceback (most recent call last):
    ...
    ValueError: record_function: name must be valid Unicode text (it has a lone surrogate), got '\\ud800'
    """
    if not isinstance(value, str):
        raise TypeError(f"{where}: {name} must be a str, got {_shown(value)}")
    if "\x00" in value:
        raise ValueError(f"{where}: {name} must not contain a NUL character, got {value!r}")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(f"{where}: {name} must be valid Unicode text (it has a lone "
                         f"surrogate), got {value!r}") from None
    return value


def recorded_name(where: str, name: str, value: Any) -> str:
    """``value`` as a range or mark name is recorded: a NUL written as ``\\x00``.

    torch accepts a NUL in these names (its C++ string ends there); opscope
    keeps the whole name, with the NUL escaped, in every output. A non-str or
    a lone surrogate is refused as by :func:`check_name` (torch refuses both).

    >>> recorded_name("record_function", "name", "a\\x00b")
    'a\\\\x00b'
    """
    if isinstance(value, str) and "\x00" in value:
        value = value.replace("\x00", "\\x00")
    return check_name(where, name, value)


def check_path(where: str, name: str, value: Any) -> str:
    """A non-empty file path (str or os.PathLike) as a str; folders are not checked here.

    >>> check_path("export_chrome_trace", "path", "")
    Traceback (most recent call last):
    ...
    ValueError: export_chrome_trace: path must be a non-empty file path, got ''
    >>> check_path("export_chrome_trace", "path", None)
    Traceback (most recent call last):
    ...
    TypeError: export_chrome_trace: path must be a file path (str or os.PathLike), got NoneType None
    """
    if not isinstance(value, (str, os.PathLike)):
        raise TypeError(f"{where}: {name} must be a file path (str or os.PathLike), "
                        f"got {_shown(value)}")
    text = os.fspath(value)
    if not isinstance(text, str):
        raise TypeError(f"{where}: {name} must be a str path, got {_shown(text)}")
    if not text:
        raise ValueError(f"{where}: {name} must be a non-empty file path, got ''")
    if "\x00" in text:
        raise ValueError(f"{where}: {name} must not contain a NUL character, got {text!r}")
    return text
