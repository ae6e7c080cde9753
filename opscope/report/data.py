"""Everything the HTML page shows, computed from a session as one JSON-able dict.

The views are those of the registry (``opscope.report.views``): this module adds the
page's ``meta`` (title, event and thread counts, window, options, version).

The page gets aggregates only (step breakdown, operator rows, the flame tree,
a capped timeline), never the raw event list, so a million-event session
still gives a page of a few megabytes.

Example::

    >>> from opscope.model.events import EventTable
    >>> from opscope.model.records import RawSession
    >>> from opscope.model.session import ProfileSession
    >>> data = report_data(ProfileSession(EventTable.from_raw(RawSession.empty())))
    >>> list(data)  # doctest: +NORMALIZE_WHITESPACE
    ['meta', 'overview', 'operators', 'modules', 'compiled', 'flame', 'timeline', 'memory',
     'kernels', 'recommendations', 'black_box']
"""

from __future__ import annotations

import datetime
from typing import Any, Dict, Optional

from opscope.model.arrays import distinct
from opscope.model.session import ProfileSession
from opscope.report.timeline import TIMELINE_CAP
from opscope.report.views import REGISTRY, ViewInputs


def report_data(session: ProfileSession, *, title: Optional[str] = None,
                timeline_cap: int = TIMELINE_CAP, job: Any = None) -> Dict[str, Any]:
    """The page's data: ``meta``, then each registered view's data by its key, in registry
    order (``opscope.report.views``); the job-only views' too when ``job`` (their
    ``JobReading``, from ``opscope.report.ranks.job_data``) is given."""
    inputs = ViewInputs(session, timeline_cap=timeline_cap, job=job)
    data: Dict[str, Any] = {"meta": _meta(session, title)}
    for entry in REGISTRY:
        if job is not None or not entry.job_only:
            data[entry.key] = inputs.view(entry.key)
    return data


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
