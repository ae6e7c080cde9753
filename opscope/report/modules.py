"""The Modules view's data: the module tree with forward and backward time.

With memory recorded, ``net_mem``/``self_net_mem`` are the module table's ``Net
CPU Mem`` columns (``opscope.export.module_table``): bytes allocated minus freed by
the module's forward and backward ops, not the op table's ``CPU Mem`` of its range.
``fused_note`` is the module table's note on compiled kernels fused across modules.

The rows are ``opscope.analysis.modules.module_rows`` (``with_modules``); this
module only shapes them for the page (``assets/views.js``, ``VIEWS.modules``).
Without module data the view gets None and says "not recorded".

Example::

    >>> from opscope.model.events import EventTable
    >>> from opscope.model.records import RawSession
    >>> from opscope.model.session import ProfileSession
    >>> module_view(ProfileSession(EventTable.from_raw(RawSession.empty()))) is None
    True
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional

from opscope.analysis.facts import event_flops
from opscope.analysis.modules import MEMORY_NOTE, fused_kernel_counts, fused_note, module_rows
from opscope.model.session import ProfileSession

TOP_MODULES = 10


def module_view(session: ProfileSession) -> Optional[Dict[str, Any]]:
    """The module tree (pre-order, with depth) with forward and backward time, or None."""
    if not getattr(session, "modules", None):
        return None
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
                      "self_us": round(row.self_cpu_time_total, 3),
                      "net_mem": row.cpu_memory_usage,
                      "self_net_mem": row.self_cpu_memory_usage})
    top = sorted(nodes, key=lambda n: -n["self_us"])[:TOP_MODULES]
    return {"nodes": nodes, "top": top, "memory_note": MEMORY_NOTE,
            "fused_note": fused_note(*fused_kernel_counts(session))}
