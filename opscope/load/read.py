"""Read a saved trace file (or the newest in a folder) into a RawSession.

>>> import json, os, tempfile
>>> path = os.path.join(tempfile.mkdtemp(), "t.json")
>>> _ = open(path, "w").write(json.dumps({"traceEvents": [
...     {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 2,
...      "ts": 1, "dur": 5}]}))
>>> raw = read_trace(path)
>>> raw.names, raw.source_path == path, raw.collector
(['aten::mm'], True, 'trace')
"""

from __future__ import annotations

import gc
import os
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Optional

from opscope.arguments import check_choice
from opscope.load.raw_black_box import is_raw_black_box, read_raw_black_box
from opscope.load.trace_events import PYTHON_FUNCTION_RULES
from opscope.load.trace_file import TraceLoadError, resolve_trace_path
from opscope.load.trace_stream import stream_trace
from opscope.model.records import RawSession


def read_trace(path: "str | os.PathLike[str]", *, max_bytes: Optional[int] = None,
               python_functions: Optional[str] = None, lean: bool = False,
               scanner: Optional[Callable[[str], Any]] = None) -> RawSession:
    """The RawSession of the trace at ``path`` (a file, or a folder's newest trace).

    ``python_functions`` overrides the rule for ``python_function`` events
    (one of "absent", "counted", "hidden"); None applies the rule of the torch
    that wrote the trace. Raises :class:`TraceLoadError` naming the file for
    anything wrong with it (see ``trace_file``). The file is read in bounded
    memory (``trace_stream``): the events' columns plus one batch of JSON.
    ``lean`` reads the args of the collectives only (``trace_columns``).
    ``scanner(file)``: the C trace scanner to read that file with, or None
    (``trace_fast``; ``analysis.trace_reading`` builds it).
    """
    check_choice("load_session", "python_functions", python_functions,
                 (None,) + PYTHON_FUNCTION_RULES)
    return read_trace_file(resolve_trace_path(path), max_bytes, python_functions, lean,
                           scanner)


def read_trace_file(file: str, max_bytes: Optional[int] = None,
                    python_functions: Optional[str] = None, lean: bool = False,
                    scanner: Optional[Callable[[str], Any]] = None) -> RawSession:
    """``read_trace`` of a file already resolved: a black box's crash dump (the ring as the
    crash left it, ``raw_black_box``), else a trace read in bounded memory."""
    if is_raw_black_box(file):
        return read_raw_black_box(file, max_bytes)
    with collection_paused(), malformed_is_load_error(file):
        return stream_trace(file, max_bytes, python_functions, lean,
                            scanner(file) if scanner is not None else None)


@contextmanager
def malformed_is_load_error(file: str) -> Iterator[None]:
    """A value of a type or range the loader did not foresee is still a TraceLoadError.

    The checks in ``trace_events`` name the field for what real traces get
    wrong; this net keeps any other oddity (found by fuzzing) from escaping
    as a bare TypeError or OverflowError.

    >>> with malformed_is_load_error("t.json"):
    ...     int("x")
    Traceback (most recent call last):
    ...
    opscope.load.trace_file.TraceLoadError: trace 't.json': malformed trace: a field has \
an unexpected type or value (ValueError: invalid literal for int() with base 10: 'x')
    """
    try:
        yield
    except TraceLoadError:
        raise
    except (TypeError, ValueError, OverflowError, AttributeError, KeyError, IndexError,
            RecursionError) as exc:
        raise TraceLoadError(file, f"malformed trace: a field has an unexpected type or "
                                   f"value ({type(exc).__name__}: {exc})") from exc


@contextmanager
def collection_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector while millions of JSON objects are made.

    They form no cycles, yet each allocation burst triggers full collections
    over the growing heap: pausing halves the time to parse a large trace.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
