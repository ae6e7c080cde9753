"""The GPU view: how busy the device was, its idle gaps, and the top kernels with their owners.

From a session with a device collector's work (``session.device``): the
device's busy time (the union of its kernels, copies and memsets) against the
window, the longest idle gaps between them, device time per module, and per
kernel name its calls and time, the ops that launched it and, with
``with_stack``, where in the user's code. None without device work.

Example::

    >>> from opscope.analysis.build import build_session
    >>> from opscope.model.records import RawSession
    >>> kernel_view(build_session(RawSession.empty())) is None
    True
"""

from __future__ import annotations

import collections
from typing import Any, Dict, List, Optional

import numpy as np

from opscope.analysis.facts import event_modules
from opscope.model.session import ProfileSession

TOP_KERNELS = 25
TOP_GAPS = 5
TOP_OWNERS = 3


def busy_intervals(start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """The union of [start, end) intervals as sorted, disjoint (n x 2) rows.

    >>> busy_intervals(np.array([0, 5, 20]), np.array([10, 12, 30])).tolist()
    [[0, 12], [20, 30]]
    """
    if len(start) == 0:
        return np.zeros((0, 2), dtype=np.int64)
    order = np.argsort(start, kind="stable")
    s, e = start[order], np.maximum.accumulate(end[order])
    new = np.ones(len(s), dtype=bool)
    new[1:] = s[1:] > e[:-1]
    firsts = np.flatnonzero(new)
    lasts = np.append(firsts[1:] - 1, len(s) - 1)
    return np.stack([s[firsts], e[lasts]], axis=1)


def kernel_view(session: ProfileSession) -> Optional[Dict[str, Any]]:
    """The GPU view's data, or None when the session has no device work."""
    device = session.device
    if device is None or len(device) == 0:
        return None
    rec = device.records
    table = session.table
    busy = busy_intervals(rec["start_ns"], rec["end_ns"])
    busy_ns = int((busy[:, 1] - busy[:, 0]).sum())
    window_ns = max(int(session.stop_ns - session.start_ns), int(busy[-1, 1] - busy[0, 0]), 1)
    gaps = busy[1:, 0] - busy[:-1, 1]
    top_gaps = np.argsort(-gaps, kind="stable")[:TOP_GAPS]
    dur = device.duration_ns
    return {
        "busy_us": busy_ns / 1000.0, "window_us": window_ns / 1000.0,
        "busy_share": busy_ns / window_ns, "device_us": float(dur.sum()) / 1000.0,
        "events": len(device), "unowned": int((device.owner_row < 0).sum()),
        "gaps": [{"start_us": (int(busy[k, 1]) - table.base_ns) / 1000.0,
                  "us": int(gaps[k]) / 1000.0} for k in top_gaps.tolist()],
        "kernels": _kernels(session, dur),
        "modules": _modules(session, dur),
    }


def _kernels(session: ProfileSession, dur: np.ndarray) -> List[Dict[str, Any]]:
    device, table = session.device, session.table
    total = float(dur.sum()) or 1.0
    by_name: Dict[str, List[int]] = collections.defaultdict(list)
    for i, name in enumerate(device.names):
        by_name[name].append(i)
    rows = []
    for name, idx in by_name.items():
        us = float(dur[idx].sum()) / 1000.0
        owners = collections.Counter(int(device.owner_row[i]) for i in idx)
        launched_by = collections.Counter()
        site = None
        for row, n in owners.items():
            launched_by[table.name(row) if row >= 0 else "(outside any op)"] += n
            if site is None and row >= 0 and session.stacks is not None and session.stacks[row]:
                site = list(session.stacks[row][:3])
        rows.append({"name": name, "calls": len(idx), "us": us, "share": us * 1000.0 / total,
                     "avg_us": us / len(idx), "category": _category(int(device.records["kind"][idx[0]])),
                     "launched_by": launched_by.most_common(TOP_OWNERS), "stack": site})
    rows.sort(key=lambda r: -r["us"])
    return rows[:TOP_KERNELS]


def _category(kind: int) -> str:
    from opscope.model.device import CATEGORIES

    return CATEGORIES.get(kind, "kernel")


def _modules(session: ProfileSession, dur: np.ndarray) -> List[Dict[str, Any]]:
    """Device time per module (with_modules): the modules whose forward launched it."""
    if not session.modules:
        return []
    owner = session.device.owner_row
    module_of = event_modules(session)
    table = session.table
    per: Dict[str, float] = collections.Counter()
    for row, ns in zip(owner.tolist(), dur.tolist()):
        m = int(module_of[row]) if row >= 0 else -1
        per[table.name(m) if m >= 0 else "(no module)"] += ns / 1000.0
    return [{"module": k, "us": v} for k, v in sorted(per.items(), key=lambda kv: -kv[1])]
