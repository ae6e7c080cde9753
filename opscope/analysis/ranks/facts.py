"""Per-rank traces of a torch.distributed job, each reduced to the facts ``analyse_ranks`` needs.

``load_ranks(folder_or_paths)`` reads every ``.json``/``.json.gz`` trace of a
folder (or the paths given), opscope's or torch.profiler's: ``opscope.load.ranks``
finds the files, ``opscope.analysis.build.load_session`` reads each (through
``opscope.load``), and this module reduces the sessions. A trace's rank is
``distributedInfo.rank`` in its metadata, else the ``rank<R>`` in its file name
(``train.rank3.pt.trace.json``); a trace with neither is not a rank's and is
skipped. A rank with several traces (one per schedule window or step) is all
of them, in time order: their steps, times and collectives add up, so the
per-group collective ordinals continue across windows (every rank records the
same steps with a schedule).

Each trace is loaded, reduced to a :class:`RankFacts` and dropped before the
next one is read, so memory holds one trace at a time. Traces of two runs, a
rank past its world size and times that overflow are refused
(``opscope.analysis.ranks.checks``). Times are aligned Unix
ns: the session's time plus the trace's ``opscopeClockOffsetNs`` (0 when
absent: ranks on one host share a clock).

Example::

    >>> facts = RankFacts(2, ["train.rank2.json"], world_size=4)
    >>> facts.group, facts.steps  # the default process group, no steps yet
    ('0', 0)
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from functools import partial
from typing import Callable, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

from opscope.model.arrays import distinct
from opscope.analysis.collectives import CollectiveCall, collective_calls, collective_kind
from opscope.analysis.ranks.checks import (RunMark, check_one_run, check_rank_number,
                                           check_times)
from opscope.analysis.flight_recorder import group_ranks
from opscope.analysis.intervals import difference, intersection, total, union
from opscope.load.ranks import RankTraceError, rank_from_name, trace_paths
from opscope.model.records import FLAG_PYTHON_FUNCTION, SCOPE_USER
from opscope.model.session import ProfileSession
from opscope.model.torch_names import (C10D_PREFIX, CLOCK_OFFSET_KEY, COLLECTIVE_RANGE_PREFIXES,
                                       DISTRIBUTED_INFO_KEY, OPTIMIZER_STEP_PREFIX,
                                       PROFILER_STEP_PREFIX)

DEFAULT_GROUP = "0"  # torch's name of the default process group


@dataclass
class RankFacts:
    """What one rank's traces say, reduced: steps, times (ns) and its collectives in order.

    >>> facts = RankFacts(3, ["a.json"], steps=2, step_ns=10)
    >>> facts.add(RankFacts(3, ["b.json"], steps=1, step_ns=6))
    >>> facts.paths, facts.steps, facts.step_ns
    (['a.json', 'b.json'], 3, 16)
    """

    rank: int
    paths: List[str] = field(default_factory=list)
    world_size: Optional[int] = None
    group: str = DEFAULT_GROUP  # the process group its collectives are matched in
    # process group name -> its member ranks (distributedInfo.pg_config), where known
    group_ranks: Dict[str, List[int]] = field(default_factory=dict)
    steps: int = 0
    step_ns: int = 0  # the steps' durations, summed
    compute_ns: int = 0
    comm_ns: int = 0
    overlap_ns: int = 0  # compute while a collective is in flight
    start_ns: Optional[int] = None  # first and last event, aligned Unix ns
    end_ns: Optional[int] = None
    calls: List[CollectiveCall] = field(default_factory=list)
    process_id: Optional[int] = None  # the rank's process (its trace's pid), where known

    def add(self, other: "RankFacts") -> None:
        """Append a later window of the same rank."""
        self.paths += other.paths
        self.world_size = self.world_size or other.world_size
        for name in ("steps", "step_ns", "compute_ns", "comm_ns", "overlap_ns"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        starts = [t for t in (self.start_ns, other.start_ns) if t is not None]
        ends = [t for t in (self.end_ns, other.end_ns) if t is not None]
        self.start_ns = min(starts) if starts else None
        self.end_ns = max(ends) if ends else None
        self.calls = sorted(self.calls + other.calls, key=lambda c: c.arrival_ns)


def _json_meta(session: ProfileSession, key: str):
    text = session.metadata.get(key)
    try:
        return json.loads(text) if text is not None else None
    except ValueError:
        return None


def _distributed_info(session: ProfileSession) -> Dict:
    info = _json_meta(session, DISTRIBUTED_INFO_KEY)
    return info if isinstance(info, dict) else {}


def session_rank(session: ProfileSession, path: str) -> Optional[int]:
    """``distributedInfo.rank`` of the session, else the file name's ``rank<R>``, else None.

    >>> from opscope.model.events import EventTable
    >>> from opscope.model.records import RawSession
    >>> s = ProfileSession(EventTable.from_raw(RawSession.empty()))
    >>> session_rank(s, "x.rank2.json"), s.metadata.update(distributedInfo='{"rank": 5}')
    (2, None)
    >>> session_rank(s, "x.rank2.json"), clock_offset_ns(s)
    (5, 0)
    """
    rank = _distributed_info(session).get("rank")
    if type(rank) is int and rank >= 0:
        return rank
    return rank_from_name(path)


def clock_offset_ns(session: ProfileSession) -> int:
    """The trace's ``opscopeClockOffsetNs`` (an int), 0 when absent or not an integer.

    >>> from opscope.model.events import EventTable
    >>> from opscope.model.records import RawSession
    >>> s = ProfileSession(EventTable.from_raw(RawSession.empty()))
    >>> s.metadata[CLOCK_OFFSET_KEY] = "-1500"
    >>> clock_offset_ns(s)
    -1500
    """
    value = _json_meta(session, CLOCK_OFFSET_KEY)
    return value if type(value) is int else 0


def _steps(session: ProfileSession) -> Tuple[int, int]:
    """(steps, summed step ns): ProfilerStep ranges, else optimizer steps, else the window."""
    table = session.table
    if len(table) == 0:
        return 0, 0
    for prefix in (PROFILER_STEP_PREFIX, OPTIMIZER_STEP_PREFIX):
        rows = np.flatnonzero(table.named_like(prefix))
        if len(rows) and prefix == PROFILER_STEP_PREFIX:
            return len(rows), int((table.end_ns[rows] - table.start_ns[rows]).sum())
        if len(rows):  # optimizer steps: from the first event to the last step's end
            return len(rows), int(table.end_ns[rows].max() - table.start_ns.min())
    return 1, int(table.end_ns.max() - table.start_ns.min())


def _times(session: ProfileSession, names: List[str], calls: List[CollectiveCall],
           shift: int) -> Tuple[int, int, int]:
    """(compute, communication, overlap) ns of the session; ``shift`` aligns its clock.

    Communication: a collective in flight, from its arrival to its end. Compute:
    CPU ops (not ranges, not Python functions) outside the backend's worker
    threads and outside the dispatcher's collective ops, which block or enqueue.
    """
    table = session.table
    coll_ids = [i for i, n in enumerate(names) if collective_kind(n) is not None]
    range_ids = [i for i in coll_ids if names[i].startswith(COLLECTIVE_RANGE_PREFIXES)]
    c10d_ids = [i for i in coll_ids if names[i].startswith(C10D_PREFIX)]
    ops = (table.scope != SCOPE_USER) & ((table.flags & FLAG_PYTHON_FUNCTION) == 0)
    if coll_ids:  # (10M rows: each membership test or copy below costs 30-50 ms)
        ops &= ~np.isin(table.name_id, coll_ids)
    if range_ids:
        workers = distinct(table.thread_index[np.isin(table.name_id, range_ids)])
        ops &= ~np.isin(table.thread_index, workers)
    compute = union(*_rows(table, ops))
    if c10d_ids:
        compute = difference(compute, union(*_rows(table, np.isin(table.name_id, c10d_ids))))
    # in the session's clock: the calls are few, the compute intervals may be millions
    comm = union(np.array([c.arrival_ns - shift for c in calls], dtype=np.int64),
                 np.array([c.end_ns - shift for c in calls], dtype=np.int64))
    return total(compute), total(comm), total(intersection(compute, comm))


def _rows(table, mask: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """(start_ns, end_ns) of the rows of ``table`` that ``mask`` keeps (no copy for all)."""
    if bool(mask.all()):
        return table.start_ns, table.end_ns
    return table.start_ns[mask], table.end_ns[mask]


def rank_facts(session: ProfileSession, path: str, rank: int) -> RankFacts:
    """The facts of one rank's trace; RankTraceError for a rank or times out of bounds."""
    offset = clock_offset_ns(session)
    check_times(path, session, offset)
    info = _distributed_info(session)
    groups = info.get("pg_config")
    group = DEFAULT_GROUP
    if isinstance(groups, list) and groups and isinstance(groups[0], dict):
        group = str(groups[0].get("pg_name", DEFAULT_GROUP))
    world = info.get("world_size")
    world = world if type(world) is int else None
    check_rank_number(path, rank, world)
    names = session.table.symbols.names
    calls = collective_calls(session, offset)
    steps, step_ns = _steps(session)
    table = session.table
    shift = session.epoch_offset_ns + offset
    compute, comm, overlap = _times(session, names, calls, shift)
    return RankFacts(
        rank, [path], world, group,
        {name: list(ranks) for name, ranks in group_ranks(session.metadata).items()},
        steps, step_ns, compute, comm, overlap,
        int(table.start_ns.min()) + shift if len(table) else None,
        int(table.end_ns.max()) + shift if len(table) else None, calls,
        session.process_id or None)


