"""The C trace scanner (load/trace_scan.cpp), built once like the observer, for large traces.

``scanner_for(path)`` gives the scanner's module for a trace file large enough to
be worth it (``SCAN_MIN_BYTES`` on disk, a gzip file an eighth of that), else
None; ``load.read_trace`` passes it to the loader (``load.trace_fast``). Without
a compiler the scanner is not built: one line says so, and json reads every
event, as for small traces.

Example::

    >>> import os, tempfile
    >>> path = os.path.join(tempfile.mkdtemp(), "small.json")
    >>> _ = open(path, "w").write('{"traceEvents": []}')
    >>> scanner_for(path) is None
    True
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Optional

from opscope.collect.native.build import NativeExtension

SCANNER = NativeExtension(Path(__file__).parents[1] / "load" / "trace_scan.cpp",
                          "opscope_trace_scan", "trace scanner",
                          "large traces are read more slowly", takes="a few seconds",
                          torch=False)
SCAN_MIN_BYTES = 8 << 20  # of JSON text: below this, json is about as quick
GZIP_RATIO = 8  # a trace's JSON over its gzip file, at least


def scanner_for(path: str) -> Optional[Any]:
    """The scanner's module to read ``path`` with, or None (small, or not built)."""
    try:
        size = os.stat(path).st_size
    except OSError:
        return None
    if size * (GZIP_RATIO if path.endswith(".gz") else 1) < SCAN_MIN_BYTES:
        return None
    return SCANNER.load()
