"""The Overview: step time per ``ProfilerStep#N`` broken down, the steps' spread, top ops.

Each step's time is split by ``categories.event_categories``: the self time of
every event nested in the step's range (on the step's thread) goes to one
category, and the step range's own self time is ``idle``. The parts of a step
therefore add up to its duration. Without step ranges (no schedule) the
session's busiest thread over the whole window is one pseudo-step.

Example::

    >>> from opscope.analysis.build import build_session
    >>> from opscope.model.records import RawSession, records_from_rows
    >>> def ev(start_us, end_us, name_id, scope=0):
    ...     return (start_us * 1000, end_us * 1000, -1, name_id, 0, 0, 1, 0xFFFFFFFF, scope, 0, 0)
    >>> rows = [ev(0, 100, 0, 7), ev(10, 40, 1), ev(50, 90, 2, 7), ev(60, 70, 3)]
    >>> names = ["ProfilerStep#1", "aten::mm", "Optimizer.step#SGD.step", "aten::add_"]
    >>> o = step_overview(build_session(RawSession(records_from_rows(rows), [], [1], names,
    ...                                            0, 100_000, 0)))
    >>> step = o["steps"][0]
    >>> {c: v for c, v in zip(o["categories"], step["parts"]) if v}
    {'matmul/conv': 30.0, 'optimizer': 40.0, 'idle': 30.0}
"""

from __future__ import annotations

from typing import Any, Dict, List

import numpy as np

from opscope.analysis.aggregate import STEP_PREFIX
from opscope.model.session import ProfileSession
from opscope.report.categories import CATEGORY_NAMES, IDLE, event_categories
from opscope.report.hierarchy import inherit_down

WHOLE_SESSION = "whole session"


def step_indices(session: ProfileSession) -> np.ndarray:
    """Table indices of the ``ProfilerStep#N`` ranges, in start order."""
    table = session.table
    ids = [i for i, n in enumerate(table.symbols.names) if n.startswith(STEP_PREFIX)]
    if not ids or len(table) == 0:
        return np.zeros(0, dtype=np.int64)
    return np.flatnonzero(np.isin(table.name_id, ids))


def busiest_thread(session: ProfileSession) -> int:
    """The thread index whose top-level events cover the most time."""
    table = session.table
    roots = table.parent < 0
    if not roots.any():
        return 0
    busy = np.bincount(table.thread_index[roots], weights=table.duration_ns[roots])
    return int(np.argmax(busy))


def step_overview(session: ProfileSession) -> Dict[str, Any]:
    """Per step: name, start and duration (us) and the time per category (us)."""
    table = session.table
    ncat = len(CATEGORY_NAMES)
    category = event_categories(table)
    steps = step_indices(session)
    out_steps: List[Dict[str, Any]] = []
    if len(steps):
        own = np.full(len(table), -1, dtype=np.int64)
        own[steps] = np.arange(len(steps))
        step_of = inherit_down(table.parent, own)
        inside = step_of >= 0
        parts = np.bincount(step_of[inside] * ncat + category[inside],
                            weights=table.self_ns[inside], minlength=len(steps) * ncat)
        parts = parts.reshape(len(steps), ncat) / 1000.0
        starts = (table.start_ns[steps] - table.base_ns).tolist()
        durations = (table.end_ns[steps] - table.start_ns[steps]).tolist()
        for k, i in enumerate(steps.tolist()):
            out_steps.append(_step(table.name(i), starts[k], durations[k], parts[k]))
    elif len(table):
        thread = busiest_thread(session)
        mine = table.thread_index == thread
        parts = np.bincount(category[mine], weights=table.self_ns[mine], minlength=ncat)
        window = max(int(session.stop_ns - session.start_ns),
                     int(table.end_ns.max() - table.start_ns.min()))
        covered = int(table.duration_ns[mine & (table.parent < 0)].sum())
        parts[CATEGORY_NAMES.index(IDLE)] += max(0, window - covered)
        start = min(int(session.start_ns), int(table.start_ns.min())) - table.base_ns
        out_steps.append(_step(WHOLE_SESSION, start, window, parts / 1000.0))
    totals = np.sum([s["parts"] for s in out_steps], axis=0) if out_steps else np.zeros(ncat)
    return {"categories": list(CATEGORY_NAMES), "steps": out_steps,
            "totals": [round(float(v), 3) for v in totals],
            "spread": spread([s["dur_us"] for s in out_steps]),
            "has_steps": bool(len(steps))}


def _step(name: str, start_ns: int, dur_ns: int, parts: np.ndarray) -> Dict[str, Any]:
    return {"name": name, "start_us": round(int(start_ns) / 1000.0, 3),
            "dur_us": round(int(dur_ns) / 1000.0, 3),
            "parts": np.round(parts, 3).tolist()}


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
