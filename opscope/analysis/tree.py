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

import copy
from typing import Any, Dict, Optional, Tuple

import numpy as np

from opscope.model.events import EventTable
from opscope.model.records import SCOPE_BACKWARD_FUNCTION, SCOPE_FUNCTION
from opscope.model.torch_names import EVALUATE_FUNCTION_PREFIX


def assign_parents(table: EventTable) -> np.ndarray:
    """Parent index of each event (-1 for a root), from interval nesting.

    Vectorised: a depth sweep finds each event's innermost open interval. A
    thread whose intervals are not cleanly nested (two ranges that cross) is
    redone with the exact stack rule, so the result always equals torch's.
    """
    n = len(table)
    parent = np.full(n, -1, dtype=np.int64)
    if n == 0:
        return parent
    sync = np.flatnonzero(~table.is_async)
    if len(sync) == 0:
        return parent
    thread = table.thread_index[sync].astype(np.int64)
    start = table.start_ns[sync]
    end = table.end_ns[sync]
    found = _parents_by_depth(thread, start, end)
    if found is None:
        found = np.full(len(sync), -1, dtype=np.int64)
        bad_threads = sorted(set(thread.tolist()))
    else:
        bad_threads = _threads_not_nested(thread, start, end, found)
    for t in bad_threads:
        rows = np.flatnonzero(thread == t)
        found[rows] = _parents_by_stack(start[rows], end[rows], rows)
    parent[sync] = np.where(found >= 0, sync[np.maximum(found, 0)], -1)
    return parent


