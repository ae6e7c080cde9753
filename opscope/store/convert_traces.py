"""The conversion loop of ``opscope convert``: traces in order into a store, in 1 or N processes.

``convert_files`` converts planned traces one at a time: stream, build,
reduce to RankFacts, write the window, drop; a rank's collectives after its
last trace. ``convert_in_jobs`` (``--jobs N``) runs it in N processes sharing
one list of ranks.

This process and ``N - 1`` forked workers take whole ranks (all of a rank's
traces, in time order) by number from one shared counter until none is left
(a ``multiprocessing.Queue``'s ``get_nowait`` answers "empty" while a worker
holds the queue's read lock, or before the feeder thread has sent the ranks: this
process then left the work to the workers, and 1,024 ranks on 2 cores ran on one
core), each writing its ranks' partitions into the same store folder with its own
``StoreWriter``;
ranks never share a file, so they cannot collide. The caller writes the marker
when every process is done. A worker's error (a trace that cannot be read)
stops the others after their current rank and is raised here with its message.
Forking shares the imported modules, so each worker adds about one trace's
session to the memory, not a second interpreter's.
"""

from __future__ import annotations

import multiprocessing
import os
import queue
from dataclasses import dataclass, field
from itertools import groupby
from typing import Callable, Dict, List, Optional, Tuple

from opscope.analysis.ranks.facts import RankFacts, rank_facts, session_rank
from opscope.store.schema import StoreError

@dataclass
class ConvertResult:
    """What ``convert`` wrote: the store, its ranks, the windows and events written."""

    store: str
    ranks: List[int] = field(default_factory=list)
    windows: int = 0
    events: int = 0
    traces: List[str] = field(default_factory=list)


@dataclass(order=True)
class PlannedTrace:
    """A trace file and where it goes: its rank (a guess, checked on load) and start."""

    rank: int
    start: float
    path: str


def _convert_one(writer, path: str, max_bytes: Optional[int],
                 python_functions: Optional[str]) -> Tuple[int, RankFacts, int]:
    """Load, reduce and write one trace; (rank, its facts, events written)."""
    from opscope.analysis.build import build_session
    from opscope.load.read import collection_paused, malformed_is_load_error, read_trace_file

    with collection_paused(), malformed_is_load_error(path):
        raw = read_trace_file(path, max_bytes, python_functions)
        session = build_session(raw)
    del raw
    rank = session_rank(session, path)
    rank = 0 if rank is None else rank
    facts = rank_facts(session, path, rank)
    writer.write_window(session, rank=rank, facts=facts,
                        window_name=os.path.basename(path))
    return rank, facts, len(session.table)


def convert_files(store: str, files: List[PlannedTrace], *, max_bytes: Optional[int] = None,
                  python_functions: Optional[str] = None,
                  done: Optional[Callable[[str], None]] = None) -> ConvertResult:
    """Convert ``files`` (in that order) into ``store``, without writing its marker.

    A rank's collectives are written after its last file (a file whose rank
    proves other than planned is still right: the writer merges them).
    """
    from opscope.store.write import StoreWriter

    writer = StoreWriter(store)
    result = ConvertResult(store)
    facts_of: Dict[int, RankFacts] = {}
    for k, item in enumerate(files):
        rank, facts, events = _convert_one(writer, item.path, max_bytes, python_functions)
        if rank in facts_of:
            facts_of[rank].add(facts)
        else:
            facts_of[rank] = facts
        result.windows += 1
        result.events += events
        result.traces.append(item.path)
        if k + 1 == len(files) or files[k + 1].rank != item.rank:
            for r in sorted(facts_of):
                writer.write_collectives(r, facts_of.pop(r))
                result.ranks.append(r)
        if done is not None:
            done(item.path)
    return result




def rank_groups(files: list) -> List[list]:
    """The planned files grouped by rank, the biggest ranks first (for balance).

    >>> P = PlannedTrace
    >>> [[f.path for f in g] for g in rank_groups([P(0, 1, "a"), P(1, 0, "b"), P(0, 2, "c")])]
    [['a', 'c'], ['b']]
    """
    groups = [list(g) for _, g in groupby(sorted(files), key=lambda f: f.rank)]

    def size(group: list) -> int:
        return sum(os.path.getsize(f.path) if os.path.isfile(f.path) else 0 for f in group)

    return sorted(groups, key=size, reverse=True)


def _claim(counter, count: int) -> Optional[int]:
    """The next task's index from the shared ``counter`` (None: all are taken)."""
    with counter.get_lock():
        index = counter.value
        if index >= count:
            return None
        counter.value = index + 1
        return index


def _work(folder: str, groups: List[list], counter, results, failed, max_bytes: Optional[int],
          python_functions: Optional[str], done: Optional[Callable[[str], None]]):
    """Convert the ranks of ``groups`` claimed from ``counter`` until none is left; the
    results, or an error, to ``results``."""
    while not failed.is_set():
        index = _claim(counter, len(groups))
        if index is None:
            return
        try:
            result = convert_files(folder, groups[index], max_bytes=max_bytes,
                                   python_functions=python_functions, done=done)
        except Exception as exc:  # reported to the parent, which raises it
            failed.set()
            results.put(("error", type(exc).__name__, str(exc)))
            return
        results.put(("ok", result.ranks, result.windows, result.events, result.traces))


def convert_in_jobs(folder: str, files: list, jobs: int, max_bytes: Optional[int],
                    python_functions: Optional[str], done: Optional[Callable[[str], None]]):
    """Convert ``files`` into ``folder`` in ``jobs`` processes; the merged ConvertResult."""
    context = multiprocessing.get_context("fork")
    results, failed = context.Queue(), context.Event()
    groups = rank_groups(files)  # the workers inherit them; each claims the next by number
    counter = context.Value("i", 0)
    workers = [context.Process(target=_work, args=(folder, groups, counter, results, failed,
                                                   max_bytes, python_functions, None),
                               daemon=True) for _ in range(min(jobs, len(groups)) - 1)]
    for w in workers:
        w.start()
    try:
        _work(folder, groups, counter, results, failed, max_bytes, python_functions, done)
        items = []
        while any(w.is_alive() for w in workers) or not results.empty():
            try:
                items.append(results.get(timeout=0.2))
            except queue.Empty:
                pass
    finally:
        failed.set()
        for w in workers:
            w.join()
    out = ConvertResult(folder)
    for item in items:
        if item[0] == "error":  # a TraceLoadError's message names the trace already
            raise StoreError(item[2])
        out.ranks += item[1]
        out.windows += item[2]
        out.events += item[3]
        out.traces += item[4]
    if any(w.exitcode for w in workers):
        raise StoreError(f"a convert worker died (exit codes {[w.exitcode for w in workers]}); "
                         f"the store was not written")
    out.ranks.sort()
    return out
