"""Everything the HTML page shows, computed from a session as one JSON-able dict.

The page gets aggregates only (step breakdown, operator rows, the flame tree,
a capped timeline), never the raw event list, so a million-event session
still gives a page of a few megabytes.

Example::

    >>> from opscope.model.events import EventTable
    >>> from opscope.model.records import RawSession
    >>> from opscope.model.session import ProfileSession
    >>> data = report_data(ProfileSession(EventTable.from_raw(RawSession.empty())))
    >>> sorted(data)  # doctest: +NORMALIZE_WHITESPACE
    ['black_box', 'compiled', 'flame', 'kernels', 'memory', 'meta', 'modules', 'operators',
     'overview', 'recommendations', 'timeline']
"""

from __future__ import annotations

import datetime
from typing import Any, Dict, Optional

import numpy as np

from opscope.model.arrays import distinct
from opscope.model.session import ProfileSession
from opscope.report.black_box import black_box_view
from opscope.report.compiled import compiled_view
from opscope.report.flame import flame_tree
from opscope.report.kernels import kernel_view
from opscope.report.memory import memory_timeline
from opscope.report.modules import module_view
from opscope.report.operators import operator_rows
from opscope.report.overview import step_overview
from opscope.report.recommendations import recommendations
from opscope.report.timeline import TIMELINE_CAP, timeline_lanes

MAX_STEPS_DRAWN = 2000
TOP_N = 10


def report_data(session: ProfileSession, *, title: Optional[str] = None,
                timeline_cap: int = TIMELINE_CAP) -> Dict[str, Any]:
    """The page's data: meta, overview, operators, modules, compiled graphs, flame, timeline,
    GPU, memory, advice."""
    overview = step_overview(session)
    operators = operator_rows(session)
    modules = module_view(session)
    # ops, and the collectives' backend ranges: on a DDP rank they are most of the time
    overview["top_ops"] = sorted((r for r in operators["rows"]
                                  if not r["user"] or r["communication"]),
                                 key=lambda r: -r["self_us"])[:TOP_N]
    advice = recommendations(session, overview, operators)
    steps = overview["steps"]
    overview["steps_shown"] = min(len(steps), MAX_STEPS_DRAWN)
    if len(steps) > MAX_STEPS_DRAWN:
        pick = np.linspace(0, len(steps) - 1, MAX_STEPS_DRAWN).round().astype(int)
        overview["steps"] = [steps[k] for k in pick.tolist()]
    return {
        "meta": _meta(session, title),
        "overview": overview,
        "operators": operators,
        "modules": modules,
        "compiled": compiled_view(session),
        "flame": flame_tree(session),
        "timeline": timeline_lanes(session, timeline_cap),
        "memory": memory_timeline(session),
        "kernels": kernel_view(session),
        "recommendations": advice,
        "black_box": black_box_view(session),
    }


def _meta(session: ProfileSession, title: Optional[str]) -> Dict[str, Any]:
    from opscope.version import __version__

    table = session.table
    window_ns = max(0, int(session.stop_ns - session.start_ns))
    if len(table):
        window_ns = max(window_ns, int(table.end_ns.max() - table.start_ns.min()))
    started = ""
    if session.epoch_offset_ns and session.start_ns:
        unix_s = (int(session.start_ns) + int(session.epoch_offset_ns)) / 1e9
        try:
            started = datetime.datetime.fromtimestamp(unix_s, datetime.timezone.utc).strftime(
                "%Y-%m-%d %H:%M:%S UTC")
        except (ValueError, OverflowError, OSError):  # a loaded trace's clock out of range
            started = ""
    threads = int(len(distinct(table.thread_index))) if len(table) else 0
    return {"title": title or session.trace_name or "profile", "events": len(table),
            "threads": threads, "window_us": window_ns / 1000.0, "collector": session.collector,
            "process_id": session.process_id, "options": dict(session.options),
            "started": started, "version": __version__}
