"""Step time: each ``ProfilerStep#N`` range's duration split by category, and the spread.

Each step's time is split by ``categories.event_categories``: the self time of
every event in the step (``facts.event_steps``: nested in the step's range, so
on the step's thread) goes to one category, and the step range's own self time
is ``idle``. The parts of a step therefore add up to its duration. Without step
ranges (no schedule) the session's busiest thread over the whole window is one
pseudo-step.

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
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List

import numpy as np

from opscope.analysis.categories import CATEGORY_NAMES, IDLE, event_categories
from opscope.analysis.facts import event_steps, step_ranges
from opscope.model.session import ProfileSession

WHOLE_SESSION = "whole session"


@dataclass
class StepBreakdown:
    """Per step: name, start (ns since the table's base), duration (ns), time per category.

    ``parts_us[k, c]`` is step ``k``'s time in ``CATEGORY_NAMES[c]``, in us.
    ``has_steps`` is False when the one step is the ``WHOLE_SESSION`` pseudo-step.
    """

    names: List[str]
    start_ns: List[int]
    dur_ns: List[int]
    parts_us: np.ndarray
    has_steps: bool


def busiest_thread(session: ProfileSession) -> int:
    """The thread index whose top-level events cover the most time."""
    table = session.table
    roots = table.parent < 0
    if not roots.any():
        return 0
    busy = np.bincount(table.thread_index[roots], weights=table.duration_ns[roots])
    return int(np.argmax(busy))


def step_breakdown(session: ProfileSession) -> StepBreakdown:
    """The steps' names, starts, durations and time per category (see the module doc)."""
    table = session.table
    ncat = len(CATEGORY_NAMES)
    category = event_categories(table)
    steps = step_ranges(session)
    if len(steps):
        step_of = event_steps(session)
        inside = step_of >= 0
        parts = np.bincount(step_of[inside] * ncat + category[inside],
                            weights=table.self_ns[inside], minlength=len(steps) * ncat)
        return StepBreakdown([table.name(i) for i in steps.tolist()],
                             (table.start_ns[steps] - table.base_ns).tolist(),
                             (table.end_ns[steps] - table.start_ns[steps]).tolist(),
                             parts.reshape(len(steps), ncat) / 1000.0, True)
    if len(table) == 0:
        return StepBreakdown([], [], [], np.zeros((0, ncat)), False)
    thread = busiest_thread(session)
    mine = table.thread_index == thread
    parts = np.bincount(category[mine], weights=table.self_ns[mine], minlength=ncat)
    window = max(int(session.stop_ns - session.start_ns),
                 int(table.end_ns.max() - table.start_ns.min()))
    covered = int(table.duration_ns[mine & (table.parent < 0)].sum())
    parts[CATEGORY_NAMES.index(IDLE)] += max(0, window - covered)
    start = min(int(session.start_ns), int(table.start_ns.min())) - table.base_ns
    return StepBreakdown([WHOLE_SESSION], [start], [window], (parts / 1000.0)[None, :], False)


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
