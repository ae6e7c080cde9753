"""How the command line fails: one line on stderr and exit status 2.

``UsageError`` is raised for anything the user can fix by changing the
command: a bad option, a missing script, an output folder that cannot be
written. ``main`` turns it into ``opscope: error: <message>``.

Example::

    >>> str(UsageError("script 'train.py' not found"))
    "script 'train.py' not found"
"""

from __future__ import annotations

import argparse
import sys
from typing import NoReturn

USAGE_EXIT = 2


class UsageError(Exception):
    """A mistake in the command line; the message names the argument or file."""


def print_error(message: str) -> None:
    """Write ``opscope: error: <message>`` as a single line on stderr.

    Control characters and lone surrogates (from a file name or a trace) are
    printed as escapes, so the line cannot drive the terminal.

    >>> import contextlib, io
    >>> err = io.StringIO()
    >>> with contextlib.redirect_stderr(err):
    ...     print_error("trace 'a\\x1b[2Jb.json': bad")
    >>> err.getvalue()
    "opscope: error: trace 'a\\\\x1b[2Jb.json': bad\\n"
    """
    from opscope.cli.terminal import write_text

    one_line = " ".join(str(message).split())
    write_text(f"opscope: error: {one_line}\n", sys.stderr)


class OneLineParser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line, without the usage block.

    >>> parser = OneLineParser(prog="opscope demo")
    >>> _ = parser.add_argument("--steps", type=int)
    >>> parser.parse_args(["--steps", "x"])
    Traceback (most recent call last):
    ...
    SystemExit: 2
    """

    def error(self, message: str) -> NoReturn:
        print_error(f"{message} (see '{self.prog} --help')")
        sys.exit(USAGE_EXIT)
