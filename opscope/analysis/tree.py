"""Parent/child nesting and self time, by torch.profiler's rules.

Per thread, events sorted by (start, -end) nest with a stack: an event is a
child of the innermost open event that fully contains it. Async events take
no part. Then, as torch does, a child that has its parent's name and is that
parent's only child is folded into the parent (``aten::foo`` inside
``aten::foo``). Self time is duration minus the children's durations.

Example::

    >>> import numpy as np
    >>> from opscope.model.events import EventTable, SymbolTable
    >>> cols = {c: np.zeros(2, dtype=np.int64) for c in EventTable.COLUMNS}
    >>> cols["name_id"] = np.array([0, 1]); cols["start_ns"] = np.array([0, 10])
    >>> cols["end_ns"] = np.array([100, 20])
    >>> t = build_tree(EventTable(SymbolTable(["outer", "inner"]), cols))
    >>> t.parent.tolist(), t.self_ns.tolist()
    ([-1, 0], [90, 10])
"""

from __future__ import annotations

import numpy as np

from opscope.model.events import EventTable


def assign_parents(table: EventTable) -> np.ndarray:
    """Parent index of each event (-1 for a root), from interval nesting."""
    n = len(table)
    parent = np.full(n, -1, dtype=np.int64)
    if n == 0:
        return parent
    sync = ~table.is_async
    thread = table.thread_index
    start = table.start_ns
    end = table.end_ns
    # table is sorted by (start, -end); a stable sort by thread keeps that order
    order = np.argsort(thread, kind="stable")
    order = order[sync[order]]
    starts = start[order].tolist()
    ends = end[order].tolist()
    threads = thread[order].tolist()
    idx = order.tolist()
    out = parent.tolist()
    stack_idx: list = []
    stack_end: list = []
    current_thread = None
    for k in range(len(idx)):
        t = threads[k]
        if t != current_thread:
            stack_idx.clear()
            stack_end.clear()
            current_thread = t
        s, e = starts[k], ends[k]
        while stack_end:
            pe = stack_end[-1]
            if s >= pe or e > pe:
                stack_end.pop()
                stack_idx.pop()
            else:
                out[idx[k]] = stack_idx[-1]
                break
        stack_idx.append(idx[k])
        stack_end.append(e)
    return np.asarray(out, dtype=np.int64)


def fold_duplicate_children(table: EventTable, parent: np.ndarray) -> np.ndarray:
    """Mask of events to keep after folding same-name only-children into parents.

    ``parent`` is updated in place so that the children of a folded event
    point at the event it was folded into.
    """
    n = len(table)
    keep = np.ones(n, dtype=bool)
    names = table.name_id
    while True:
        live_parent = np.where(keep, parent, -1)
        child_count = np.bincount(live_parent[live_parent >= 0], minlength=n)
        has_parent = live_parent >= 0
        p = np.where(has_parent, live_parent, 0)
        dup = has_parent & (names[p] == names) & (child_count[p] == 1) & keep
        if not dup.any():
            return keep
        keep &= ~dup
        # re-point children of folded events at the folded event's parent
        while True:
            pp = np.where(parent >= 0, parent, 0)
            moved = (parent >= 0) & ~keep[pp]
            if not moved.any():
                break
            parent[moved] = parent[pp[moved]]


def build_tree(table: EventTable) -> EventTable:
    """Fill ``parent`` and ``self_ns``; returns a table without folded duplicates."""
    parent = assign_parents(table)
    keep = fold_duplicate_children(table, parent)
    table.parent = parent
    if not keep.all():
        table = table.take(keep)
    dur = table.duration_ns
    child_total = np.zeros(len(table), dtype=np.int64)
    has = table.parent >= 0
    np.add.at(child_total, table.parent[has], dur[has])
    table.self_ns = dur - child_total
    return table
