"""Merged job traces (``opscope merge``): found from a file's first bytes, never read as a rank.

A merged trace holds every rank of a job as its own process: it is for trace
viewers (chrome://tracing, Perfetto). Read as one trace it would add the ranks
up, and read as a rank it would be a rank of its own. So every verb treats it
the same way: inside a folder it is skipped, and named on its own it is refused
(``resolve_trace_path``) with a line that says what to give instead. Its mark is
the ``opscopeMergedRanks`` key, written before ``traceEvents``.

Example::

    >>> import json, os, tempfile
    >>> path = os.path.join(tempfile.mkdtemp(), "m.json")
    >>> _ = open(path, "w").write(json.dumps({"opscopeMergedRanks": [0, 1], "traceEvents": []}))
    >>> merged_ranks(path)
    [0, 1]
    >>> merged_ranks(path + ".missing") is None
    True
"""

from __future__ import annotations

import gzip
import json
import os
import re
import stat
import zlib
from typing import List, Optional

from opscope.model.torch_names import MERGED_RANKS_KEY

HEAD_BYTES = 1 << 16  # the keys before traceEvents: a merge writes its mark there
_MARK = re.compile(r'"' + MERGED_RANKS_KEY + r'"\s*:\s*(\[[0-9,\s]*\])')


def merged_ranks(path: str) -> Optional[List[int]]:
    """The ranks of the merged trace at ``path``; None when it is not one (or unreadable)."""
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            return None  # a FIFO or a device: never opened here (the loader refuses it)
        with open(path, "rb") as f:
            head = f.read(HEAD_BYTES)
            if head[:2] == b"\x1f\x8b":
                f.seek(0)
                with gzip.GzipFile(fileobj=f) as inflated:
                    head = inflated.read(HEAD_BYTES)
    except (OSError, EOFError, zlib.error):
        return None
    text = head.decode("utf-8", "replace")
    events_at = text.find('"traceEvents"')
    match = _MARK.search(text, 0, events_at if events_at >= 0 else len(text))
    if match is None:
        return None
    try:
        return [int(r) for r in json.loads(match.group(1))]
    except ValueError:
        return None


def merged_problem(ranks: List[int]) -> str:
    """What a verb says when it is given a merged trace.

    >>> merged_problem([0, 1])[:48]
    'a merged trace of ranks 0, 1 (opscope merge), fo'
    """
    return (f"a merged trace of ranks {', '.join(map(str, ranks))} (opscope merge), for "
            f"trace viewers; give the per-rank traces or their folder")
