"""Loading a saved trace for a verb: a progress line, and errors as usage errors.

Example::

    >>> load_trace("/no/such/trace.json")
    Traceback (most recent call last):
    ...
    opscope.cli.errors.UsageError: trace '/no/such/trace.json': no such file or folder
"""

from __future__ import annotations

import os

from opscope.cli.errors import UsageError
from opscope.cli.progress import progress
from opscope.analysis.trace_loader import LoadedSession, TraceLoadError, load_session


def load_trace(path: str) -> LoadedSession:
    """``load_session(path)``; a problem with the file becomes a one-line :class:`UsageError`."""
    try:
        with progress(f"loading {os.path.basename(os.path.normpath(path)) or path}"):
            return load_session(path)
    except TraceLoadError as exc:
        raise UsageError(str(exc)) from None
    except MemoryError:
        raise UsageError(f"trace {path!r}: not enough memory to load it") from None