def _path_facts(path: str, max_bytes: Optional[int],
                visit: Optional[Callable[[int, str, ProfileSession], None]]
                ) -> Optional[RankFacts]:
    """The facts of one trace (None: it names no rank); ``visit`` sees its session.

    Without ``visit``, only the collectives' args are read (a lean load).
    """
    from opscope.analysis.build import load_session

    session = load_session(path, max_bytes=max_bytes, lean=visit is None)
    rank = session_rank(session, path)
    if rank is None:
        return None
    facts = rank_facts(session, path, rank)
    if visit is not None:
        visit(rank, path, session)
    return facts  # the session goes here (unless visit keeps it)


def load_ranks(folder_or_paths: Union[str, "os.PathLike[str]", Sequence[str]], *,
               max_bytes: Optional[int] = None,
               visit: Optional[Callable[[int, str, ProfileSession], None]] = None,
               jobs: int = 1) -> List[RankFacts]:
    """The facts of each rank's traces in ``folder_or_paths``, by rank.

    Each trace is loaded once and dropped before the next one; ``visit(rank,
    path, session)``, when given, sees every rank's session while it is loaded.
    Without ``visit``, ``jobs`` processes read the traces side by side
    (``opscope.load.parallel``), each holding one trace at a time.

    Raises :class:`RankTraceError` when there is no trace or no trace names a
    rank, and :class:`opscope.load.TraceLoadError` naming a file that cannot
    be read as a trace.

    >>> load_ranks([])
    Traceback (most recent call last):
    ...
    opscope.load.ranks.RankTraceError: no rank traces given
    """
    from opscope.load.parallel import map_in_processes

    paths = trace_paths(folder_or_paths)
    windows: Dict[int, List[RankFacts]] = {}
    read = partial(_path_facts, max_bytes=max_bytes, visit=visit)
    for facts in map_in_processes(read, paths, jobs if visit is None else 1):
        if facts is not None:
            windows.setdefault(facts.rank, []).append(facts)
    for facts_list in windows.values():  # a rank's windows in time order, as in a store
        facts_list.sort(key=lambda f: (f.start_ns is None, f.start_ns or 0))
    check_one_run([RunMark(r, f.paths[0], f.process_id, f.world_size)
                   for r, facts_list in windows.items() for f in facts_list])
    by_rank: Dict[int, RankFacts] = {}
    for rank, facts_list in windows.items():
        by_rank[rank] = facts_list[0]
        for later in facts_list[1:]:
            by_rank[rank].add(later)
    if not by_rank:
        where = repr(os.fspath(folder_or_paths)) if isinstance(
            folder_or_paths, (str, os.PathLike)) else "the paths given"
        raise RankTraceError(
            "no rank traces given" if not paths else
            f"{where}: no trace names its rank (distributedInfo.rank in the trace, or "
            f"rank<R> in the file name)")
    return [by_rank[r] for r in sorted(by_rank)]
