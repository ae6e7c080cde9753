"""The Timeline view's data: per-thread lanes of nested ranges, capped and decimated.

The page never gets the raw event list. At most ``cap`` events are kept: the
longest ones (an enclosing range is never shorter than what it encloses, so
every kept event keeps its ancestors), all of one duration or none. Per lane
the kept events are sorted by start and written as columns: start (ns since
the previous event's start in the lane, so numbers stay short), duration,
self time (ns), depth, name index.

Example::

    >>> from opscope.analysis.build import build_session
    >>> from opscope.model.records import RawSession, records_from_rows
    >>> rows = [(0, 50_000, -1, 0, 0, 0, 1, 0xFFFFFFFF, 7, 0, 0),
    ...         (10_000, 30_000, -1, 1, 0, 0, 1, 0xFFFFFFFF, 0, 0, 0)]
    >>> raw = RawSession(records_from_rows(rows), [], [77], ["step", "aten::mm"], 0, 60_000, 0)
    >>> t = timeline_lanes(build_session(raw))
    >>> lane = t["lanes"][0]
    >>> names = [t["names"][k] for k in lane["name"]]
    >>> lane["tid"], lane["start"], lane["dur"], lane["depth"], names
    (77, [0, 10000], [50000, 20000], [0, 1], ['step', 'aten::mm'])
"""

from __future__ import annotations

import re
from typing import Any, Dict

import numpy as np

from opscope.model.arrays import distinct
from opscope.model.session import ProfileSession
from opscope.analysis.ancestry import event_depth

TIMELINE_CAP = 100_000


def thread_label(name: str, tid: int) -> str:
    """A thread's name for its lane, "" where it has none but the trace's generic label
    (torch writes ``thread <tid> (python)``; the page adds the id itself).

    >>> thread_label("thread 15107 (python)", 15107), thread_label("loader", 15107)
    ('', 'loader')
    """
    return "" if re.fullmatch(rf"thread {tid}( \(.*\))?", name or "") else (name or "")


def kept_events(duration_ns: np.ndarray, cap: int) -> np.ndarray:
    """Indices of the longest events, at most ``cap``, in table order.

    Whole duration classes are kept or dropped: every event longer than the
    first left-out duration is kept, so "shorter than X is not shown" holds
    everywhere on the timeline (no tie is cut half way along it).

    >>> kept_events(np.array([5, 9, 1, 9]), 2).tolist()
    [1, 3]
    >>> kept_events(np.array([5, 9, 5, 9]), 3).tolist()
    [1, 3]
    """
    n = len(duration_ns)
    if n <= cap:
        return np.arange(n)
    first_left_out = np.partition(duration_ns, n - cap - 1)[n - cap - 1]
    return np.flatnonzero(duration_ns > first_left_out)


def timeline_view(inputs) -> Dict[str, Any]:
    """The Timeline view's data (``opscope.report.views.ViewInputs``): its lanes, capped at
    the page's ``timeline_cap`` events."""
    return timeline_lanes(inputs.session, inputs.timeline_cap)


def timeline_lanes(session: ProfileSession, cap: int = TIMELINE_CAP) -> Dict[str, Any]:
    """Lanes (one per thread, then one per GPU stream), the names they use, and how many
    events were kept."""
    table = session.table
    n = len(table)
    keep = kept_events(table.duration_ns, cap)
    depth = event_depth(table.parent)[keep]
    start = table.start_ns[keep] - table.base_ns
    dur = table.duration_ns[keep]
    self_ns = table.self_ns[keep]
    thread = table.thread_index[keep]
    used, name_index = np.unique(table.name_id[keep], return_inverse=True)
    os_tid = table.os_tid
    lanes = []
    for t in distinct(thread).tolist():
        rows = np.flatnonzero(thread == t)
        rows = rows[np.lexsort((depth[rows], start[rows]))]
        s = start[rows]
        tid = int(os_tid[keep[rows[0]]]) if n else 0
        lanes.append({
            "tid": tid, "thread": thread_label(session.thread_names.get(tid, ""), tid),
            "events": int(np.count_nonzero(table.thread_index == t)),
            "start": np.diff(s, prepend=0).tolist(),
            "dur": dur[rows].tolist(), "self": self_ns[rows].tolist(),
            "depth": depth[rows].tolist(), "name": name_index.reshape(-1)[rows].tolist(),
        })
    lanes.sort(key=lambda lane: -lane["events"])
    names = [table.symbols[int(k)] for k in used.tolist()]
    lanes += device_lanes(session, names, cap)
    window_ns = int(session.stop_ns - session.start_ns) if session.stop_ns else 0
    if n:
        window_ns = max(window_ns, int(table.end_ns.max() - table.base_ns))
    return {"names": names, "lanes": lanes,
            "total": n, "shown": int(len(keep)),
            "min_dur_ns": int(dur.min()) if len(keep) < n and len(keep) else 0,
            "cap": cap,
            "window_ns": window_ns}


def device_lanes(session: ProfileSession, names: list, cap: int) -> list:
    """One lane per device stream, under the threads: its kernels, copies and memsets.

    Their names are appended to ``names``; ``device`` labels the lane ("GPU 0").
    """
    device = session.device
    if device is None or len(device) == 0:
        return []
    rec = device.records
    keep = kept_events(device.duration_ns, cap)
    index = {}
    code = np.array([index.setdefault(device.names[i], len(names) + len(index))
                     for i in keep.tolist()], dtype=np.int64)
    names.extend(index)
    lanes = []
    dev, stream = rec["device"][keep], rec["stream"][keep]
    start = rec["start_ns"][keep] - session.table.base_ns
    dur = device.duration_ns[keep]
    for d, s in sorted(set(zip(dev.tolist(), stream.tolist()))):
        rows = np.flatnonzero((dev == d) & (stream == s))
        rows = rows[np.argsort(start[rows], kind="stable")]
        lanes.append({"tid": int(s), "thread": f"GPU {d} stream {s}", "device": f"GPU {d}",
                      "events": int(len(rows)), "start": np.diff(start[rows], prepend=0).tolist(),
                      "dur": dur[rows].tolist(), "self": dur[rows].tolist(),
                      "depth": [0] * len(rows), "name": code[rows].tolist()})
    return lanes
