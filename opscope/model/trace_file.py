"""Find and read a saved trace file: the JSON document, or one clear error.

A trace is a Chrome trace JSON object with a ``traceEvents`` list, as
opscope and torch.profiler write it, plain or gzip-compressed (detected from
the content, not the name). A folder stands for the newest trace that
``tensorboard_trace_handler`` wrote in it. Every failure is a
:class:`TraceLoadError` whose one-line message names the file and the problem.

Example::

    >>> import json, os, tempfile
    >>> path = os.path.join(tempfile.mkdtemp(), "t.json")
    >>> _ = open(path, "w").write(json.dumps({"traceEvents": []}))
    >>> read_trace_document(path)["traceEvents"]
    []
    >>> read_trace_document(path + ".missing")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    opscope.model.trace_file.TraceLoadError: trace '...t.json.missing': no such file or folder
"""

from __future__ import annotations

import glob
import gzip
import json
import os
import zlib
from typing import Any, Dict

TRACE_PATTERNS = ("*.pt.trace.json", "*.pt.trace.json.gz")
_GZIP_MAGIC = b"\x1f\x8b"


class TraceLoadError(ValueError):
    """A trace that cannot be loaded; the message is one line naming the file.

    >>> str(TraceLoadError("x.json", "not valid JSON"))
    "trace 'x.json': not valid JSON"
    """

    def __init__(self, path: str, problem: str):
        self.path = path
        self.problem = " ".join(str(problem).split())
        super().__init__(f"trace {path!r}: {self.problem}")


def resolve_trace_path(path: "str | os.PathLike[str]") -> str:
    """The file to read for ``path``: itself, or for a folder its newest trace.

    In a folder (as ``tensorboard_trace_handler`` writes), the newest file
    matching ``*.pt.trace.json`` or ``*.pt.trace.json.gz`` is chosen, by
    modification time, then by name (the handler puts a nanosecond clock in it).

    >>> import os, tempfile, time
    >>> folder = tempfile.mkdtemp()
    >>> for name in ("w.1.pt.trace.json", "w.2.pt.trace.json.gz"):
    ...     _ = open(os.path.join(folder, name), "w").write("{}")
    >>> os.path.basename(resolve_trace_path(folder))
    'w.2.pt.trace.json.gz'
    """
    text = os.fspath(path)
    if os.path.isdir(text):
        found = [f for pattern in TRACE_PATTERNS for f in glob.glob(os.path.join(text, pattern))]
        found = [f for f in found if os.path.isfile(f)]
        if not found:
            raise TraceLoadError(text, "folder has no *.pt.trace.json or *.pt.trace.json.gz "
                                       "file (expected a trace file, or a folder written by "
                                       "tensorboard_trace_handler)")
        return max(found, key=lambda f: (os.path.getmtime(f), f))
    if not os.path.exists(text):
        raise TraceLoadError(text, "no such file or folder")
    return text


def read_trace_bytes(path: str) -> bytes:
    """The file's content, decompressed when it is gzip."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as exc:
        raise TraceLoadError(path, f"cannot read it ({exc.strerror or exc})") from None
    if data[:2] != _GZIP_MAGIC:
        return data
    try:
        return gzip.decompress(data)
    except EOFError:
        raise TraceLoadError(path, "truncated gzip file (it ends before the end of the "
                                   "compressed stream; was it still being written?)") from None
    except (OSError, zlib.error) as exc:
        raise TraceLoadError(path, f"corrupt gzip file ({exc})") from None


def read_trace_document(path: "str | os.PathLike[str]") -> Dict[str, Any]:
    """Parse the trace at ``path`` (a file or a folder) into its JSON object.

    The result always has a ``traceEvents`` list. A top-level JSON array (the
    Chrome trace "array format") is accepted as the event list itself.
    """
    file = resolve_trace_path(path)
    data = read_trace_bytes(file)
    if not data.strip():
        raise TraceLoadError(file, "file is empty (expected Chrome trace JSON)")
    try:
        doc = json.loads(data)
    except UnicodeDecodeError:
        raise TraceLoadError(file, "not a trace: the file is not JSON text (binary content)") \
            from None
    except json.JSONDecodeError as exc:
        raise TraceLoadError(file, f"not a trace: not valid JSON ({exc.msg} at line "
                                   f"{exc.lineno} column {exc.colno})") from None
    except RecursionError:
        raise TraceLoadError(file, "not a trace: JSON nested too deeply") from None
    if isinstance(doc, list):
        doc = {"traceEvents": doc}
    if not isinstance(doc, dict):
        raise TraceLoadError(file, f"not a trace: the JSON is a {type(doc).__name__}, "
                                   f"expected an object with a 'traceEvents' list")
    if "traceEvents" not in doc:
        raise TraceLoadError(file, "not a trace: the JSON object has no 'traceEvents' list")
    if not isinstance(doc["traceEvents"], list):
        raise TraceLoadError(file, f"not a trace: 'traceEvents' is a "
                                   f"{type(doc['traceEvents']).__name__}, expected a list")
    return doc
