"""Everything the HTML page shows, computed from a session as one JSON-able dict.

The views are those of the registry (``opscope.report.views``): this module adds the
page's ``meta`` (title, event and thread counts, window, options, version). A job's page
(``job_report_data``, ``job_data``) is the page of its shown rank plus the job-only views.

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
import os
from typing import Any, Callable, Dict, Optional, Sequence

from opscope.analysis.ranks.job import RankJob, load_job
from opscope.analysis.ranks.analyse import DEFAULT_MIN_LATENESS_MS, analyse_ranks
from opscope.model.arrays import distinct
from opscope.model.session import ProfileSession
from opscope.report.ranks import JobReading, _LaneCollector
from opscope.report.timeline import TIMELINE_CAP
from opscope.report.views import REGISTRY, ViewInputs


def report_data(session: ProfileSession, *, title: Optional[str] = None,
                timeline_cap: int = TIMELINE_CAP, job: Any = None) -> Dict[str, Any]:
    """The page's data: ``meta``, then each registered view's data by its key, in registry
    order (``opscope.report.views``); the job-only views' too when ``job`` (their
    ``JobReading``, from ``job_data``) is given."""
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


def job_report_data(paths: Sequence[str], *, title: Optional[str] = None,
                    timeline_cap: int = TIMELINE_CAP, max_bytes: Optional[int] = None,
                    min_lateness_ms: float = DEFAULT_MIN_LATENESS_MS) -> Dict[str, Any]:
    """The page's data for a job: ``report_data`` of the shown rank, plus ``ranks``."""
    return job_data(lambda visit: load_job(paths, max_bytes=max_bytes, visit=visit),
                    len(paths), title=title, timeline_cap=timeline_cap,
                    min_lateness_ms=min_lateness_ms)


def job_data(load: Callable[[Callable], RankJob], sessions: int, *, title: Optional[str] = None,
             timeline_cap: int = TIMELINE_CAP,
             min_lateness_ms: float = DEFAULT_MIN_LATENESS_MS) -> Dict[str, Any]:
    """``job_report_data`` of any source: ``load(visit)`` reads the job (``sessions`` of them,
    each passed to ``visit(rank, path, session)``), as ``load_job`` or a store's loader."""
    lanes = _LaneCollector(max(1, timeline_cap // max(1, sessions)))
    job = load(lanes)
    analysis = analyse_ranks(job.facts, min_lateness_ms=min_lateness_ms)
    starts = [f.start_ns for f in job.facts if f.start_ns is not None]
    reading = JobReading(job, analysis, lanes, min(starts) if starts else 0)
    data = report_data(job.session, title=title, timeline_cap=timeline_cap, job=reading)
    data["meta"]["shown_rank"] = job.session_rank
    data["meta"]["shown_file"] = os.path.basename(job.session_path)
    return data
