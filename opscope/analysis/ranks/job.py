"""A job's rank traces read once for the report: the facts, each rank's steps, one session kept.

``load_job(paths, visit=...)`` reads each rank trace once, as
``opscope.analysis.ranks.facts.load_ranks`` does (same ranks, same facts, one
trace in memory at a time), and also keeps what the report's Ranks view needs
beyond ``analyse_ranks``: each step's aligned start and duration per rank
(:func:`step_times`, the heat map's cells), and the session of the lowest
rank's first trace (the report's other views show it). ``visit(rank, path,
session)`` sees every rank session before it is dropped (the report takes its
timeline lanes there).

(``opscope.load.ranks.peek_rank`` reads only the head of a trace file, so ``opscope
report DIR`` can tell a job's folder from one process's folder without loading it.)

Example::

    >>> from opscope.analysis.build import build_session
    >>> from opscope.model.records import RawSession, records_from_rows
    >>> def ev(start_us, end_us, name_id):
    ...     return (start_us * 1000, end_us * 1000, -1, name_id, 0, 0, 1, 0xFFFFFFFF, 7, 0, 0)
    >>> names = ["ProfilerStep#4", "ProfilerStep#5"]
    >>> raw = RawSession(records_from_rows([ev(0, 30, 0), ev(30, 80, 1)]), [], [1], names,
    ...                  0, 80_000, 0)
    >>> s = step_times(build_session(raw))
    >>> s.numbers, s.dur_ns
    ([4, 5], [30000, 50000])
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from opscope.analysis.ranks.facts import RankFacts, clock_offset_ns, load_ranks
from opscope.load.ranks import RankTraceError
from opscope.model.session import ProfileSession
from opscope.model.torch_names import OPTIMIZER_STEP_PREFIX, PROFILER_STEP_PREFIX

_STEP_NUMBER = re.compile(r"#(\d+)$")


@dataclass
class StepTimes:
    """One rank's steps: their numbers (``ProfilerStep#N``), aligned starts and durations (ns)."""

    numbers: List[int] = field(default_factory=list)
    start_ns: List[int] = field(default_factory=list)
    dur_ns: List[int] = field(default_factory=list)

    def add(self, other: "StepTimes") -> None:
        """Append a later window of the same rank."""
        self.numbers += other.numbers
        self.start_ns += other.start_ns
        self.dur_ns += other.dur_ns


@dataclass
class RankJob:
    """The facts per rank (as ``load_ranks``), the steps per rank, and the session shown."""

    facts: List[RankFacts]
    steps: Dict[int, StepTimes]
    session: ProfileSession  # the lowest rank's first trace
    session_rank: int
    session_path: str


def step_times(session: ProfileSession, shift_ns: int = 0) -> StepTimes:
    """The steps of ``session``: ProfilerStep ranges, else optimizer steps, else the window.

    The same steps ``facts`` counts. An optimizer step runs from the
    previous one's end (the first event, for the first); steps without a
    ``#N`` are numbered by their order. ``shift_ns`` moves starts onto the
    job's clock.
    """
    table = session.table
    if len(table) == 0:
        return StepTimes()
    names = table.symbols.names
    for prefix in (PROFILER_STEP_PREFIX, OPTIMIZER_STEP_PREFIX):
        rows = np.flatnonzero(table.named_like(prefix))
        if not len(rows):
            continue
        rows = rows[np.argsort(table.start_ns[rows], kind="stable")]
        ends = table.end_ns[rows]
        if prefix == PROFILER_STEP_PREFIX:
            starts = table.start_ns[rows]
            found = [_STEP_NUMBER.search(names[int(k)]) for k in table.name_id[rows]]
            numbers = [int(m.group(1)) if m else k for k, m in enumerate(found)]
        else:
            starts = np.concatenate(([table.start_ns.min()], ends[:-1]))
            numbers = list(range(len(rows)))
        return StepTimes(numbers, (starts + shift_ns).tolist(), (ends - starts).tolist())
    start = int(table.start_ns.min())
    return StepTimes([0], [start + shift_ns], [int(table.end_ns.max()) - start])


class JobSteps:
    """A ``load_ranks`` visitor that keeps each rank's steps and the lowest rank's first session.

    ``job(facts)`` makes the RankJob once every session was visited; any source of
    sessions (a folder of traces, a store's windows) can drive it.
    """

    def __init__(self, visit: Optional[Callable[[int, str, ProfileSession], None]] = None):
        self.visit = visit
        self.steps: Dict[int, StepTimes] = {}
        self.shown: Optional[Tuple[int, str, ProfileSession]] = None

    def __call__(self, rank: int, path: str, session: ProfileSession) -> None:
        times = step_times(session, session.epoch_offset_ns + clock_offset_ns(session))
        if rank in self.steps:
            self.steps[rank].add(times)
        else:
            self.steps[rank] = times
        if self.visit is not None:
            self.visit(rank, path, session)
        if self.shown is None or rank < self.shown[0]:
            self.shown = (rank, path, session)

    def job(self, facts: List[RankFacts]) -> RankJob:
        """The job of ``facts`` and the sessions seen (RankTraceError when none was)."""
        if self.shown is None:
            raise RankTraceError("no rank sessions were read")
        rank, path, session = self.shown
        return RankJob(facts, self.steps, session, rank, path)


def load_job(paths: Sequence[str], *, max_bytes: Optional[int] = None,
             visit: Optional[Callable[[int, str, ProfileSession], None]] = None) -> RankJob:
    """Read the rank traces among ``paths`` once each; see the module docstring.

    Raises :class:`RankTraceError` when no trace names a rank, and
    ``opscope.load.TraceLoadError`` naming a trace that cannot be read.

    >>> load_job([])
    Traceback (most recent call last):
    ...
    opscope.load.ranks.RankTraceError: no rank traces given
    """
    steps = JobSteps(visit)
    return steps.job(load_ranks(list(paths), max_bytes=max_bytes, visit=steps))
