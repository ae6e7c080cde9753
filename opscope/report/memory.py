"""The Memory view's data: bytes held per memory category over time, and the peak.

The series come from ``opscope.analysis.memory_summary.held_over_time`` over
``session.memory`` (recorded live with ``profile_memory``, or rebuilt from a
loaded trace's ``[memory]`` events); this module decimates them for the page
(``assets/views.js``, ``VIEWS.memory``). Without memory records the view gets
None and says "not recorded". Each category comes with its colour (the same as
``export_memory_timeline``'s page: ``analysis.memory_timeline.COLORS``) and what it
holds (``model.memory.CATEGORY_MEANINGS``), which the page lists.

Example::

    >>> from opscope.model.events import EventTable
    >>> from opscope.model.records import RawSession
    >>> from opscope.model.session import ProfileSession
    >>> s = ProfileSession(EventTable.from_raw(RawSession.empty()))
    >>> memory_timeline(s) is None
    True
"""

from __future__ import annotations

from typing import Any, Dict, Optional

import numpy as np

from opscope.analysis.memory_summary import held_over_time
from opscope.analysis.memory_timeline import COLORS
from opscope.model.memory import CATEGORY_MEANINGS, CATEGORY_NAMES
from opscope.model.session import ProfileSession

MEMORY_POINTS = 4000


def memory_timeline(session: ProfileSession) -> Optional[Dict[str, Any]]:
    """The memory view: bytes held per memory category over time (us since the session
    start; see analysis.memory_timeline) and the peak, or None without memory records.

    Points are decimated to about ``MEMORY_POINTS``, keeping each bucket's
    highest total so the peak stays visible.
    """
    if session.memory is None or len(session.memory) == 0:
        return None
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
            "colors": [COLORS[c] for c in used],
            "meanings": [CATEGORY_MEANINGS[c] for c in used],
            "series": [held[:, c].astype(np.int64).tolist() for c in used],
            "peak_bytes": peak_bytes, "peak_time_us": round(peak_time, 3),
            "note": f"{len(session.memory)} allocator records; bytes held per category."}
