"""What a session may carry beyond times: FLOPs, memory, modules.

These come from optional recording (``with_flops``, ``profile_memory``,
``with_modules``). Each function returns None when the session holds no such
data, and the report then says "not recorded".

- FLOPs: ``session.flops`` (per event, from ``opscope.analysis.flops``).
- Modules: ``opscope.analysis.modules.module_rows`` when ``session.modules``.
- Memory: per-event usage from ``session.self_cpu_memory``/``cpu_memory``
  arrays, and the timeline of bytes held per category from ``session.memory``
  (recorded live, or rebuilt from a loaded trace's ``[memory]`` events).

Example::

    >>> from opscope.model.events import EventTable
    >>> from opscope.model.records import RawSession
    >>> from opscope.model.session import ProfileSession
    >>> s = ProfileSession(EventTable.from_raw(RawSession.empty()))
    >>> event_flops(s) is None, event_memory(s) is None, memory_timeline(s) is None
    (True, True, True)
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional

import numpy as np

from opscope.model.session import ProfileSession

MEMORY_POINTS = 4000
TOP_MODULES = 10


def _aligned(session: ProfileSession, name: str) -> Optional[np.ndarray]:
    values = getattr(session, name, None)
    if values is None or len(values) != len(session.table):
        return None
    return np.asarray(values)


def event_flops(session: ProfileSession) -> Optional[np.ndarray]:
    """Per-event FLOPs (table order), or None when FLOPs were not estimated."""
    return _aligned(session, "flops")


def event_memory(session: ProfileSession) -> Optional[Dict[str, np.ndarray]]:
    """Per-event ``cpu_memory_usage``/``self_cpu_memory_usage`` arrays, or None."""
    self_mem = _aligned(session, "self_cpu_memory")
    if self_mem is None:
        return None
    total = _aligned(session, "cpu_memory")
    return {"self_cpu_memory_usage": self_mem.astype(np.float64),
            "cpu_memory_usage": (total if total is not None else self_mem).astype(np.float64)}


def memory_timeline(session: ProfileSession) -> Optional[Dict[str, Any]]:
    """The memory view: bytes held per memory category over time (us since the session
    start; see analysis.memory_timeline) and the peak, or None without memory records.

    Points are decimated to about ``MEMORY_POINTS``, keeping each bucket's
    highest total so the peak stays visible.
    """
    if session.memory is None or len(session.memory) == 0:
        return None
    from opscope.analysis.memory_summary import held_over_time
    from opscope.model.memory import CATEGORY_NAMES

    times, held = held_over_time(session)
    if len(times) == 0:
        return None
    t = (times - session.table.base_ns) / 1000.0
    total = held.sum(axis=1)
    peak = int(np.argmax(total))
    peak_bytes, peak_time = int(total[peak]), float(t[peak])
    if len(t) > MEMORY_POINTS:
        bucket = np.minimum((np.arange(len(t)) * MEMORY_POINTS) // len(t), MEMORY_POINTS - 1)
        starts = np.flatnonzero(np.diff(bucket, prepend=-1))
        best = starts + np.array([np.argmax(seg) for seg in np.split(total, starts[1:])])
        t, held = t[best], held[best]
    used = [c for c in range(len(CATEGORY_NAMES)) if held[:, c].any()]
    return {"times_us": np.round(t, 3).tolist(),
            "categories": [CATEGORY_NAMES[c] for c in used],
            "series": [held[:, c].astype(np.int64).tolist() for c in used],
            "peak_bytes": peak_bytes, "peak_time_us": round(peak_time, 3),
            "note": f"{len(session.memory)} allocator records; bytes held per category "
                    "(see the README's memory categories)."}


def module_view(session: ProfileSession) -> Optional[Dict[str, Any]]:
    """The module tree (pre-order, with depth) with forward and backward time, or None."""
    if not getattr(session, "modules", None):
        return None
    from opscope.analysis.modules import module_rows

    rows = module_rows(session, flops=event_flops(session))
    if not rows:
        return None
    nodes: List[Dict[str, Any]] = []
    for row in rows:
        nodes.append({"name": row.key, "type": row.class_name, "path": row.hierarchy,
                      "depth": row.depth, "leaf": not row.children, "calls": row.count,
                      "params": row.parameters, "flops": int(row.flops),
                      "forward_us": round(row.forward_time_total, 3),
                      "backward_us": round(row.backward_time_total, 3),
                      "self_us": round(row.self_cpu_time_total, 3)})
    top = sorted(nodes, key=lambda n: -n["self_us"])[:TOP_MODULES]
    return {"nodes": nodes, "top": top}
