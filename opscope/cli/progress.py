"""A minimal progress line on stderr, shown only when stderr is a terminal.

Nothing appears for work that finishes within ``delay_s``; after that one
line (``opscope: <label>... 3s``) is redrawn in place and erased at the end.
Piped or redirected stderr gets nothing, so logs stay clean.

Example::

    >>> with progress("analysing"):
    ...     pass
"""

from __future__ import annotations

import sys
import threading
import time
from contextlib import contextmanager
from typing import Iterator, TextIO, Optional

DELAY_S = 1.0
REDRAW_S = 1.0


@contextmanager
def progress(label: str, *, stream: Optional[TextIO] = None,
             delay_s: float = DELAY_S) -> Iterator[None]:
    """Show ``label`` with the elapsed seconds while the block runs longer than ``delay_s``."""
    stream = stream if stream is not None else sys.stderr
    try:
        interactive = stream.isatty()
    except (AttributeError, ValueError):
        interactive = False
    if not interactive:
        yield
        return
    done = threading.Event()
    started = time.monotonic()
    drawn = [False]

    def draw() -> None:
        if done.wait(delay_s):
            return
        while True:
            stream.write(f"\ropscope: {label}... {time.monotonic() - started:.0f}s")
            stream.flush()
            drawn[0] = True
            if done.wait(REDRAW_S):
                return

    thread = threading.Thread(target=draw, name="opscope-progress", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()
        if drawn[0]:
            stream.write("\r\033[K")
            stream.flush()
