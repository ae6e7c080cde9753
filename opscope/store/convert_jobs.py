"""``opscope convert --jobs N``: ranks converted in N processes sharing one task queue.

This process and ``N - 1`` forked workers take whole ranks (all of a rank's
traces, in time order) from one queue until it is empty, each writing its
ranks' partitions into the same store folder with its own ``StoreWriter``;
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
from itertools import groupby
from typing import Callable, List, Optional

from opscope.store.schema import StoreError


def rank_groups(files: list) -> List[list]:
    """The planned files grouped by rank, the biggest ranks first (for balance).

    >>> from opscope.store.convert import _Planned
    >>> [[f.path for f in g] for g in rank_groups([_Planned(0, 1, "a"), _Planned(1, 0, "b"),
    ...                                            _Planned(0, 2, "c")])]
    [['a', 'c'], ['b']]
    """
    groups = [list(g) for _, g in groupby(sorted(files), key=lambda f: f.rank)]

    def size(group: list) -> int:
        return sum(os.path.getsize(f.path) if os.path.isfile(f.path) else 0 for f in group)

    return sorted(groups, key=size, reverse=True)


def _work(folder: str, tasks, results, failed, max_bytes: Optional[int],
          python_functions: Optional[str], done: Optional[Callable[[str], None]]):
    """Convert ranks from ``tasks`` until it is empty; the results, or an error, to ``results``."""
    from opscope.store.convert import convert_files

    while not failed.is_set():
        try:
            group = tasks.get_nowait()
        except queue.Empty:
            return
        try:
            result = convert_files(folder, group, max_bytes=max_bytes,
                                   python_functions=python_functions, done=done)
        except Exception as exc:  # reported to the parent, which raises it
            failed.set()
            results.put(("error", type(exc).__name__, str(exc)))
            return
        results.put(("ok", result.ranks, result.windows, result.events, result.traces))


def convert_in_jobs(folder: str, files: list, jobs: int, max_bytes: Optional[int],
                    python_functions: Optional[str], done: Optional[Callable[[str], None]]):
    """Convert ``files`` into ``folder`` in ``jobs`` processes; the merged ConvertResult."""
    from opscope.store.convert import ConvertResult

    context = multiprocessing.get_context("fork")
    tasks, results, failed = context.Queue(), context.Queue(), context.Event()
    groups = rank_groups(files)
    for group in groups:
        tasks.put(group)
    workers = [context.Process(target=_work, args=(folder, tasks, results, failed,
                                                   max_bytes, python_functions, None),
                               daemon=True) for _ in range(min(jobs, len(groups)) - 1)]
    for w in workers:
        w.start()
    try:
        _work(folder, tasks, results, failed, max_bytes, python_functions, done)
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
