"""Output formats' writers: one module each, each writing to an open stream.

The registry of formats (``opscope.outputs.FORMATS``) sits above this package
and ``opscope.report``: it checks and opens the destination once
(``opscope.files``) and hands the writer the stream. The path-taking functions
here (``write_chrome_trace``, ``write_stacks``) open their path through the
same ``opscope.files.output_file``. export/ and report/ never import each other.

Example::

    >>> import io
    >>> from opscope.analysis.build import build_session
    >>> from opscope.model.records import RawSession
    >>> out = io.StringIO()
    >>> stacks_to(build_session(RawSession.empty()), out)
    >>> out.getvalue()
    ''
"""

from __future__ import annotations

from opscope.export.chrome_trace import chrome_trace_to, write_chrome_trace
from opscope.export.stacks import stacks_to, write_stacks

__all__ = ["chrome_trace_to", "stacks_to", "write_chrome_trace", "write_stacks"]
