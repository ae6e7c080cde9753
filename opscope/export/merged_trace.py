"""One Chrome trace of a whole job: every rank's trace as one process, on aligned clocks.

``write_merged_trace(paths, output)`` reads the per-rank traces (opscope's or
torch.profiler's; the rank as ``opscope.analysis.ranks.facts`` finds it) and
writes one trace where rank R is process R, named "rank R" and sorted by R.
Each event keeps its thread and fields; its ``ts`` moves onto a common clock
(the trace's ``baseTimeNanoseconds`` plus its ``opscopeClockOffsetNs``; the
merged trace's ``baseTimeNanoseconds`` is the job's first event, at ts 0), and
flow and async ids are made unique per rank. The traces are read twice
(first for their ranks and clocks, then to stream their events to the
output), in as many processes as there are cores, each holding one trace at
a time, so memory holds a few traces, never the job; the output is written
atomically. Each trace is read by msgspec with its events' ``args`` left as
text, which is copied to the output as it was (``load.lean_events``); a trace
msgspec refuses (an unknown event field, NaN) is parsed whole with json.

Example::

    >>> import json, os, tempfile
    >>> folder = tempfile.mkdtemp()
    >>> for r in (0, 1):
    ...     doc = {"distributedInfo": {"rank": r}, "baseTimeNanoseconds": 1000 * r,
    ...            "traceEvents": [{"ph": "X", "name": "op", "pid": 7, "tid": 7, "ts": 1,
    ...                             "dur": 1}]}
    ...     _ = open(os.path.join(folder, f"t{r}.json"), "w").write(json.dumps(doc))
    >>> out = os.path.join(folder, "merged.json")
    >>> write_merged_trace(trace_paths(folder), out)
    [0, 1]
    >>> [(e["pid"], e["ts"]) for e in json.load(open(out))["traceEvents"] if e["ph"] == "X"]
    [(0, 0.0), (1, 1.0)]
"""

from __future__ import annotations

import json
import os
from functools import partial
from typing import Any, Dict, List, NamedTuple, Optional, Sequence

from opscope.analysis.ranks.checks import RunMark, check_one_run
from opscope.load.ranks import RankTraceError, rank_from_name, trace_paths
from opscope.files import output_file
from opscope.load.lean_events import UNSET, encode_event, read_raw_args_trace
from opscope.load.parallel import default_jobs, map_in_processes
from opscope.load.trace_file import read_trace_bytes, read_trace_document, resolve_trace_path
from opscope.load.trace_scan import OP_CATEGORIES
from opscope.model.torch_names import CLOCK_OFFSET_KEY, DISTRIBUTED_INFO_KEY, MERGED_RANKS_KEY

__all__ = ["write_merged_trace", "trace_paths"]

_OWN_PROCESS_METADATA = ("process_name", "process_sort_index", "process_labels")
_ID_PHASES = frozenset("sftbenSTFpP")  # flow and async events: ids must not clash


class _RankFile(NamedTuple):
    rank: int
    path: str
    clock_ns: int  # add to ts*1000 to get the common clock (Unix ns, rank 0's clock)
    first_ns: Optional[int]
    info: Dict[str, Any]
    process_id: Optional[int]  # its events' pid: a rank's traces of one run share it


def _raw_args_trace(path: str, max_bytes: Optional[int]):
    """The trace read with its args raw (``lean_events``), or None where msgspec refuses it."""
    data = read_trace_bytes(resolve_trace_path(path), max_bytes)
    try:
        return read_raw_args_trace(data)
    except ValueError:
        return None


def _scan(path: str, max_bytes: Optional[int]) -> Optional[_RankFile]:
    """The rank and clock of one trace (None: it names no rank)."""
    raw = _raw_args_trace(path, max_bytes)
    if raw is not None:
        info, base, offset = raw.distributedInfo, raw.baseTimeNanoseconds, \
            raw.opscopeClockOffsetNs
        stamps = [e.ts for e in raw.traceEvents
                  if isinstance(e.ts, (int, float)) and e.ph != "M"]
        pid = next((e.pid for e in raw.traceEvents  # the first host op's, as the loader
                    if isinstance(e.cat, str) and e.cat in OP_CATEGORIES), None)
    else:
        doc = read_trace_document(path, max_bytes)
        info, base, offset = (doc.get(k) for k in (DISTRIBUTED_INFO_KEY,
                                                   "baseTimeNanoseconds", CLOCK_OFFSET_KEY))
        stamps = [e["ts"] for e in doc["traceEvents"] if isinstance(e, dict)
                  and isinstance(e.get("ts"), (int, float)) and e.get("ph") != "M"]
        pid = next((e.get("pid") for e in doc["traceEvents"]
                    if isinstance(e, dict) and e.get("cat") in OP_CATEGORIES), None)
    info = info if isinstance(info, dict) else {}
    rank = info.get("rank")
    rank = rank if type(rank) is int and rank >= 0 else rank_from_name(path)
    if rank is None:
        return None
    clock = (base if type(base) is int else 0) + (offset if type(offset) is int else 0)
    first = clock + int(min(stamps) * 1000) if stamps else None
    return _RankFile(rank, path, clock, first, info, pid if type(pid) is int else None)


