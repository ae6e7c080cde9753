"""Loading a saved trace for a verb: a progress line, and errors as usage errors.

Example::

    >>> load_trace("/no/such/trace.json")
    Traceback (most recent call last):
    ...
    opscope.cli.errors.UsageError: trace '/no/such/trace.json': no such file or folder
"""

from __future__ import annotations

import os

from typing import Optional

from opscope.cli.errors import UsageError
from opscope.cli.progress import progress
from opscope.cli.terminal import terminal_safe
from opscope.analysis.build import load_session
from opscope.load import TraceLoadError
from opscope.model.session import ProfileSession


def load_trace(path: str, max_bytes: Optional[int] = None) -> ProfileSession:
    """``load_session(path, max_bytes)``; a problem with the file is a one-line :class:`UsageError`.

    ``max_bytes`` is ``--max-trace-size`` (None: ``OPSCOPE_MAX_TRACE_BYTES`` or 4 GiB).
    """
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
