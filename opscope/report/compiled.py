"""The Compiled view's data: torch.compile'd graphs and Dynamo's own time per frame.

The rows are ``opscope.analysis.compiled_graphs.graph_rows`` (one per graph: calls, time,
kernels, the share in modules) and ``opscope.analysis.compiled_frames.frame_rows`` (one per
Dynamo frame: guards, AOT wrappers, compiles, graph breaks, with the frame's ``file:line``),
as ``opscope table --group-by graph`` prints them; this module only shapes them for the page
(``assets/compiled.js``, ``VIEWS.compiled``). None when nothing compiled ran: the page then
has no Compiled tab.

Example::

    >>> from opscope.analysis.build import build_session
    >>> from opscope.model.records import RawSession
    >>> compiled_view(build_session(RawSession.empty())) is None
    True
"""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, Optional

from opscope.analysis.compiled_frames import frame_notes, frame_rows
from opscope.analysis.compiled_graphs import graph_breaks, graph_rows
from opscope.model.session import ProfileSession


def compiled_view(session: ProfileSession) -> Optional[Dict[str, Any]]:
    """Graphs, frames (with their notes), the breaks so far and the totals; or None."""
    graphs, frames = graph_rows(session), frame_rows(session)
    if not graphs and not frames:
        return None
    frame_dicts = []
    for frame in frames:
        item = dataclasses.asdict(frame)
        item.update(recompiles=frame.recompiles, notes=frame_notes(frame))
        frame_dicts.append(item)
    breaks = graph_breaks(session)
    totals = {name: round(sum(getattr(f, name) for f in frames), 3)
              for name in ("guard_us", "wrapper_us", "compile_us", "guard_calls")}
    totals.update(graph_us=round(sum(g.time_us for g in graphs), 3),
                  graph_calls=sum(g.calls for g in graphs),
                  recompiles=sum(f.recompiles for f in frames),
                  graph_breaks=sum(breaks.values()))
    return {"graphs": [dataclasses.asdict(g) for g in graphs], "frames": frame_dicts,
            "breaks": sorted(breaks.items(), key=lambda kv: -kv[1]), "totals": totals}