def _event(e: Dict[str, Any], rank: int, shift_us: float, n_ranks: int) -> Optional[dict]:
    """``e`` moved into rank ``rank``'s process and onto the common clock (None: drop it)."""
    if e.get("ph") == "M" and e.get("name") in _OWN_PROCESS_METADATA:
        return None
    out = dict(e)
    out["pid"] = rank
    ts = out.get("ts")
    if isinstance(ts, (int, float)) and not isinstance(ts, bool) and out.get("ph") != "M":
        out["ts"] = round(ts + shift_us, 3)
    if out.get("ph") in _ID_PHASES and "id" in out:
        ident = out["id"]
        out["id"] = ident * n_ranks + rank if type(ident) is int else f"rank{rank}:{ident}"
    return out


def _move_raw_args_event(e, rank: int, shift_us: float, n_ranks: int) -> Optional[bytes]:
    """``_event`` of a ``read_raw_args_trace`` event, encoded (None: drop it)."""
    if e.ph == "M" and e.name in _OWN_PROCESS_METADATA:
        return None
    e.pid = rank
    if isinstance(e.ts, (int, float)) and not isinstance(e.ts, bool) and e.ph != "M":
        e.ts = round(e.ts + shift_us, 3)
    if e.ph in _ID_PHASES and e.id is not UNSET:
        e.id = e.id * n_ranks + rank if type(e.id) is int else f"rank{rank}:{e.id}"
    return encode_event(e)


def _process_metadata(rank: int) -> List[dict]:
    return [{"ph": "M", "name": "process_name", "pid": rank, "tid": 0,
             "args": {"name": f"rank {rank}"}},
            {"ph": "M", "name": "process_sort_index", "pid": rank, "tid": 0,
             "args": {"sort_index": rank}}]


def _events_text(f: _RankFile, origin: int, n_ranks: int, max_bytes: Optional[int]) -> bytes:
    """The merged trace's text of one rank file's events (each after a ``,\\n``), UTF-8."""
    shift_us = (f.clock_ns - origin) / 1000
    raw = _raw_args_trace(f.path, max_bytes)
    if raw is not None:
        moved = (_move_raw_args_event(e, f.rank, shift_us, n_ranks) for e in raw.traceEvents)
        return b"".join(b",\n" + text for text in moved if text is not None)
    parts = []
    for e in read_trace_document(f.path, max_bytes)["traceEvents"]:
        event = _event(e, f.rank, shift_us, n_ranks) if isinstance(e, dict) else None
        if event is not None:
            parts.append(",\n" + json.dumps(event))
    return "".join(parts).encode("utf-8")


def write_merged_trace(paths: Sequence[str], output: str, *,
                       max_bytes: Optional[int] = None, jobs: Optional[int] = None) -> List[int]:
    """Merge the rank traces among ``paths`` into ``output``; return the ranks written.

    ``jobs`` processes (default: the cores, ``opscope.load.parallel``) read the
    traces side by side; the output is the same for any number.

    Raises :class:`RankTraceError` when no trace names a rank or the traces mix runs
    (``opscope.analysis.ranks.checks.check_one_run``), and
    ``opscope.load.TraceLoadError`` naming a trace that cannot be read.
    """
    destination = output_file(output, "write_merged_trace", "output")
    jobs = default_jobs() if jobs is None else jobs
    files = [f for f in map_in_processes(partial(_scan, max_bytes=max_bytes), list(paths), jobs)
             if f is not None]
    if not files:
        raise RankTraceError("no trace names its rank (distributedInfo.rank in the trace, "
                             "or rank<R> in the file name)")
    check_one_run([RunMark(f.rank, f.path, f.process_id, f.info.get("world_size")
                           if type(f.info.get("world_size")) is int else None) for f in files])
    files.sort(key=lambda f: (f.rank, f.first_ns if f.first_ns is not None else 0))
    firsts = [f.first_ns for f in files if f.first_ns is not None]
    origin = min(firsts) if firsts else 0
    ranks = sorted({f.rank for f in files})
    n_ranks = max(ranks) + 1
    info = next((f.info for f in files if f.info), {})
    head = {"schemaVersion": 1, "baseTimeNanoseconds": origin,
            "distributedInfo": {k: v for k, v in info.items() if k != "rank"},
            MERGED_RANKS_KEY: ranks}
    with destination.open(binary=True) as out:
        out.write((json.dumps(head)[:-1] + ', "traceEvents": [\n').encode())
        out.write(",\n".join(json.dumps(event) for rank in ranks
                              for event in _process_metadata(rank)).encode())
        texts = partial(_events_text, origin=origin, n_ranks=n_ranks, max_bytes=max_bytes)
        for text in map_in_processes(texts, files, jobs):
            out.write(text)
        out.write(b"\n]}\n")
    return ranks


def default_output(folder: str) -> str:
    """``<folder>.merged.pt.trace.json``: beside the folder, never in it, where the verbs
    that read the folder's traces would meet it.

    >>> default_output("out/"), default_output("runs/job1")
    ('out.merged.pt.trace.json', 'runs/job1.merged.pt.trace.json')
    >>> default_output(".") == os.getcwd() + ".merged.pt.trace.json"
    True
    """
    path = os.path.normpath(folder)
    if os.path.basename(path) in (".", ".."):  # the working folder (or its parent) by name
        path = os.path.abspath(path)
    return path + ".merged.pt.trace.json"
