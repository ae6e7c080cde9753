"""Memory summary: peak memory held per step, and the ops that allocate most.

Example::

    >>> from opscope.analysis.build import build_session
    >>> from opscope.model.records import RawSession
    >>> summarize_memory(build_session(RawSession.empty())).step_peaks
    []
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Tuple

import numpy as np

from opscope.analysis.aggregate import key_averages
from opscope.analysis.facts import step_ranges
from opscope.analysis.memory_timeline import categorized_blocks, held_by_category
from opscope.model.memory import CATEGORY_NAMES
from opscope.model.records import SCOPE_USER
from opscope.model.session import ProfileSession



@dataclass
class MemorySummary:
    """``step_peaks``: (step name, peak bytes held, category bytes at the peak);
    ``top_ops``: (op name, self bytes allocated, calls), largest first;
    ``peak``: the window's peak bytes held."""

    step_peaks: List[Tuple[str, int, List[int]]] = field(default_factory=list)
    top_ops: List[Tuple[str, int, int]] = field(default_factory=list)
    peak: int = 0


def held_over_time(session: ProfileSession) -> Tuple[np.ndarray, np.ndarray]:
    """Collector-clock times and the bytes held by each category from then on (CPU)."""
    blocks = categorized_blocks(session)
    cpu = blocks.device_type == 0
    if not cpu.any():
        return np.zeros(0, np.int64), np.zeros((0, len(CATEGORY_NAMES)), np.int64)
    return held_by_category(blocks, cpu, session.start_ns)


def summarize_memory(session: ProfileSession, top: int = 10) -> MemorySummary:
    """Peaks per ``ProfilerStep#N`` range and the ``top`` ops by self allocation."""
    out = MemorySummary()
    times, held = held_over_time(session)
    total = held.sum(axis=1) if len(times) else np.zeros(0, np.int64)
    out.peak = int(total.max(initial=0))
    table = session.table
    steps = [i for i in step_ranges(session).tolist() if table.scope[i] == SCOPE_USER]
    for i in steps if len(times) else []:
        name = table.name(i)
        lo = max(int(np.searchsorted(times, table.start_ns[i], side="right")) - 1, 0)
        hi = int(np.searchsorted(times, table.end_ns[i], side="right"))
        k = lo + int(np.argmax(total[lo:hi])) if hi > lo else lo
        out.step_peaks.append((name, int(total[k]), held[k].tolist()))
    if session.event_memory is not None:
        rows = key_averages(table, memory=session.event_memory)
        ranked = sorted((r for r in rows if r.self_cpu_memory_usage > 0),
                        key=lambda r: -r.self_cpu_memory_usage)
        out.top_ops = [(r.key, int(r.self_cpu_memory_usage), int(r.count))
                       for r in ranked[:top]]
    return out
