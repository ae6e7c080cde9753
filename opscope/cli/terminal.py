"""Text the CLI prints, made safe for a terminal.

Names in a trace come from whoever wrote it: an op named ``"\\x1b]0;...\\x07"``
could retitle the terminal, move the cursor or hide lines, and a JSON
``"\\ud800"`` escape loads as a lone surrogate that no encoder accepts. So
every line the CLI prints goes through :func:`terminal_safe`: control
characters (C0 except newline and tab, DEL, C1) and lone surrogates are
written as Python escapes, and :func:`write_text` encodes with
``backslashreplace`` so an output encoding that lacks a character never
raises. The library's ``table()`` is left as torch's; only the CLI escapes.

Example::

    >>> terminal_safe("aten::\\x1b[31mred\\x1b[0m\\tok\\n")
    'aten::\\\\x1b[31mred\\\\x1b[0m\\tok\\n'
    >>> terminal_safe("bad \\ud800 name")
    'bad \\\\ud800 name'
"""

from __future__ import annotations

import os
import re
import sys
from typing import Optional, TextIO

# C0 controls but tab and newline, DEL, C1 controls, and lone surrogates.
_UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\ud800-\udfff]")


def _escape(match: "re.Match[str]") -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def terminal_safe(text: str) -> str:
    """``text`` with control characters and lone surrogates written as escapes.

    >>> terminal_safe("a\\rb\\x7f\\x85")
    'a\\\\rb\\\\x7f\\\\x85'
    """
    out = _UNSAFE.sub(_escape, str(text))
    return out.replace("\\x0d", "\\r")


def write_text(text: str, stream: Optional[TextIO] = None) -> None:
    """Write ``terminal_safe(text)`` to ``stream`` (stdout), never failing on encoding.

    >>> import io
    >>> buffer = io.StringIO()
    >>> write_text("op \\x1b[2J\\n", buffer)
    >>> buffer.getvalue()
    'op \\\\x1b[2J\\n'
    """
    stream = sys.stdout if stream is None else stream
    safe = terminal_safe(text)
    encoding = getattr(stream, "encoding", None)
    if encoding:
        safe = safe.encode(encoding, "backslashreplace").decode(encoding)
    stream.write(safe)
    stream.flush()



# The status of a command whose reader went away: what a shell reports for SIGPIPE.
CLOSED_PIPE_EXIT = 141


def reader_gone(fd: int) -> bool:
    """True when ``fd`` is a pipe or socket whose reading end was closed.

    >>> r, w = os.pipe(); os.close(r)
    >>> reader_gone(w), reader_gone(w + 1000)
    (True, False)
    >>> os.close(w)
    """
    try:
        import select

        poller = select.poll()
        poller.register(fd, select.POLLOUT)
        events = poller.poll(0)
    except (AttributeError, ValueError, OSError):
        return False
    return any(mask & (select.POLLERR | select.POLLHUP) for _, mask in events)


def silence_closed_streams() -> None:
    """Point stdout, and stderr when its reader is gone too, at ``/dev/null``.

    Called on ``BrokenPipeError`` (``opscope query ... | head``): what the
    command still writes there, and Python's flush at exit, then go nowhere
    instead of raising again or printing "Exception ignored ... BrokenPipeError".
    A stderr still read (a terminal) keeps its messages.
    """
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
    except OSError:
        return
    for stream in (sys.stdout, sys.stderr):
        try:
            fd = stream.fileno()
        except (AttributeError, ValueError, OSError):
            continue  # replaced (a StringIO in a test): nothing to redirect
        if stream is sys.stdout or reader_gone(fd):
            try:
                os.dup2(devnull, fd)
            except OSError:
                pass
    os.close(devnull)
