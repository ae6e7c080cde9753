"""Step time: each step's duration split by category, and the spread.

The steps are, in order of preference:

1. the ``ProfilerStep#N`` ranges (a schedule's ``prof.step()``);
2. without them, the optimizer steps: torch records an ``Optimizer.step#<Class>.step``
   range around each ``optimizer.step()``, and a step ends where one ends
   (:func:`optimizer_step_rows`). The first step starts at the first event on that
   thread; time after the last optimizer step belongs to no step;
3. without either, the session's busiest thread over the whole window is one
   pseudo-step (``WHOLE_SESSION``).

Each step's time is split by ``categories.event_categories``: the self time of
every event in the step goes to one category, and time in the step where
nothing recorded ran on its thread is ``idle``, or ``communication`` while a
collective was in flight on any thread (gloo's worker, say): the thread was
waiting for it, as a DDP rank waits for its peers. The parts of a step
therefore add up to its duration. Backward time is split once more by op kind
(``categories.backward_parts``); those parts add up to the ``backward`` category.

Example::

    >>> from opscope.analysis.build import build_session
    >>> from opscope.model.records import RawSession, records_from_rows
    >>> def ev(start_us, end_us, name_id, scope=0):
    ...     return (start_us * 1000, end_us * 1000, -1, name_id, 0, 0, 1, 0xFFFFFFFF, scope, 0, 0)
    >>> rows = [ev(0, 100, 0, 7), ev(10, 40, 1), ev(50, 90, 2, 7), ev(60, 70, 3)]
    >>> names = ["ProfilerStep#1", "aten::mm", "Optimizer.step#SGD.step", "aten::add_"]
    >>> b = step_breakdown(build_session(RawSession(records_from_rows(rows), [], [1], names,
    ...                                             0, 100_000, 0)))
    >>> b.names, {c: v for c, v in zip(CATEGORY_NAMES, b.parts_us[0].tolist()) if v}
    (['ProfilerStep#1'], {'matmul/conv': 30.0, 'optimizer': 40.0, 'idle': 30.0})

Without the ``ProfilerStep#1`` range, two optimizer steps make two steps::

    >>> rows = [ev(0, 10, 0), ev(10, 20, 1, 7), ev(25, 30, 0), ev(30, 40, 1, 7)]
    >>> names = ["aten::mm", "Optimizer.step#SGD.step"]
    >>> b = step_breakdown(build_session(RawSession(records_from_rows(rows), [], [1], names,
    ...                                             0, 50_000, 0)))
    >>> b.names, b.dur_ns, b.source
    (['step 1', 'step 2'], [20000, 20000], 'optimizer.step')
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List

import numpy as np

from opscope.analysis.ancestry import nearest_marked
from opscope.analysis.categories import (BACKWARD_PART_NAMES, CATEGORY_NAMES, COMMUNICATION,
                                         IDLE, category_codes, collective_rows)
from opscope.analysis.facts import event_steps, step_ranges
from opscope.analysis.intervals import difference, intersection, union
from opscope.model.session import ProfileSession
from opscope.model.torch_names import OPTIMIZER_STEP_PREFIX

WHOLE_SESSION = "whole session"
PROFILER_STEPS, OPTIMIZER_STEPS = "ProfilerStep", "optimizer.step"


@dataclass
class StepBreakdown:
    """Per step: name, start (ns since the table's base), duration (ns), time per category.

    ``parts_us[k, c]`` is step ``k``'s time in ``CATEGORY_NAMES[c]``, in us.
    ``backward_us[k, j]`` is its backward time in ``BACKWARD_PART_NAMES[j]``.
    ``source`` says where the steps come from: ``PROFILER_STEPS``, ``OPTIMIZER_STEPS``,
    or "" for the one ``WHOLE_SESSION`` pseudo-step (then ``has_steps`` is False).
    """

    names: List[str]
    start_ns: List[int]
    dur_ns: List[int]
    parts_us: np.ndarray
    backward_us: np.ndarray
    source: str

    @property
    def has_steps(self) -> bool:
        """True unless the one step is the whole session."""
        return bool(self.source)


def busiest_thread(session: ProfileSession) -> int:
    """The thread index whose top-level events cover the most time."""
    table = session.table
    roots = table.parent < 0
    if not roots.any():
        return 0
    busy = np.bincount(table.thread_index[roots], weights=table.duration_ns[roots])
    return int(np.argmax(busy))


def optimizer_step_rows(session: ProfileSession) -> np.ndarray:
    """Rows of the outermost ``Optimizer.step#...`` ranges on the first one's thread, in order.

    Each ends a step when the session has no ``ProfilerStep#N`` ranges.
    """
    return session.derived("optimizer_steps", _optimizer_step_rows)


def _optimizer_step_rows(session: ProfileSession) -> np.ndarray:
    table = session.table
    marked = table.named_like(OPTIMIZER_STEP_PREFIX)
    if not marked.any():
        return np.zeros(0, dtype=np.int64)
    above = nearest_marked(table.parent, marked)  # the nearest optimizer step, itself included
    parent_step = np.where(table.parent >= 0, above[np.maximum(table.parent, 0)], -1)
    rows = np.flatnonzero(marked & (parent_step < 0))
    if len(rows) == 0:  # the name is known (a filtered or folded row), no range carries it
        return rows
    return rows[table.thread_index[rows] == table.thread_index[rows[0]]]


def step_count(session: ProfileSession) -> int:
    """How many steps ``step_breakdown`` finds: ``ProfilerStep#N`` ranges, else optimizer
    steps; 0 when it has neither (the whole session is one pseudo-step)."""
    return int(len(step_ranges(session)) or len(optimizer_step_rows(session)))


def step_breakdown(session: ProfileSession) -> StepBreakdown:
    """The steps' names, starts, durations and time per category (see the module doc)."""
    table = session.table
    category, backward = category_codes(table)
    steps = step_ranges(session)
    if len(steps):
        step_of = event_steps(session)
        parts, bwd = _bins(step_of, category, backward, table.self_ns, len(steps))
        busy = step_of >= 0
        busy[steps] = False
        _waiting_is_communication(table, parts, table.start_ns[steps], table.end_ns[steps], busy)
        return StepBreakdown([table.name(i) for i in steps.tolist()],
                             (table.start_ns[steps] - table.base_ns).tolist(),
                             (table.end_ns[steps] - table.start_ns[steps]).tolist(),
                             parts, bwd, PROFILER_STEPS)
    if len(table) == 0:
        return StepBreakdown([], [], [], np.zeros((0, len(CATEGORY_NAMES))),
                             np.zeros((0, len(BACKWARD_PART_NAMES))), "")
    optimizer = optimizer_step_rows(session)
    if len(optimizer):
        return _optimizer_steps(session, optimizer, category, backward)
    return _whole_session(session, category, backward)


def _bins(step_of: np.ndarray, category: np.ndarray, backward: np.ndarray,
          self_ns: np.ndarray, n_steps: int) -> tuple:
    """Self time (us) per (step, category) and per (step, backward part); step -1 is dropped."""
    ncat, nbwd = len(CATEGORY_NAMES), len(BACKWARD_PART_NAMES)
    inside = step_of >= 0
    parts = np.bincount(step_of[inside] * ncat + category[inside], weights=self_ns[inside],
                        minlength=n_steps * ncat).reshape(n_steps, ncat)
    in_bwd = inside & (backward >= 0)
    bwd = np.bincount(step_of[in_bwd] * nbwd + backward[in_bwd], weights=self_ns[in_bwd],
                      minlength=n_steps * nbwd).reshape(n_steps, nbwd)
    return parts / 1000.0, bwd / 1000.0


def _optimizer_steps(session: ProfileSession, optimizer: np.ndarray, category: np.ndarray,
                     backward: np.ndarray) -> StepBreakdown:
    """Steps ending at each optimizer step; an event counts when it lies inside one step."""
    table = session.table
    mine = table.thread_index == table.thread_index[optimizer[0]]
    ends = table.end_ns[optimizer].astype(np.int64)
    first = int(table.start_ns[mine].min())
    starts = np.concatenate([[min(first, int(ends[0]))], ends[:-1]])
    after = np.searchsorted(ends, table.start_ns, side="right")  # first step ending later
    k = np.minimum(after, len(ends) - 1)
    # an event that spans a boundary (a range around the whole loop) counts in no step
    fits = mine & (after < len(ends)) & (table.start_ns >= starts[k]) & (table.end_ns <= ends[k])
    step_of = np.where(fits, k, -1)
    parts, bwd = _bins(step_of, category, backward, table.self_ns, len(ends))
    dur = ends - starts
    parts[:, CATEGORY_NAMES.index(IDLE)] += np.maximum(0.0, dur / 1000.0 - parts.sum(axis=1))
    _waiting_is_communication(table, parts, starts, ends, step_of >= 0)
    return StepBreakdown([f"step {i + 1}" for i in range(len(ends))],
                         (starts - table.base_ns).tolist(), dur.tolist(), parts, bwd,
                         OPTIMIZER_STEPS)


def _whole_session(session: ProfileSession, category: np.ndarray,
                   backward: np.ndarray) -> StepBreakdown:
    table = session.table
    thread = busiest_thread(session)
    mine = table.thread_index == thread
    parts, bwd = _bins(np.where(mine, 0, -1), category, backward, table.self_ns, 1)
    window = max(int(session.stop_ns - session.start_ns),
                 int(table.end_ns.max() - table.start_ns.min()))
    covered = int(table.duration_ns[mine & (table.parent < 0)].sum())
    parts[0, CATEGORY_NAMES.index(IDLE)] += max(0, window - covered) / 1000.0
    start = min(int(session.start_ns), int(table.start_ns.min()))
    _waiting_is_communication(table, parts, np.array([start]), np.array([start + window]),
                              mine & (table.parent < 0))
    start -= table.base_ns
    return StepBreakdown([WHOLE_SESSION], [start], [window], parts, bwd, "")


def _waiting_is_communication(table, parts: np.ndarray, starts: np.ndarray, ends: np.ndarray,
                              busy: np.ndarray) -> None:
    """Move each step's idle time during which a collective was in flight to communication.

    ``starts``/``ends`` are the steps' (disjoint) times, ``busy`` the events whose time on
    the step's thread is not idle.
    """
    comm = collective_rows(table)
    if not comm.any() or len(starts) == 0:
        return
    idle = difference(union(starts, ends), union(table.start_ns[busy], table.end_ns[busy]))
    wait_s, wait_e = intersection(idle, union(table.start_ns[comm], table.end_ns[comm]))
    before = np.concatenate(([0], np.cumsum(wait_e - wait_s)))  # waiting before each span

    def waited_until(t: np.ndarray) -> np.ndarray:
        k = np.searchsorted(wait_s, t, side="right") - 1
        inside = np.clip(t - wait_s[np.maximum(k, 0)], 0, (wait_e - wait_s)[np.maximum(k, 0)])
        return np.where(k >= 0, before[np.maximum(k, 0)] + inside, 0)

    if len(wait_s) == 0:
        return
    waited = (waited_until(np.asarray(ends)) - waited_until(np.asarray(starts))) / 1000.0
    idle_col, comm_col = CATEGORY_NAMES.index(IDLE), CATEGORY_NAMES.index(COMMUNICATION)
    waited = np.minimum(waited, parts[:, idle_col])
    parts[:, idle_col] -= waited
    parts[:, comm_col] += waited


def spread(durations: List[float]) -> Dict[str, float]:
    """Count, min, median, mean, p90, max and standard deviation of step durations (us).

    >>> spread([10.0, 20.0, 30.0])["median"]
    20.0
    """
    if not durations:
        return {}
    d = np.asarray(durations, dtype=float)
    return {"count": int(len(d)), "min": float(d.min()), "median": float(np.median(d)),
            "mean": float(d.mean()), "p90": float(np.percentile(d, 90)), "max": float(d.max()),
            "std": float(d.std())}
