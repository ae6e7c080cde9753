"""A job's rank trace files: which files of a folder are rank traces, and the rank each names.

``opscope.analysis.ranks`` analyses what these files hold; this module only finds them
and reads no more of one than its head:

- :func:`trace_paths`: the ``.json``/``.json.gz`` traces of a folder (or the paths
  given), a merged job trace (``opscope merge``) and ``opscope run``'s hang report
  (``HANG_FILE``) left out;
- :func:`rank_from_name`: the ``rank<R>`` in a file name (``train.rank3.pt.trace.json``);
- :func:`peek_rank`: the rank a trace names, from its name or the head of the file.

Each failure is a :class:`RankTraceError` (the CLI prints it as one line and exits 2).

Example::

    >>> rank_from_name("out/train.rank12.step3.pt.trace.json"), rank_from_name("t.json")
    (12, None)
"""

from __future__ import annotations

import os
import re
from typing import List, Optional, Sequence, Union

from opscope.load.merged import merged_problem, merged_ranks
from opscope.load.trace_file import TraceLoadError, iter_trace_chunks
from opscope.model.torch_names import DISTRIBUTED_INFO_KEY

TRACE_SUFFIXES = (".json", ".json.gz")
HANG_FILE = "hang.json"  # opscope run's report of a hang, beside the traces: not a trace
PEEK_BYTES = 1 << 16
_RANK_IN_NAME = re.compile(r"(?:^|[._-])rank[_-]?(\d+)(?=[._-]|$)")
_PEEKED_RANK = re.compile(r'"' + DISTRIBUTED_INFO_KEY + r'"\s*:\s*\{[^{}]*?"rank"\s*:\s*(\d+)')


class RankTraceError(ValueError):
    """A folder or path list without rank traces, or a rank's traces that disagree."""


def rank_from_name(path: str) -> Optional[int]:
    """The R of a ``rank<R>`` in the file name, or None."""
    match = _RANK_IN_NAME.search(os.path.basename(path))
    return int(match.group(1)) if match else None


def trace_paths(folder_or_paths: Union[str, "os.PathLike[str]", Sequence[str]]) -> List[str]:
    """The trace files of a folder (sorted), or the paths given; raises RankTraceError.

    A folder's merged job traces (``opscope merge``) are left out.

    >>> trace_paths("/no/such/folder")
    Traceback (most recent call last):
    ...
    opscope.load.ranks.RankTraceError: '/no/such/folder': no such file or folder
    """
    if isinstance(folder_or_paths, (str, os.PathLike)):
        folder = os.fspath(folder_or_paths)
        if os.path.isfile(folder):
            return [_not_merged(folder)]
        if not os.path.isdir(folder):
            raise RankTraceError(f"{folder!r}: no such file or folder")
        paths = sorted(os.path.join(folder, name) for name in os.listdir(folder)
                       if name.endswith(TRACE_SUFFIXES) and not name.startswith(".")
                       and name != HANG_FILE)  # opscope run's hang report is no trace
        if not paths:
            raise RankTraceError(f"folder {folder!r} has no .json or .json.gz traces")
        kept = [p for p in paths if merged_ranks(p) is None]  # every verb skips merged ones
        if not kept:
            raise RankTraceError(f"folder {folder!r} holds only merged traces (opscope "
                                 f"merge), which are for trace viewers; give rank traces")
        return kept
    return [_not_merged(os.fspath(p)) for p in folder_or_paths]


def _not_merged(path: str) -> str:
    """``path``, unless it is a merged job trace: that is refused, naming it."""
    ranks = merged_ranks(path)
    if ranks is not None:
        raise RankTraceError(f"trace {path!r}: {merged_problem(ranks)}")
    return path


def peek_rank(path: str) -> Optional[int]:
    """The rank a trace names, from its file name or the head of the file; None if neither.

    Reads at most ``PEEK_BYTES`` (inflated), through ``opscope.load``'s checks
    (a FIFO or a device is not opened for reading), never the whole trace: a trace
    whose ``distributedInfo`` sits later is only found by loading it.

    >>> import os, tempfile
    >>> path = os.path.join(tempfile.mkdtemp(), "t.json")
    >>> _ = open(path, "w").write('{"distributedInfo": {"backend": "gloo", "rank": 3}}')
    >>> peek_rank(path), peek_rank("/no/such/w.rank2.json"), peek_rank("/no/such.json")
    (3, 2, None)
    """
    rank = rank_from_name(path)
    if rank is not None:
        return rank
    chunks = iter_trace_chunks(path, chunk_bytes=PEEK_BYTES)  # load's checks: no FIFO, no bomb
    try:
        head = next(chunks, b"").decode("utf-8", "replace")
    except TraceLoadError:
        return None  # the loader names the problem when the trace is read
    finally:
        chunks.close()
    match = _PEEKED_RANK.search(head)
    return int(match.group(1)) if match else None