def _parents_by_depth(thread: np.ndarray, start: np.ndarray,
                      end: np.ndarray) -> Optional[np.ndarray]:
    """Parents (positions in the given order) assuming intervals nest cleanly.

    Rows are sorted by (start, -end). An event's depth is the number of
    earlier non-zero-length events on its thread minus those already closed
    (end <= its start: touching ranges do not nest). Zero-length events never
    contain anything, so they leave other depths alone. The parent is the
    latest earlier event one level up on the same thread.
    """
    n = len(start)
    idx = np.arange(n, dtype=np.int64)
    t = thread.astype(np.int64)
    tmin = int(start.min())
    span = int(max(end.max(), start.max())) - tmin + 2
    n_threads = int(t.max()) + 1
    if span * n_threads >= 2 ** 62:  # packed keys would overflow
        return None
    nonzero = end > start
    # rank among earlier non-zero events of the same thread (stable: keeps order)
    nz = nonzero.astype(np.int64)
    if n_threads == 1:
        rank = np.cumsum(nz) - nz
    else:
        by_thread = _stable_order(t)
        nz_sorted = nz[by_thread]
        csum = np.cumsum(nz_sorted) - nz_sorted
        first_of_thread = np.searchsorted(t[by_thread], np.arange(n_threads), side="left")
        csum -= csum[first_of_thread][t[by_thread]]
        rank = np.empty(n, dtype=np.int64)
        rank[by_thread] = csum
    # non-zero events already closed at each start
    ends = np.sort(t[nonzero] * span + (end[nonzero] - tmin))
    starts_key = t * span + (start - tmin)
    closed = np.searchsorted(ends, starts_key, side="right") - \
        np.searchsorted(ends, t * span, side="left")
    depth = rank - closed
    levels = int(depth.max()) + 2
    level_key = t * levels + depth
    # (thread, depth, position) keys in order: a stable sort of the small
    # (thread, depth) key keeps positions ascending within each group
    by_level = _stable_order(level_key)
    sorted_keys = level_key[by_level] * n + by_level
    query = (level_key - 1) * n + idx
    pos = np.searchsorted(sorted_keys, query) - 1
    cand = sorted_keys[np.maximum(pos, 0)]
    ok = (pos >= 0) & (depth > 0) & (cand // n == query // n)
    return np.where(ok, cand % n, -1)


def _stable_order(keys: np.ndarray) -> np.ndarray:
    """``np.argsort(keys, kind="stable")`` for non-negative ints, as a radix sort
    when they fit in 16 bits (numpy sorts 16-bit ints by radix: linear time).

    >>> _stable_order(np.array([2, 0, 2, 1])).tolist()
    [1, 3, 0, 2]
    """
    if len(keys) and int(keys.max()) < 1 << 16 and int(keys.min()) >= 0:
        keys = keys.astype(np.uint16)
    return np.argsort(keys, kind="stable")


def _threads_not_nested(thread: np.ndarray, start: np.ndarray, end: np.ndarray,
                        parent: np.ndarray) -> list:
    """Threads where the depth tree is not a clean nesting (then the stack rule differs)."""
    has = parent >= 0
    p = np.maximum(parent, 0)
    inside = ~has | ((start[p] <= start) & (end <= end[p]) & (start < end[p]))
    # siblings (same parent, same thread) must not overlap, in start order
    sib_order = np.lexsort((np.arange(len(start)), parent, thread))
    same = (thread[sib_order][1:] == thread[sib_order][:-1]) & \
        (parent[sib_order][1:] == parent[sib_order][:-1])
    overlap = same & (start[sib_order][1:] < end[sib_order][:-1])
    bad = set(thread[~inside].tolist())
    bad.update(thread[sib_order][1:][overlap].tolist())
    return sorted(bad)


def _parents_by_stack(start: np.ndarray, end: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """torch's stack rule on one thread's events (sorted by (start, -end)).

    An open event stops being a candidate parent once an event starts at or
    after its end, or ends after it. Returns positions into the full arrays.
    """
    out = [-1] * len(rows)
    stack_pos: list = []
    stack_end: list = []
    rows_l = rows.tolist()
    for k, (s, e) in enumerate(zip(start.tolist(), end.tolist())):
        while stack_end and (s >= stack_end[-1] or e > stack_end[-1]):
            stack_end.pop()
            stack_pos.pop()
        if stack_pos:
            out[k] = stack_pos[-1]
        stack_pos.append(rows_l[k])
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


def infer_backward_nodes(table: EventTable) -> None:
    """Give autograd nodes without a sequence number their backward scope.

    A saved trace marks a backward node only by its ``Fwd thread id``, written
    only with a sequence number; a node without one (``AccumulateGrad``) is
    recognised as a child named like its
    ``autograd::engine::evaluate_function: <node>`` parent. A collector
    records the scope itself, so this changes nothing in a live session.

    >>> import numpy as np
    >>> from opscope.model.events import SymbolTable
    >>> from opscope.model.torch_names import EVALUATE_FUNCTION_PREFIX as P
    >>> cols = {c: np.zeros(2, dtype=np.int64) for c in EventTable.COLUMNS}
    >>> cols["name_id"] = np.array([0, 1]); cols["end_ns"] = np.array([9, 5])
    >>> t = build_tree(EventTable(SymbolTable([P + "AccumulateGrad", "AccumulateGrad"]), cols))
    >>> infer_backward_nodes(t); t.scope.tolist()  # 1: SCOPE_BACKWARD_FUNCTION
    [0, 1]
    """
    if len(table) == 0:
        return
    names = table.symbols.names
    wrapper_of = np.full(len(names), -1, dtype=np.int64)
    for node_id, name in enumerate(names):
        wrapper = table.symbols.id_of(EVALUATE_FUNCTION_PREFIX + name)
        if wrapper is not None:
            wrapper_of[node_id] = wrapper
    rows = np.flatnonzero((table.parent >= 0) & (table.scope == SCOPE_FUNCTION))
    expected = wrapper_of[table.name_id[rows]]
    match = (expected >= 0) & (table.name_id[table.parent[rows]] == expected)
    table.scope[rows[match]] = SCOPE_BACKWARD_FUNCTION


def without_rows(table: EventTable, drop: np.ndarray,
                 per_row: Dict[str, Any]) -> Tuple[EventTable, Dict[str, Any]]:
    """The table without the rows ``drop``, everyone's self time kept as it was.

    The self times were computed with those rows in the tree (torch 2.15
    builds its tree with Python functions, then leaves them out of
    ``key_averages``). A kept row's parent becomes its nearest kept ancestor.
    ``per_row`` holds the session's per-row values (``stacks``, ``flops``,
    ``event_memory``, ``memory_owner``: memory owned by a dropped row is owned
    by none); a copy with them taken is returned.
    """
    keep = ~drop
    rows = np.flatnonzero(keep)
    parent = table.parent.astype(np.int64)
    dropped = np.append(drop, False)  # index -1 (no parent) is never dropped
    while dropped[parent].any():  # pointer jumping; -1 stays -1
        parent = np.where(dropped[parent], np.append(parent, -1)[parent], parent)
    source = copy.copy(table)
    source.parent = parent.astype(table.parent.dtype)
    out = dict(per_row)
    if out.get("stacks") is not None:
        out["stacks"] = [out["stacks"][i] for i in rows.tolist()]
    if out.get("flops") is not None:
        out["flops"] = out["flops"][rows]
    if out.get("event_memory") is not None:
        out["event_memory"] = {k: v[rows] for k, v in out["event_memory"].items()}
    if out.get("memory_owner") is not None:
        remap = np.full(len(keep) + 1, -1, dtype=np.int64)
        remap[rows] = np.arange(len(rows))
        owner = np.asarray(out["memory_owner"])
        out["memory_owner"] = remap[owner].astype(owner.dtype)
    return source.take(keep), out
