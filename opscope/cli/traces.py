"""Loading a saved trace or a store for a verb: a progress line, and errors as usage errors.

A store (a folder with ``opscope-store.json``, see ``opscope.store``) is opened with
DuckDB (``open_store``); ``--rank``/``--window`` choose its windows (``add_window_options``,
``opscope.store.session_sql.choose_windows``).

Example::

    >>> load_trace("/no/such/trace.json")
    Traceback (most recent call last):
    ...
    opscope.cli.errors.UsageError: trace '/no/such/trace.json': no such file or folder
    >>> is_store("/no/such/store")
    False
"""

from __future__ import annotations

import argparse
import contextlib
import os

from typing import Iterator, List, Optional

from opscope.cli.errors import UsageError
from opscope.cli.progress import progress
from opscope.cli.terminal import terminal_safe
from opscope.load import TraceLoadError
from opscope.model.session import ProfileSession


def load_trace(path: str, max_bytes: Optional[int] = None) -> ProfileSession:
    """``load_session(path, max_bytes)``; a problem with the file is a one-line :class:`UsageError`.

    ``max_bytes`` is ``--max-trace-size`` (None: ``OPSCOPE_MAX_TRACE_BYTES`` or 4 GiB).
    """
    from opscope.analysis.build import load_session

    label = terminal_safe(os.path.basename(os.path.normpath(path)) or path)
    try:
        with progress(f"loading {label}"):
            return load_session(path, max_bytes=max_bytes)
    except TraceLoadError as exc:
        raise UsageError(str(exc)) from None
    except ValueError as exc:  # a bad OPSCOPE_MAX_TRACE_BYTES
        raise UsageError(str(exc)) from None
    except MemoryError:
        raise UsageError(f"trace {path!r}: not enough memory to load it (lower "
                         f"--max-trace-size to refuse such files quickly)") from None


STORE_MARKER = "opscope-store.json"  # opscope.store.schema.MARKER (not imported: it is lazy)


def is_store(path: str) -> bool:
    """True when ``path`` is a folder with a store's marker file (a store to open)."""
    return os.path.isdir(path) and os.path.lexists(os.path.join(path, STORE_MARKER))


def add_window_options(parser: argparse.ArgumentParser, *, one_window: bool = False) -> None:
    """``--rank R|all`` and ``--window W|all``: which windows of a store a verb reads.

    With ``one_window`` (a verb that shows one window: ``report``) they take a
    number only, and the help offers no ``all``.
    """
    if one_window:
        parser.add_argument(
            "--rank", metavar="R", type=window_number("rank"),
            help="for a store: the rank to read (default: the lowest rank; with two ranks "
                 "or more and neither option, the job's report)")
        parser.add_argument(
            "--window", metavar="W", type=window_number("window"),
            help="for a store: the recorded window to read (default: the rank's newest "
                 "window, as a trace folder's newest trace)")
        return
    parser.add_argument(
        "--rank", metavar="R|all",
        help="for a store: the rank to read, or all (default: the lowest rank)")
    parser.add_argument(
        "--window", metavar="W|all",
        help="for a store: the recorded window to read, or all, added up (default: the "
             "rank's newest window, as a trace folder's newest trace)")


def window_number(what: str):
    """An argparse ``type``: a rank or window number (>= 0), kept as its text.

    >>> window_number("window")("all")
    Traceback (most recent call last):
    ...
    argparse.ArgumentTypeError: expected a window number >= 0 (this command shows one window), got 'all'
    """
    def parse(text: str) -> str:
        if not text.strip().isdigit():
            raise argparse.ArgumentTypeError(
                f"expected a {what} number >= 0 (this command shows one window), got {text!r}")
        return text.strip()
    return parse


def check_no_window_options(args: argparse.Namespace, path: str) -> None:
    """Raise :class:`UsageError` when --rank/--window are given for a trace (not a store)."""
    for name in ("rank", "window"):
        if getattr(args, name, None) is not None:
            raise UsageError(f"argument --{name}: chooses a store's windows; {path!r} is a "
                             f"trace, not a store (a folder with {STORE_MARKER})")


@contextlib.contextmanager
def store_errors(path: str) -> Iterator[None]:
    """Turn a store's errors (StoreError, DuckDB's, memory) into one-line UsageErrors."""
    from opscope.store.schema import StoreError

    try:
        yield
    except StoreError as exc:
        raise UsageError(str(exc)) from None
    except MemoryError:
        raise UsageError(f"store {path!r}: not enough memory to read it") from None
    except Exception as exc:  # duckdb.Error (a damaged Parquet file, ...), imported lazily
        if type(exc).__module__.split(".")[0] not in ("duckdb", "_duckdb"):
            raise
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise UsageError(f"store {path!r}: cannot read it ({first})") from None


def open_store(path: str, memory_limit: Optional[int] = None):
    """``opscope.store.connect(path)`` (a DuckDB connection with the views, its memory
    limited to ``memory_limit`` bytes when given); UsageError if not."""
    from opscope.store import connect

    label = terminal_safe(os.path.basename(os.path.normpath(path)) or path)
    with store_errors(path), progress(f"opening {label}"):
        return connect(path, memory_limit=memory_limit)


def memory_budget(args: argparse.Namespace) -> Optional[int]:
    """The memory a verb's reads of a store may need: ``--memory-limit``, else 80% of the
    machine's (``opscope.store.budget.default_memory_limit``)."""
    from opscope.store.budget import default_memory_limit

    return args.memory_limit if args.memory_limit is not None else default_memory_limit()


def chosen_windows(con, args: argparse.Namespace, path: str) -> List:
    """The store windows ``args.rank``/``args.window`` choose (``choose_windows``)."""
    from opscope.store.session_sql import choose_windows, store_windows

    with store_errors(path):
        return choose_windows(store_windows(con), args.rank, args.window, path)


def store_label(path: str, windows: List) -> str:
    """How messages name the chosen windows: ``store 's' (rank 0, window 1 (step3))``."""
    if len(windows) == 1:
        return f"store {path!r} ({windows[0].label})"
    return f"store {path!r} ({len(windows)} windows)"


def load_store_window(path: str, window, memory_limit: Optional[int] = None
                      ) -> ProfileSession:
    """The session of one store window (``opscope.store.load_store_session``): bounded,
    refused when it would need more than ``memory_limit`` bytes."""
    from opscope.store import load_store_session

    with store_errors(path), progress(f"loading {terminal_safe(window.label)}"):
        return load_store_session(path, window.rank, window.window, memory_limit=memory_limit)
