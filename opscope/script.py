"""Run a Python file as ``__main__``, the way ``python script.py args...`` would.

``sys.argv`` becomes ``[script, *args]`` and ``sys.path[0]`` the script's
folder; both are restored afterwards. The script's ending is kept as a
:class:`ScriptOutcome`: its exit status, and ``report()`` printing what
Python would print at exit (the traceback, trimmed to the script's frames, or
the ``sys.exit("message")`` text).

Example::

    >>> import os, tempfile
    >>> path = os.path.join(tempfile.mkdtemp(), "hello.py")
    >>> _ = open(path, "w").write("import sys; sys.exit(len(sys.argv))")
    >>> run_script(path, ["a", "b"]).exit_code
    3
"""

from __future__ import annotations

import os
import runpy
import sys
import traceback
from contextlib import contextmanager
from types import TracebackType
from typing import Callable, Iterator, List, NamedTuple, Optional

SIGINT_EXIT = 130


class ScriptOutcome(NamedTuple):
    """How the script ended: its exit status and what to print about it."""

    exit_code: int
    report: Callable[[], None]


def _nothing() -> None:
    pass


@contextmanager
def script_environment(path: str, args: List[str]) -> Iterator[None]:
    """Set ``sys.argv`` and ``sys.path[0]`` for ``path``; restore both afterwards."""
    saved_argv, saved_path = sys.argv, list(sys.path)
    sys.argv = [path, *args]
    folder = os.path.dirname(os.path.abspath(path))
    if sys.path:
        sys.path[0] = folder
    else:
        sys.path.append(folder)
    try:
        yield
    finally:
        sys.argv = saved_argv
        sys.path[:] = saved_path


def _from_script(tb: Optional[TracebackType], path: str) -> Optional[TracebackType]:
    """The traceback from the script's first frame on (ours and runpy's dropped)."""
    target = os.path.abspath(path)
    while tb is not None and os.path.abspath(tb.tb_frame.f_code.co_filename) != target:
        tb = tb.tb_next
    return tb


def _exit_outcome(code: object) -> ScriptOutcome:
    if code is None:
        return ScriptOutcome(0, _nothing)
    if isinstance(code, int):
        return ScriptOutcome(code, _nothing)

    def report() -> None:  # sys.exit("text") prints the text and exits 1, as Python does
        print(code, file=sys.stderr, flush=True)

    return ScriptOutcome(1, report)


def syntax_error(path: str) -> Optional[str]:
    """Python's own message when ``path`` does not compile (as ``python path`` prints it), else None.

    >>> import os, tempfile
    >>> bad = os.path.join(tempfile.mkdtemp(), "bad.py")
    >>> _ = open(bad, "w").write("x = (\\n")
    >>> print(syntax_error(bad).splitlines()[-1])
    SyntaxError: '(' was never closed
    """
    try:
        with open(path, "rb") as f:
            source = f.read()
        compile(source, path, "exec", dont_inherit=True)
    except (SyntaxError, ValueError) as exc:  # ValueError: null bytes in the source
        return "".join(traceback.format_exception_only(type(exc), exc)).rstrip("\n")
    except OSError:
        return None  # unreadable: running it reports that as Python would
    return None


def run_script(path: str, args: List[str]) -> ScriptOutcome:
    """Run ``path`` as ``__main__`` with ``args``; never raises for the script's own errors."""
    try:
        with script_environment(path, args):
            runpy.run_path(path, run_name="__main__")
    except SystemExit as exc:
        return _exit_outcome(exc.code)
    except BaseException as exc:  # noqa: B902 -- the script's error is reported, not ours
        error = exc.with_traceback(_from_script(exc.__traceback__, path))
        code = SIGINT_EXIT if isinstance(error, KeyboardInterrupt) else 1

        def report() -> None:
            sys.stdout.flush()
            sys.excepthook(type(error), error, error.__traceback__)
            sys.stderr.flush()

        return ScriptOutcome(code, report)
    return ScriptOutcome(0, _nothing)
