"""Saved traces as a source, beside the live collector (``opscope.collect``).

A trace written by opscope or by torch.profiler (a ``.json`` or ``.json.gz``
Chrome trace, or a ``tensorboard_trace_handler`` folder) becomes the same
``RawSession`` a collector produces, with what only a file has (its path,
thread names, its own stacks and FLOPs). ``opscope.analysis.build`` turns it
into a session exactly as it does a live recording: ``load_session(path)``.

- ``trace_file``: find, size-check and parse the file (plain or gzip);
- ``trace_stream``: read the file in bounded memory, ``traceEvents`` in batches;
- ``trace_scan``: one pass over a batch of events, sorted by kind;
- ``trace_columns``: the batches' op events gathered into columns;
- ``trace_events``: the columns as records;
- ``trace_inputs``: recorded input shapes, types and values, re-encoded;
- ``trace_settings``: options, metadata, memory records, marks and modules;
- ``read``: ``read_trace(path) -> RawSession``.

>>> from opscope.model.records import RawSession
>>> callable(read_trace), TraceLoadError.__mro__[1] is ValueError
(True, True)
"""

from opscope.load.read import read_trace
from opscope.load.trace_events import PYTHON_FUNCTION_RULES
from opscope.load.trace_file import TraceLoadError, resolve_trace_path

__all__ = ["PYTHON_FUNCTION_RULES", "TraceLoadError", "read_trace", "resolve_trace_path"]
